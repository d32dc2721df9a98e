"""Where a worker's GPU memory goes while it verifies and times one candidate of softmax over
ROWS x 393216 fp32 (KernelBench's size at 4096 rows): a Worker in this process, the requests the
pool sends (prepare, load, verify keeping the trials, profile), the builtin t512r1v4c8Po
candidate, and a 14.7 GiB tensor standing for the suite's own process. After each request, and
where timing starts or runs out of memory, it prints the allocator's numbers and every live
CUDA tensor of 1 GiB or more with what refers to it (Inductor's fake tensors left out).

    python benchmarks/verify_memory_probe.py [ROWS]

On an H200 (2026-11-27, an earlier version that listed the fake tensors too): timing ran out of
memory in the eager reference's division with 114 GiB allocated by the worker; the verifier's
latest trial (its inputs, its outputs' copies, the reference's outputs: 18 GiB) was still held,
which timing lets go of since (Verifier.before_timing).
"""
from __future__ import annotations

import gc
import sys
from pathlib import Path

import torch

root = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(root), str(root / "tests")]  # run from a checkout; the task as the tests resize it

from agent_backend.env import worker as worker_module  # noqa: E402
from agent_backend.env.results import DEFAULT_PRECISION  # noqa: E402
from agent_backend.explain import tasks_of, trace_tasks  # noqa: E402
from benchmarks.suite.problem import build  # noqa: E402
from benchmarks.suite.registry import select  # noqa: E402
from skills.rows.candidates import propose_candidates  # noqa: E402
from skills.rows.plan import build_plan  # noqa: E402
from test_rows_template import resized  # noqa: E402

GiB = 1 << 30


def live(label: str) -> None:
    torch.cuda.synchronize()
    print(f"-- {label}: allocated {torch.cuda.memory_allocated() / GiB:.1f} GiB, reserved "
          f"{torch.cuda.memory_reserved() / GiB:.1f}, free {torch.cuda.mem_get_info()[0] / GiB:.1f}", flush=True)
    for o in gc.get_objects():
        if (isinstance(o, torch.Tensor) and not isinstance(o, torch._subclasses.FakeTensor) and o.is_cuda
                and o.untyped_storage().nbytes() >= GiB):
            holders = [type(r).__name__ for r in gc.get_referrers(o)][:4]
            print(f"     {o.untyped_storage().nbytes() / GiB:.1f} GiB {tuple(o.shape)} held by {holders}", flush=True)


def main(rows: int) -> None:
    (problem,) = select(only=["softmax_many_long_rows"])
    model, inputs = build(problem, "fp32", "cpu", small=True)
    (task,) = tasks_of(trace_tasks(model, inputs, backward=False, min_ops=1))
    task = resized(task.on_device("cuda"), (rows, 393216))
    candidate = next(c for c in propose_candidates(build_plan(task, True)) if c.origin.endswith("t512r1v4c8Po"))
    ballast = torch.empty(int(14.7 * GiB), dtype=torch.uint8, device="cuda")
    print(f"the suite's process stood for by {ballast.numel() / GiB:.1f} GiB", flush=True)
    worker = worker_module.Worker("cuda:0")
    profile_candidate = worker_module.profile_candidate

    def watched(verifier, contenders, input_sets, *args):
        live(f"timing starts ({len(input_sets)} input sets)")
        try:
            return profile_candidate(verifier, contenders, input_sets, *args)
        except torch.OutOfMemoryError:
            live("out of memory in timing")
            raise

    worker_module.profile_candidate = watched
    precision = dict(DEFAULT_PRECISION)
    for request in ({"op": "prepare", "task": task.to_json(), "precision": precision},
                    {"op": "load", "task": task.to_json(), "candidate": candidate.to_json(), "precision": precision,
                     "build_root": None},
                    {"op": "verify", "keep": True},
                    {"op": "profile", "min_speedup": 1.05, "inductor_note": None}):
        reply = worker.handle(request)
        print(request["op"], {k: str(v)[:300] for k, v in reply.items() if k in ("status", "reason", "ok", "error")},
              flush=True)
        live(f"after {request['op']}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 4096)
