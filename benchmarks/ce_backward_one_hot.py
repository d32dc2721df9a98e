"""Cross-entropy's backward row task at 4096 x 32000 (F.cross_entropy's, traced on the GPU): its
one-hot's sum in closed form (skills/rows/plan._one_hot_sum, "closed:") against the same plan
with a pass over the row for it ("pass:"), every launch of each, beside Inductor's kernel for the
task and a copy of the logits (triton do_bench, least of 3 interleaved rounds). Candidates are
checked against Inductor's output: eager rounds the recomputed log-probabilities to bf16.

    python benchmarks/ce_backward_one_hot.py
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch

root = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(root), str(root / "tests")]  # run from a checkout; the task as the tests trace it

from agent_backend.specs import random_inputs  # noqa: E402
from agent_backend.task import load_program  # noqa: E402
from benchmarks.rows_plans import bench_beside_inductor_and_copy, plan_contenders, rows_input  # noqa: E402
from skills.rows import plan as plan_module  # noqa: E402
from skills.rows.candidates import launch_configs, tag  # noqa: E402
from skills.rows.plan import build_plan  # noqa: E402
from test_rows_template import cross_entropy_backward_task  # noqa: E402


def plans(task):
    """(closed form, with a pass) plans of `task`."""
    closed = build_plan(task)
    original = plan_module._Program._one_hot_sum
    plan_module._Program._one_hot_sum = lambda self, node, kind: False
    try:
        with_pass = build_plan(task)
    finally:
        plan_module._Program._one_hot_sum = original
    return closed, with_pass


def main() -> None:
    print(torch.cuda.get_device_name(0), torch.__version__)
    for dtype in (torch.bfloat16, torch.float32):
        task = cross_entropy_backward_task(dtype, 4096, 32000, "cuda")
        closed, with_pass = plans(task)
        launches = ([("closed:" + tag(closed, c), closed, c) for c in launch_configs(closed)]
                    + [("pass:" + tag(with_pass, c), with_pass, c) for c in launch_configs(with_pass)])
        ins = random_inputs(task.inputs, 0, scale=2.0, device="cuda")
        reference = load_program(task.program)["Model"]().cuda()
        with torch.no_grad():
            expected = torch.compile(reference, backend="inductor")(*ins)
        fns = plan_contenders(launches, ins, expected if isinstance(expected, tuple) else (expected,))
        x = rows_input(ins)  # the logits
        print(str(dtype), bench_beside_inductor_and_copy(fns, reference, ins, x, "copy_logits"), flush=True)


if __name__ == "__main__":
    main()
