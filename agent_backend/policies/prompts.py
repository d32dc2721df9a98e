"""What the `llm` policy says to a model, from text files in skills/: the system prompt
(skills/SKILL.md), the first user turn (skills/prompts/task.md), and the user turn that answers
each verdict of the environment (skills/prompts/<verdict>.md). Code here only picks a file and
fills in its values: the words live in the files."""
from __future__ import annotations

import functools
from pathlib import Path
from typing import TYPE_CHECKING

from ..env.results import needs_context

if TYPE_CHECKING:
    from ..env.results import Evaluation
    from ..specs import Task

TEMPLATES = ("task", "compile_error", "failed", "incorrect", "passed", "no_code", "duplicate")
MAX_REASON_CHARS = 2000  # of the environment's text (already trimmed compiler output, tracebacks)

_FAILED = {"runtime_error": "it raised an error while it ran",
           "crash": "it crashed the process that ran it (the GPU context broke: an illegal address, or a trap)",
           "timeout": "it ran past its time limit"}
_INCORRECT = {"incorrect": "its outputs are wrong", "rejected": "it broke a rule the environment enforces"}


@functools.cache
def _skills_dir() -> Path:
    import skills
    return Path(skills.__file__).parent


@functools.cache
def template(name: str) -> str:
    return (_skills_dir() / "prompts" / f"{name}.md").read_text()


@functools.cache
def system() -> str:
    return (_skills_dir() / "SKILL.md").read_text()


def all_text() -> str:
    """Every word a model may be shown: a change to any of it is a new revision of the policy."""
    return "\0".join([system(), *(template(name) for name in TEMPLATES)])


def _signature(specs) -> str:
    return ", ".join(f"{s.dtype}{list(s.shape)} stride {list(s.stride)}" for s in specs)


def opening(task: Task) -> list[dict]:
    """The first two messages of every conversation about `task`: the skill, then the task."""
    user = template("task").format(device=task.outputs[0].device, program=task.program.strip(),
                                   inputs=_signature(task.inputs), outputs=_signature(task.outputs))
    return [{"role": "system", "content": system()}, {"role": "user", "content": user}]


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x:.4g}"


def _cut(text: str) -> str:
    return text if len(text) <= MAX_REASON_CHARS else text[:MAX_REASON_CHARS] + "\n... (cut)"


def _accuracy(verification: dict) -> str:
    if "float64_err" not in verification:
        return ""
    if verification.get("float64_note"):
        return f"(No float64 check: {verification['float64_note']}.)"
    return (f"Its relative error against a float64 evaluation of the task is {verification['float64_err']:.3g}; "
            f"the reference's own is {verification['float64_ref_err']:.3g}.")


def _speed(profile: dict) -> str:
    speedup, counted, bar = profile.get("speedup_vs_inductor"), profile.get("counted_speedup"), profile["min_speedup"]
    if speedup is None:
        return f"It was not timed against Inductor: {profile.get('note', 'no Inductor time')}."
    text = f"That is {speedup:.2f}x Inductor's speed: "
    if profile.get("wins"):
        return text + f"it beats Inductor by more than the {bar:.2f}x required."
    if needs_context(profile):
        return text + (f"it beats Inductor on the GPU, but launching it takes longer on the host "
                       f"({_ms(profile['ours_ms']['host_median'])} ms) than it runs, so it is used only where its "
                       f"whole graph runs faster with it: use fewer kernels and less Python per call.")
    if counted is not None and counted > bar:  # a timer that may not declare wins (host times on the CPU)
        return text + f"but timings taken here ({profile.get('timer', '')}) never count as a win."
    text += f"to be used it must be more than {bar:.2f}x."
    if profile.get("launch_bound"):
        text += (f" Launching it takes longer on the host ({_ms(profile['ours_ms']['host_median'])} ms) than it "
                 f"runs, which counts as {counted:.2f}x: use fewer kernels and less Python per call.")
    return text


def reply(evaluation: Evaluation) -> str:
    """The user turn that tells the model what the environment found of its last answer's code."""
    ev = evaluation
    if ev.status == "compile_error":
        return template("compile_error").format(reason=_cut(ev.reason))
    if ev.status in _FAILED:
        return template("failed").format(what=_FAILED[ev.status], reason=_cut(ev.reason))
    if ev.status in _INCORRECT:
        trials = ev.verification.get("trials", 0)
        errors = "" if not trials or ev.status != "incorrect" else (
            f"\nVerification ran {trials} input set(s); the largest absolute error seen was "
            f"{ev.verification.get('max_abs_err', 0.0):.3g} (relative {ev.verification.get('max_rel_err', 0.0):.3g}).\n")
        return template("incorrect").format(what=_INCORRECT[ev.status], reason=_cut(ev.reason), errors=errors)
    profile = ev.profile or {}
    ms = {who: (profile.get(f"{who}_ms") or {}).get("median") for who in ("ours", "inductor", "eager")}
    return template("passed").format(trials=ev.verification.get("trials", "all"), accuracy=_accuracy(ev.verification),
                                     ours_ms=_ms(ms["ours"]), inductor_ms=_ms(ms["inductor"]),
                                     eager_ms=_ms(ms["eager"]), speed=_speed(profile) if profile else "")


def no_code() -> str:
    """The user turn for an answer with no code to run."""
    return template("no_code")


def repeated(evaluation: Evaluation) -> str:
    """The user turn for an answer that repeats code judged before (`evaluation`)."""
    return template("duplicate").format(summary=summary(evaluation))


def summary(evaluation: Evaluation) -> str:
    """One line on a verdict."""
    ev = evaluation
    if ev.status == "passed":
        speedup = (ev.profile or {}).get("speedup_vs_inductor")
        return "correct" + (f", {speedup:.2f}x Inductor's speed" if speedup else "")
    first_line = ev.reason.strip().splitlines()[0] if ev.reason.strip() else ""
    return f"{ev.status}: {first_line[:300]}"
