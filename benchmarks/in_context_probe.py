"""Whether the in-context check's "before" program stands for Inductor's compile of the user's
model: one suite problem compiled by us (mode=search, a fresh cache) and by Inductor, then the
check's recorded verdicts and, timed interleaved with the two (the suite's timing), each "before"
program of the cache compiled by Inductor as the worker compiles it.

    python benchmarks/in_context_probe.py conv_groupnorm_silu fp32

Written when the suite's conv_groupnorm_silu fp32 read 0.97x with a kernel the check had kept
at 1.30x (0.1559 vs 0.2021 ms): a rerun (2026-11-26, H200) found the before program as fast as
Inductor's compile of the model, and the check's verdict 1.03x, 0.98x on the GPU.
"""
from __future__ import annotations

import argparse
import copy
import json
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

from agent_backend.env.candidate_loader import load_task  # noqa: E402
from agent_backend.specs import Task, random_inputs  # noqa: E402
from benchmarks.suite import registry, timing  # noqa: E402
from benchmarks.suite.problem import build  # noqa: E402
from kernel_cache.layers import KernelCache  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("problem")
    parser.add_argument("dtype", choices=("fp32", "bf16"))
    parser.add_argument("--rounds", type=int, default=30)
    args = parser.parse_args()
    (problem,) = registry.select(only=[args.problem])
    cache_dir = tempfile.mkdtemp(prefix="in_context_probe_")
    model, inputs = build(problem, args.dtype, "cuda", small=False)
    compiled = {"ours": torch.compile(copy.deepcopy(model), backend="cuda_agent",
                                      options={"mode": "search", "search_budget_s": 30, "cache_dir": cache_dir}),
                "inductor": torch.compile(copy.deepcopy(model), backend="inductor")}
    contenders = {name: (lambda f=f: f(*inputs)) for name, f in compiled.items()}
    with torch.no_grad():
        for call in contenders.values():
            call()  # ours searches here, checks in context and caches the verdict
        with KernelCache.open(cache_dir) as cache:
            entries = [entry for _, entry in cache.items()]
        for entry in entries:
            print(f"{entry.outcome:8s} {entry.origin}: {entry.reason}\n  {json.dumps(entry.timings)[:300]}")
        for i, entry in enumerate(e for e in entries if e.outcome == "context"):
            before = Task.from_json(entry.task)
            _, before_model = load_task(before.program, torch.device("cuda"))
            before_inputs = random_inputs(before.inputs, 0, device="cuda")
            before_compiled = torch.compile(before_model, backend="inductor", dynamic=False)  # as the worker does
            before_compiled(*before_inputs)
            contenders[f"before {i}"] = lambda f=before_compiled, x=before_inputs: f(*x)
        contenders["eager"] = lambda: model(*inputs)
        ms = timing.time_interleaved(contenders, args.rounds, 5, "cuda")
    for name, stats in ms.items():
        print(f"{name:10s} GPU {stats['median']:.4f} ms  host {stats['host_median']:.4f} ms")


if __name__ == "__main__":
    main()
