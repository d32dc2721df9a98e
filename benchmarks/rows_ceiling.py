"""What a row reduction can reach under the profiler's timing: every candidate the rows template
proposes, Inductor, eager, and plain kernels over the same bytes (a clone: a copy; amax over the
whole tensor: a read; a one-element add: the smallest kernel), timed in interleaved rounds with
the worker's own timer (env/profile.CudaTimer: L2 write flush, the host's launch hidden).

    python benchmarks/rows_ceiling.py [lse] [sum] [softmax]   # default: all three, bf16 then fp32

On an H100 (2026-11-25, benchmarks/results/rows_probe-*-thirteenth.txt) a read-only reduction took
about as long as a clone of its input, and the smallest kernel 3.6 us: the bytes over the copy rate
are not a floor such a task can approach.
"""
from __future__ import annotations

import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

from agent_backend.env.profile import CudaTimer  # noqa: E402
from agent_backend.env.verify import sleep_cycles_per_ms  # noqa: E402
from agent_backend.explain import tasks_of, trace_tasks  # noqa: E402
from agent_backend.task import load_program  # noqa: E402
from pointwise import Fn, copy_bandwidth_gbs  # noqa: E402
from skills.rows import propose  # noqa: E402

ROUNDS = 30


def contenders(fn, x) -> dict:
    (task,) = [t for t in tasks_of(trace_tasks(Fn(fn), [x], backward=False, min_ops=1)) if t.kind == "reduction"]
    named = {c.origin.split(":")[-1]: load_program(c.source, c.origin)["ModelNew"]() for c in propose(task)}
    flat, one = x.reshape(-1), torch.zeros(1, device=x.device)
    named.update({"inductor": torch.compile(fn), "eager": fn, "clone (copy)": lambda x: x.clone(),
                  "amax all (read)": lambda x: torch.amax(flat), "tiny kernel": lambda x: one.add_(1)})
    return named


def case(timer: CudaTimer, copy_gbs: float, label: str, fn, x: torch.Tensor) -> None:
    named = contenders(fn, x)
    for f in named.values():
        for _ in range(3):
            timer.time_call(lambda: f(x))
    timer.fit_cover(0.3)
    times = {k: [] for k in named}
    for _ in range(ROUNDS):
        for k, f in named.items():
            times[k].append(timer.time_call(lambda: f(x)).ms * 1000)
    nbytes = x.numel() * x.element_size()
    print(f"## {label} {tuple(x.shape)} {x.dtype}: {nbytes / 1e6:.1f} MB, floor {nbytes / copy_gbs / 1e3:.1f} us",
          flush=True)
    inductor = statistics.median(times["inductor"])
    for k, v in times.items():
        m = statistics.median(v)
        print(f"  {k:24s} {m:8.2f} us  p10 {sorted(v)[len(v) // 10]:8.2f}  vs Inductor {inductor / m:5.2f}x  "
              f"{nbytes / m / 1e3:7.0f} GB/s", flush=True)


def main(which: list[str]) -> None:
    device = torch.device("cuda:0")
    timer = CudaTimer(device, sleep_cycles_per_ms(device))
    copy_gbs = copy_bandwidth_gbs()
    for dtype in (torch.bfloat16, torch.float32):
        def r(*shape):
            return torch.randn(*shape, device=device, dtype=dtype)
        if "lse" in which:
            case(timer, copy_gbs, "logsumexp", lambda x: torch.logsumexp(x, -1), r(4096, 8192))
        if "sum" in which:
            case(timer, copy_gbs, "sum long rows", lambda x: x.sum(-1), r(16, 393216))
        if "softmax" in which:
            case(timer, copy_gbs, "softmax", lambda x: torch.softmax(x, -1), r(4096, 8192))


if __name__ == "__main__":
    main(sys.argv[1:] or ["lse", "sum", "softmax"])
