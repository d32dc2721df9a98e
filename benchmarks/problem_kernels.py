"""The kernels a suite problem's compiled forward runs, with their GPU times (torch.profiler over
20 calls, each after an L2 flush), for ours (searched) and Inductor's compile: which of a graph's
kernels are ours and what the rest cost beside them.

    python benchmarks/problem_kernels.py PROBLEM DTYPE..    # e.g. cross_entropy bf16 fp32

On an H200 (2026-11-27): benchmarks/results/problem_kernels-h200-torch2.11-2026-11-27-thirtyfirst.txt.
"""
from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

from benchmarks.suite.problem import build  # noqa: E402
from benchmarks.suite.registry import select  # noqa: E402

CALLS = 20


def kernel_times(fn, inputs, flush) -> list[tuple[int, float, str]]:
    """(calls, GPU us a call, name) of every kernel `fn` launches, fills (the flush) left out."""
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(CALLS):
            flush.zero_()
            fn(*inputs)
        torch.cuda.synchronize()
    return [(e.count, e.device_time_total / e.count, e.key) for e in prof.key_averages()
            if e.device_time_total > 0 and "fill" not in e.key.lower()]


def main(name: str, dtypes: list[str]) -> None:
    (problem,) = select(only=[name])
    flush = torch.empty(int(200e6), dtype=torch.int8, device="cuda")
    for dtype in dtypes:
        model, inputs = build(problem, dtype, "cuda", small=False)
        options = {"mode": "search", "search_budget_s": 25, "cache_dir": tempfile.mkdtemp()}
        fns = {"ours": torch.compile(model, backend="cuda_agent", options=options),
               "inductor": torch.compile(model, backend="inductor")}
        with torch.no_grad():
            for label, fn in fns.items():
                for _ in range(3):
                    fn(*inputs)
                torch.cuda.synchronize()
                print(f"== {name} {dtype} {label}")
                for calls, us, kernel in kernel_times(fn, inputs, flush):
                    print(f"  {calls:4d} x {us:9.2f} us  {kernel[:110]}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
