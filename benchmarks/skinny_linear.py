"""nn.Linear's product at a few rows of input (x @ W.t(), x of M rows), as the backend's pass
claims it (one task of kind "matmul"), the rows template's every launch (skills/rows/gemv.py: the
product summed over k, a row per output, the rows sharing a weight row next to each other, one
thread taking them all where a launch's tag says l<rows>) against
cuBLAS (F.linear), Inductor's compile of it, and a copy of the weight: "flushed", triton do_bench
(an L2 flush before each call), least of 3 interleaved rounds; "clean", calls back to back (see
back_to_back). Where the template does not take the task (more than 2 rows of x in fp16/bf16),
only the others are timed.

    python benchmarks/skinny_linear.py M:N:K:DTYPE..    # e.g. 1:14336:4096:bf16 8:14336:4096:fp32

On an H200 (2026-11-27): benchmarks/results/skinny_linear-h200-torch2.11-2026-11-27-thirtyfirst.txt
(a thread a row); on an H100, with a thread taking every row of x: ...-h100-...-thirtysecond.txt.
"""
from __future__ import annotations

import math
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

from agent_backend.explain import tasks_of, trace_tasks  # noqa: E402
from agent_backend.specs import random_inputs  # noqa: E402
from agent_backend.task import load_program  # noqa: E402
from benchmarks.rows_plans import bench, plan_contenders, plan_launches  # noqa: E402
from skills.pointwise.errors import Unsupported  # noqa: E402

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


class Linear(torch.nn.Module):
    def forward(self, x, weight):
        return F.linear(x, weight)


def main(specs: list[str]) -> None:
    for spec in specs:
        m, n, k, dtype = spec.split(":")
        dt = DTYPES[dtype]
        x, w = torch.randn(int(m), int(k), dtype=dt), torch.randn(int(n), int(k), dtype=dt)
        (task,) = [t.on_device("cuda") for t in tasks_of(trace_tasks(Linear(), [x, w], backward=False, min_ops=1))]
        ins = random_inputs(task.inputs, 0, device="cuda")
        reference = load_program(task.program)["Model"]().cuda()
        expected = (reference(*ins),)
        try:
            fns = plan_contenders(plan_launches(task), ins, expected, atol=1e-1)
        except Unsupported as e:
            print(spec, "rows:", e)
            fns = {}
        compiled = torch.compile(reference)
        compiled(*ins)
        weight = max(ins, key=torch.Tensor.numel)
        destination = torch.empty_like(weight)
        fns |= {"cublas": lambda: reference(*ins), "inductor": lambda: compiled(*ins),
                "copy-weight": lambda: destination.copy_(weight)}
        for label, t in (("flushed", bench(fns, rounds=3)), ("clean", back_to_back(fns))):
            print(spec, label, " | ".join(f"{k} {v:.1f}us" for k, v in sorted(t.items(), key=lambda kv: kv[1])),
                  flush=True)


def back_to_back(fns: dict, calls: int = 30, reps: int = 7, rounds: int = 2) -> dict:
    """Each contender's time a call over `calls` calls between two events (median of `reps`, least
    of `rounds` interleaved rounds), in us: the L2 holds no dirty lines, as where a product follows
    kernels that write little (do_bench's flush before each call leaves it full of them)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    best = {}
    for _ in range(rounds):
        for name, fn in fns.items():
            fn()
            times = []
            for _ in range(reps):
                start.record()
                for _ in range(calls):
                    fn()
                end.record()
                torch.cuda.synchronize()
                times.append(start.elapsed_time(end) * 1000 / calls)
            best[name] = min(best.get(name, math.inf), sorted(times)[reps // 2])
    return best


if __name__ == "__main__":
    main(sys.argv[1:])
