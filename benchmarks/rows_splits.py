"""Every split launch of a suite problem's row task (rows held in registers or shared memory,
threads x blocks a row of a cooperative grid, both plans), against Inductor and a copy of the same
bytes: triton.testing.do_bench, the least of 3 rounds, contenders interleaved. What set
skills/rows/candidates.SPLIT_REGISTER_WORDS (on an H200, 2026-11-26:
benchmarks/results/split_sweep-h200-torch2.11-2026-11-26-twentysecond.txt).

    python benchmarks/rows_splits.py bench softmax_long_rows:bf16 softmax_long_rows:fp32
    ROWS_SPLITS_MAX_WORDS=96 python benchmarks/rows_splits.py bench softmax_long_rows:fp32
    ncu --kernel-name regex:TAG python benchmarks/rows_splits.py ncu softmax_long_rows:bf16 TAG
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

from agent_backend.explain import tasks_of, trace_tasks  # noqa: E402
from agent_backend.specs import random_inputs  # noqa: E402
from agent_backend.task import load_program  # noqa: E402
from benchmarks.rows_plans import bench_beside_inductor_and_copy, plan_contenders  # noqa: E402
from benchmarks.suite.problem import build  # noqa: E402
from benchmarks.suite.registry import select  # noqa: E402
from skills.rows.candidates import _words, tag  # noqa: E402
from skills.rows.codegen import Launch, blocks_per_sm, shared_bytes  # noqa: E402
from skills.rows.plan import build_plan  # noqa: E402

MAX_WORDS = int(os.environ.get("ROWS_SPLITS_MAX_WORDS", 48))  # registers a thread may hold its slice in
MAX_THREADS_AN_SM, MAX_BLOCKS_AN_SM, MAX_SHARED_AN_SM = 2048, 8, 220 * 1024


def split_launches(task):
    """(tag, plan, launch) for each split shape that could be resident: 128-1024 threads, 8-64
    blocks a row, in registers (at most MAX_WORDS a thread) or shared memory (two blocks an SM or more)."""
    for online in (True, False):
        plan = build_plan(task, online)
        for storage in ("registers", "shared"):
            for threads in (128, 256, 512, 1024):
                for split in (8, 16, 32, 64):
                    launch = Launch(threads, 1, plan.vector_width, storage, split=split)
                    per_sm = blocks_per_sm(plan, launch)
                    if (per_sm * threads > MAX_THREADS_AN_SM or per_sm > MAX_BLOCKS_AN_SM
                            or shared_bytes(plan, launch) * per_sm > MAX_SHARED_AN_SM):
                        continue
                    if (_words(plan, launch) > MAX_WORDS) if storage == "registers" else per_sm < 2:
                        continue
                    yield tag(plan, launch), plan, launch


def main(mode: str, specs: list[str], only: str | None) -> None:
    for spec in specs:
        name, dtype = spec.split(":")
        (problem,) = select(only=[name])
        model, inputs = build(problem, dtype, "cpu", small=False)
        (task,) = [t.on_device("cuda") for t in tasks_of(trace_tasks(model, inputs, backward=False, min_ops=1))]
        ins = random_inputs(task.inputs, 0, scale=2.0, device="cuda")
        reference = load_program(task.program)["Model"]().cuda()
        with torch.no_grad():
            expected = reference(*ins)
        # a softmax over 393216 elements is about 3e-6 an element: compared at that scale
        launches = [entry for entry in split_launches(task) if only in (None, entry[0])]
        fns = plan_contenders(launches, ins, (expected,), atol=1e-5)
        if mode == "ncu":  # a few launches of each, for the profiler
            for f in fns.values():
                for _ in range(3):
                    f()
            torch.cuda.synchronize()
            continue
        print(spec, bench_beside_inductor_and_copy(fns, reference, ins, ins[0]), flush=True)


if __name__ == "__main__":
    mode, rest = sys.argv[1], sys.argv[2:]
    main(mode, rest[:-1] if mode == "ncu" else rest, rest[-1] if mode == "ncu" else None)
