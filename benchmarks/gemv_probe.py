"""Whether a GEMV (a row of x times a weight, as nn.Linear calls it at batch 1) written as the row
reduction (W * x).sum(-1) runs faster in the rows template than cuBLAS (F.linear, torch.mv) and
Inductor's compile of F.linear, beside a copy of the weight: every launch of the task's plans,
triton do_bench, the least of 3 interleaved rounds. The rows template has taken such products
as mm/addmm since (skills/rows/gemv.py).

    python benchmarks/gemv_probe.py N:K:DTYPE..    # e.g. 4096:4096:fp32 11008:4096:bf16

In bf16 the task's program rounds each product to bf16 before its sum, so every rows candidate,
which keeps fp32 as cuBLAS does, differs from it by more than the check allows and is left out:
bf16 lines time cuBLAS and Inductor alone. On an H200 (2026-11-27):
benchmarks/results/gemv_probe-h200-torch2.11-2026-11-27-thirtyfirst.txt.
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

from agent_backend.explain import tasks_of, trace_tasks  # noqa: E402
from agent_backend.specs import random_inputs  # noqa: E402
from agent_backend.task import load_program  # noqa: E402
from benchmarks.rows_plans import bench, plan_contenders, plan_launches  # noqa: E402

DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


class Gemv(torch.nn.Module):
    def forward(self, w, x):
        return (w * x).sum(-1)


def main(specs: list[str]) -> None:
    for spec in specs:
        n, k, dtype = spec.split(":")
        w, x = torch.randn(int(n), int(k), dtype=DTYPES[dtype]), torch.randn(int(k), dtype=DTYPES[dtype])
        for task in tasks_of(trace_tasks(Gemv(), [w, x], backward=False, min_ops=1)):
            task = task.on_device("cuda")
            ins = random_inputs(task.inputs, 0, device="cuda")
            expected = load_program(task.program)["Model"]().cuda()(*ins)
            fns = plan_contenders(plan_launches(task), ins, (expected,), atol=1e-1)
            weight, vector = ins
            linear = F.linear(vector.unsqueeze(0), weight).squeeze(0)
            print(spec, "linear vs task max diff", (linear.float() - expected.float()).abs().max().item())
            compiled = torch.compile(lambda a, b: F.linear(b.unsqueeze(0), a))
            compiled(weight, vector)
            destination = torch.empty_like(weight)
            fns |= {"cublas-linear": lambda: F.linear(vector.unsqueeze(0), weight),
                    "cublas-mv": lambda: torch.mv(weight, vector),
                    "inductor-linear": lambda: compiled(weight, vector),
                    "copy-weight": lambda: destination.copy_(weight)}
            t = bench(fns, rounds=3)
            print(spec, " | ".join(f"{k} {v:.1f}us" for k, v in sorted(t.items(), key=lambda kv: kv[1])), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
