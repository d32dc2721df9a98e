"""`cuda-agent warm` and `cuda-agent report` on a model file: the decisions per subgraph, option
errors, and (on a GPU) a warm-up that later compiles find in the cache."""
import json
import textwrap

import pytest
import torch
import torch._functorch.config

from agent_backend.cli import main
from agent_backend.explain import load_factory
from agent_backend.options import OptionError
from agent_backend.warm import parse_options
from helpers import collect_tasks, put_cached_entry

MODEL_FILE = textwrap.dedent('''
    import torch

    class Gate(torch.nn.Module):
        def forward(self, x, y):
            return torch.tanh(x * 0.5 + y) * torch.sigmoid(y)

    def make(device="cpu"):
        return Gate(), (torch.randn(64, 32, device=device), torch.randn(64, 32, device=device))

    def make_cuda():
        return make("cuda")
''')
# The same computation as Gate, in the candidate format: what a cached winner would hold.
GATE_WINNER = '''
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x, y):
        return torch.tanh(x * 0.5 + y) * torch.sigmoid(y)
'''


@pytest.fixture
def model_file(tmp_path):
    path = tmp_path / "gate_model.py"
    path.write_text(MODEL_FILE)
    return path


def _run(capsys, *argv):
    code = main(list(argv))
    return code, capsys.readouterr().out


def test_options_parse_as_json_where_they_can():
    assert parse_options(["search_budget_s=60", 'devices=["cuda:0"]', "policy=builtin"]) == {
        "search_budget_s": 60, "devices": ["cuda:0"], "policy": "builtin"}
    with pytest.raises(OptionError, match="NAME=VALUE"):
        parse_options(["search_budget_s"])


def test_warm_on_cpu_says_nothing_was_searched(model_file, cache_dir, capsys):
    code, out = _run(capsys, "warm", f"{model_file}:make", "--no-backward")
    assert code == 1
    assert "pointwise inductor  cpu tensors: our kernels are CUDA only" in out
    assert "nothing was searched" in out and "1 subgraph(s): 0 run by our kernels, 1 by Inductor" in out


def test_report_shows_a_cached_winner(model_file, cache_dir, capsys):
    model, inputs = load_factory(f"{model_file}:make")()
    (task,) = collect_tasks(model, list(inputs), backward=False, min_ops=2)
    put_cached_entry(task, source=GATE_WINNER, timings={"speedup_vs_inductor": 1.3, "counted_speedup": 1.25})
    # Inductor's graph caches on (conftest turns them off): report must still see every graph,
    # also the second time, when Inductor could replay the graph.
    with torch._inductor.config.patch(fx_graph_cache=True), torch._functorch.config.patch(enable_autograd_cache=True):
        for _ in range(2):
            code, out = _run(capsys, "report", f"{model_file}:make", "--no-backward", "--json")
            assert code == 0
            (decision,) = json.loads(out)
            assert (decision["hash"], decision["outcome"], decision["reason"]) == (
                task.hash, "kernel", "kernel test (1.25x Inductor)")


def test_report_shows_a_cached_winner_that_lost_in_its_graph(model_file, cache_dir, capsys):
    """warm runs the in-context check of a graph with a cached winner (here one that sleeps, on
    the CPU) and caches its verdict; report then says the winner lost in its graph."""
    model, inputs = load_factory(f"{model_file}:make")()
    (task,) = collect_tasks(model, list(inputs), backward=False, min_ops=2)
    slow = GATE_WINNER.replace("    def forward(self, x, y):\n", "    def forward(self, x, y):\n        time.sleep(0.05)\n")
    put_cached_entry(task, source="import time\n" + slow, timings={"counted_speedup": 1.25})
    _run(capsys, "warm", f"{model_file}:make", "--no-backward")
    code, out = _run(capsys, "report", f"{model_file}:make", "--no-backward")
    assert code == 0 and "inductor  lost in context: the whole graph ran" in out, out
    assert "0 run by our kernels, 1 by Inductor (1 whose kernel won alone and lost in its graph)" in out


@pytest.mark.parametrize("option, message", [
    ("bogus=1", "unknown option(s) 'bogus'"),
    ("min_speedup=fast", "min_speedup"),
    ("mode=off", "sets the mode itself"),
    ("search_budget_s", "NAME=VALUE"),
])
def test_bad_options_fail_before_any_compile(model_file, capsys, option, message):
    code, out = _run(capsys, "report", f"{model_file}:make", "-o", option)
    assert code == 2 and message in out, out


@pytest.mark.gpu
def test_warm_fills_the_cache_that_report_then_reads(model_file, cache_dir, capsys):
    code, out = _run(capsys, "warm", f"{model_file}:make_cuda", "-o", "search_budget_s=300")
    assert code == 0, out
    code, out = _run(capsys, "report", f"{model_file}:make_cuda", "--json")
    assert code == 0
    decisions = json.loads(out)
    assert decisions and all(d["device"] == "cuda" for d in decisions)
    assert not any(d["reason"].startswith("no cached winner") for d in decisions), decisions


def test_report_shows_the_gates_numbers(model_file, cache_dir, capsys):
    from agent_backend import gate
    model, inputs = load_factory(f"{model_file}:make")()
    (task,) = collect_tasks(model, list(inputs), backward=False, min_ops=2)
    verdict = gate.judge(0.0504, gate.Floor(0.048, 0.0, 0.004), min_speedup=1.05, slack=0.03)
    put_cached_entry(task, outcome="inductor", reason=verdict.reason(), timings={"gate": verdict.to_json()})
    code, out = _run(capsys, "report", f"{model_file}:make", "--no-backward")
    assert code == 0
    assert ("gate: Inductor 0.0504 ms, floor 0.0480 ms (memory), margin 5.0%, bar 1.082x: skipped the search"
            in out), out
    assert "1 subgraph(s): 0 run by our kernels, 1 by Inductor (1 where the gate found Inductor at the floor)" in out
    code, out = _run(capsys, "report", f"{model_file}:make", "--no-backward", "--json")
    (decision,) = json.loads(out)
    assert decision["gate"] == verdict.to_json()


def test_report_shows_what_the_search_tried(model_file, cache_dir, capsys):
    model, inputs = load_factory(f"{model_file}:make")()
    (task,) = collect_tasks(model, list(inputs), backward=False, min_ops=2)
    tried = [{"origin": "builtin:pointwise:b256u2v8", "status": "passed", "speedup": 0.987},
             {"origin": "builtin:pointwise:b128u1v8", "status": "incorrect", "reason": "out of tolerance"}]
    put_cached_entry(task, outcome="inductor", reason="Inductor wins: best candidate 0.99x of Inductor's speed",
                     timings={"candidates": tried})
    code, out = _run(capsys, "report", f"{model_file}:make", "--no-backward")
    assert code == 0 and "tried: pointwise:b256u2v8 0.99x, pointwise:b128u1v8 incorrect" in out, out
    code, out = _run(capsys, "report", f"{model_file}:make", "--no-backward", "--json")
    (decision,) = json.loads(out)
    assert decision["tried"] == tried
