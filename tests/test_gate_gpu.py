"""On a CUDA GPU: the gate times Inductor's kernel and skips the search where no kernel could beat
it by min_speedup, records why in the cache and in `report`; with the gate off the search runs;
in mode "background" the compile returns before the search and refresh() picks its result up."""
import json

import pytest
import torch

import agent_backend
from agent_backend import backend
from agent_backend.cli import main
from agent_backend.env.floors import FILE_NAME
from kernel_cache import KernelCache

pytestmark = pytest.mark.gpu

MODEL_FILE = '''
import torch

class AddRelu(torch.nn.Module):
    def forward(self, x, y):
        return torch.relu(x + y) * 2

def make():
    return AddRelu(), (torch.randn(4096, 4096, device="cuda"), torch.randn(4096, 4096, device="cuda"))
'''


def _decisions(since: int):
    return [d for r in backend.reports[since:] for d in r.decisions if d.task is not None]


def _compile_and_run(options: dict):
    x, y = (torch.randn(4096, 4096, device="cuda") for _ in range(2))
    torch._dynamo.reset()
    seen = len(backend.reports)
    with torch.no_grad():
        compiled = torch.compile(lambda a, b: torch.relu(a + b) * 2, backend="cuda_agent",
                                 options={"mode": "search", **options})
        out = compiled(x, y)
    torch.testing.assert_close(out, torch.relu(x + y) * 2)
    return _decisions(seen)


def test_inductor_at_the_floor_is_not_searched(cache_dir, tmp_path, capsys):
    # Inductor runs this copy-like chain at ~90% of the copy rate: within 2x of the floor for sure.
    (decision,) = _compile_and_run({"min_speedup": 2.0})
    assert decision.reason.startswith("Inductor at floor: "), decision.reason
    assert decision.gate["skipped"] and decision.gate["bound"] == "memory"
    assert 1.0 < decision.gate["ratio"] <= 2.0 * 1.05
    with KernelCache.open() as cache:
        ((_, entry),) = cache.items()
    assert (entry.origin, entry.outcome, entry.timings["evaluated"]) == ("gate", "inductor", 0)
    assert (cache_dir / FILE_NAME).exists(), "the GPU's floors are kept beside the kernel cache"
    (again,) = _compile_and_run({"min_speedup": 2.0})
    assert again.reason == f"cached: {entry.reason}"
    model_file = tmp_path / "add_relu.py"
    model_file.write_text(MODEL_FILE)
    assert main(["report", f"{model_file}:make", "--no-backward", "-o", "min_speedup=2.0"]) == 0
    out = capsys.readouterr().out
    assert "gate: Inductor " in out and "(memory), margin " in out and "skipped the search" in out, out
    assert "(1 where the gate found Inductor at the floor)" in out
    (searched,) = _compile_and_run({"min_speedup": 2.0, "gate": False, "search_budget_s": 300})
    assert not searched.reason.startswith(("Inductor at floor", "cached")), searched.reason


def test_background_search_returns_at_once_and_refresh_picks_the_result_up(cache_dir):
    (pending,) = _compile_and_run({"mode": "background", "search_budget_s": 300})
    assert pending.reason.startswith("searching in the background"), pending.reason
    assert agent_backend.refresh(wait=True, timeout_s=600) == 0
    (done,) = _compile_and_run({"mode": "background"})
    assert not done.reason.startswith("searching in the background"), done.reason
    with KernelCache.open() as cache:
        ((_, entry),) = cache.items()
    assert entry.timings.get("gate") is not None, "the gate timed the task before the search"
    print(json.dumps({"reason": done.reason, "gate": entry.timings["gate"]}))
