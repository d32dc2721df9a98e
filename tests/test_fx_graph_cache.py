"""Inductor's FX graph cache with our pass: a graph compiled once is replayed by later processes
(the pass does not run again), its winners load from the kernel cache on first call, any change
to the kernel cache makes a new graph-cache key, and a winner gone from the kernel cache leaves
its subgraph to its own program, never to a wrong or missing result."""
import json
import logging
import os
import subprocess
import sys
import textwrap

import torch

from agent_backend import runtime
from kernel_cache import KernelCache
from helpers import collect_tasks, put_cached_entry

GATE_WINNER = '''
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x, y):
        return torch.tanh(x * 0.5 + y) * torch.sigmoid(y)
'''

# One process: compile Gate with the backend (mode "cached"), run it, and report what happened.
RUN = textwrap.dedent('''
    import json
    import torch
    from torch._dynamo.utils import counters
    from agent_backend import backend, runtime

    class Gate(torch.nn.Module):
        def forward(self, x, y):
            return torch.tanh(x * 0.5 + y) * torch.sigmoid(y)

    torch.manual_seed(0)
    x, y = torch.randn(64, 32), torch.randn(64, 32)
    with torch.no_grad():
        out = torch.compile(Gate(), backend="cuda_agent", options={"mode": "cached"})(x, y)
        error = (out - Gate()(x, y)).abs().max().item()
    print(json.dumps({
        "hits": counters["inductor"]["fxgraph_cache_hit"], "misses": counters["inductor"]["fxgraph_cache_miss"],
        "decisions": [d.reason for r in backend.reports for d in r.decisions],
        "calls": sum(w.calls for w in runtime._registry.values()), "error": error}))
''')


class Gate(torch.nn.Module):
    def forward(self, x, y):
        return torch.tanh(x * 0.5 + y) * torch.sigmoid(y)


def _run_process(cache_dir, inductor_dir) -> dict:
    env = {**os.environ, "CUDA_AGENT_CACHE_DIR": str(cache_dir), "TORCHINDUCTOR_CACHE_DIR": str(inductor_dir),
           "TORCHINDUCTOR_FX_GRAPH_CACHE": "1", "TORCHINDUCTOR_AUTOGRAD_CACHE": "1"}
    done = subprocess.run([sys.executable, "-c", RUN], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _gate_task():
    (task,) = collect_tasks(Gate(), [torch.randn(64, 32), torch.randn(64, 32)], backward=False, min_ops=2)
    return task


def _last_used(cache_dir, digest: str) -> float:
    with KernelCache.open(cache_dir) as cache:
        return cache.local.store.last_used_times()[digest]


def test_replayed_graph_loads_its_winner_from_the_kernel_cache(cache_dir, tmp_path):
    digest = put_cached_entry(_gate_task(), source=GATE_WINNER, cache_dir=cache_dir)
    inductor_dir = tmp_path / "inductor"
    uses = [_last_used(cache_dir, digest)]
    first = _run_process(cache_dir, inductor_dir)
    assert (first["misses"], first["decisions"], first["calls"], first["error"]) == (1, ["kernel test"], 1, 0.0)
    uses.append(_last_used(cache_dir, digest))
    second = _run_process(cache_dir, inductor_dir)
    assert second["hits"] == 1 and second["decisions"] == [], "the graph was compiled again"
    assert second["calls"] == 1 and second["error"] == 0.0, "the replayed graph did not run the cached winner"
    uses.append(_last_used(cache_dir, digest))
    assert uses[0] < uses[1] < uses[2], "each process's use of the winner is recorded, for LRU pruning"


def test_any_change_to_the_kernel_cache_is_a_new_graph_cache_key(cache_dir, tmp_path):
    task = _gate_task()
    inductor_dir = tmp_path / "inductor"
    assert _run_process(cache_dir, inductor_dir)["decisions"] == ["cpu tensors: our kernels are CUDA only"]
    put_cached_entry(task, source=GATE_WINNER, cache_dir=cache_dir)
    after = _run_process(cache_dir, inductor_dir)
    assert (after["misses"], after["decisions"], after["calls"]) == (1, ["kernel test"], 1)


def test_a_winner_gone_from_the_cache_runs_its_subgraph_program(caplog, monkeypatch):
    task = _gate_task()
    x, y = torch.randn(64, 32), torch.randn(64, 32)
    asked = []
    monkeypatch.setitem(runtime._winner_sources, "a cache without it", lambda key: asked.append(key))
    with caplog.at_level(logging.WARNING, logger="cuda_agent"):
        for _ in range(3):
            (out,) = torch.ops.cuda_agent.run_winner("no-such-kernel", runtime.program_arg(task.program), [x, y])
            assert torch.equal(out, Gate()(x, y))
    assert runtime.registered("no-such-kernel") is None
    assert asked == ["no-such-kernel"], "the caches are asked once, not on every call"
    warnings = [r.message for r in caplog.records if "no-such-kern" in r.message]
    assert len(warnings) == 1 and "plain torch ops" in warnings[0]
