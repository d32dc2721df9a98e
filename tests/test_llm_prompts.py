"""What the `llm` policy tells a model of each verdict (skills/prompts/*.md filled in by
agent_backend/policies/prompts.py): the text a model must act on, for every status."""
import pytest

from agent_backend.env.results import Evaluation
from agent_backend.policies import prompts
from test_env_cases import add_relu_task

PROFILE = {"ours_ms": {"median": 0.0123, "host_median": 0.004}, "inductor_ms": {"median": 0.0150},
           "eager_ms": {"median": 0.0301}, "speedup_vs_inductor": 1.22, "counted_speedup": 1.22,
           "speedup_vs_eager": 2.45, "launch_bound": False, "min_speedup": 1.05, "wins": True}
VERIFIED = {"trials": 7, "max_abs_err": 1e-6, "max_rel_err": 2e-6, "float64_err": 3e-8, "float64_ref_err": 2.9e-8}


@pytest.mark.parametrize("status,starts,what", [
    ("runtime_error", "Your code built, but it raised an error while it ran", "IndexError: out of range"),
    ("crash", "Your code built, but it crashed the process that ran it", "illegal memory access"),
    ("timeout", "Your code built, but it ran past its time limit", "verify ran past its limit of 60 s"),
    ("rejected", "Your code ran, but it broke a rule the environment enforces", "output 0 shares memory with input 1"),
    ("compile_error", "Your code did not build", 'kernel.cu(4): error: identifier "n" is undefined'),
])
def test_each_failure_is_told_with_the_environments_own_words(status, starts, what):
    told = prompts.reply(Evaluation(status, what))
    assert told.startswith(starts) and f"```\n{what}\n```" in told and "complete corrected code block" in told


def test_long_reasons_are_cut():
    told = prompts.reply(Evaluation("runtime_error", "x" * 10_000))
    assert "x" * prompts.MAX_REASON_CHARS + "\n... (cut)" in told and "x" * (prompts.MAX_REASON_CHARS + 1) not in told


def test_a_winner_hears_its_times_and_accuracy():
    told = prompts.reply(Evaluation("passed", profile=PROFILE, verification=VERIFIED))
    assert "passed verification on 7 input sets" in told and "float64 evaluation of the task is 3e-08" in told
    assert "yours 0.0123 ms, torch.compile (Inductor) 0.015 ms, eager PyTorch 0.0301 ms" in told
    assert "1.22x Inductor's speed: it beats Inductor by more than the 1.05x required" in told


def test_a_launch_bound_candidate_is_told_why_it_does_not_count():
    profile = dict(PROFILE, wins=False, launch_bound=True, counted_speedup=0.9,
                   ours_ms={"median": 0.0123, "host_median": 0.0167})
    told = prompts.reply(Evaluation("passed", profile=profile, verification=VERIFIED))
    assert "to be used it must be more than 1.05x" in told
    assert "Launching it takes longer on the host (0.0167 ms) than it runs, which counts as 0.90x" in told


def test_a_launch_bound_candidate_faster_on_the_gpu_is_told_where_it_is_used():
    profile = dict(PROFILE, wins=False, gpu_wins=True, launch_bound=True, counted_speedup=0.9,
                   ours_ms={"median": 0.0123, "host_median": 0.0167})
    told = prompts.reply(Evaluation("passed", profile=profile, verification=VERIFIED))
    assert "it beats Inductor on the GPU, but launching it takes longer on the host (0.0167 ms) than it runs, " \
           "so it is used only where its whole graph runs faster with it" in told


def test_repeats_and_answers_without_code():
    assert prompts.repeated(Evaluation("incorrect", "output 0: 3 of 8 elements differ\nmore")).startswith(
        "That code is the same as an earlier answer, which was judged: incorrect: output 0: 3 of 8 elements differ.")
    assert "no ```python code block" in prompts.no_code()


def test_the_opening_is_the_skill_and_the_task():
    task = add_relu_task()
    system, user = prompts.opening(task)
    assert system == {"role": "system", "content": prompts.system()}
    assert user["role"] == "user" and task.program.strip() in user["content"] and "on device cpu" in user["content"]
