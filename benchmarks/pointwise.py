"""Pointwise tasks on the GPU: our best verified kernel vs Inductor vs eager, in one run.

For each task the built-in policy's candidates are searched in the worker pool exactly as the
backend does (same verifier, same profiler: L2 flushed, medians of many trials, all three timed
in one worker on the same inputs), then achieved bandwidth is shown as a fraction of a measured
device-to-device copy.

    python benchmarks/pointwise.py [--only NAME] [-v] [--out benchmarks/results/pointwise-<gpu>-<date>.json]
"""
from __future__ import annotations

import argparse
import datetime
import json
import logging
import math
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout: benchmarks.suite

from agent_backend.dispatch import user_precision  # noqa: E402
from agent_backend.env import Environment  # noqa: E402
from agent_backend.explain import tasks_of, trace_tasks  # noqa: E402
from agent_backend.options import resolve  # noqa: E402
from agent_backend.policies.builtin import BuiltinPolicy  # noqa: E402
from agent_backend.search import search_task  # noqa: E402
from benchmarks.suite.timing import copy_bytes_per_s  # noqa: E402


def cases():
    """name -> (function, inputs); each function is one pointwise chain."""
    def r(*shape, dtype=torch.float32):
        return torch.randn(*shape, device="cuda", dtype=dtype)
    return {
        "add_relu_f32_4kx4k": (lambda x, y: torch.relu(x + y) * 2.0, (r(4096, 4096), r(4096, 4096))),
        "swish_bias_f16_8kx4k": (lambda x, b: x * torch.sigmoid(x) + b,
                                 (r(8192, 4096, dtype=torch.float16), r(4096, dtype=torch.float16))),
        "gelu_mul_bf16_8kx4k": (lambda x, y: torch.nn.functional.gelu(x) * y,
                                (r(8192, 4096, dtype=torch.bfloat16), r(8192, 4096, dtype=torch.bfloat16))),
        "tanh_gate_f32_4kx4k": (lambda x, y: torch.tanh(x * 0.5 + y) * torch.sigmoid(y),
                                (r(4096, 4096), r(4096, 4096))),
        "transposed_add_f32_4kx4k": (lambda x, y: torch.sigmoid(x.t() + y) * 3.0, (r(4096, 4096), r(4096, 4096))),
        "small_f32_256x1024": (lambda x, y: torch.relu(x * y + 1.0) - y, (r(256, 1024), r(256, 1024))),
        # the suite's batchnorm_eval: a per-channel scale and shift of 784 elements each
        "batchnorm_eval_bf16_32x256x28x28": (
            lambda x, m, v, w, b: torch.nn.functional.batch_norm(x, m, v, w, b, training=False),
            (r(32, 256, 28, 28, dtype=torch.bfloat16), r(256, dtype=torch.bfloat16),
             r(256, dtype=torch.bfloat16).abs() + 1, r(256, dtype=torch.bfloat16), r(256, dtype=torch.bfloat16))),
    }


class Fn(torch.nn.Module):
    """A function as a module, for tracing its graph."""

    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *xs):
        return self.fn(*xs)


def run_cases(only: str | None = None, make_cases=cases, kind: str = "pointwise") -> dict:
    """Search each case's largest task of `kind` with the built-in policy, as the backend would."""
    settings = resolve({})
    # Its own pool, closed at the end (not the process-wide one the backend shares).
    with Environment(precision=user_precision(settings), min_speedup=settings.min_speedup) as env:
        policy = BuiltinPolicy()
        copy_gbs = copy_bytes_per_s("cuda") / 1e9
        rows = []
        for name, (fn, inputs) in make_cases().items():
            if only and only not in name:
                continue
            tasks = [t for t in tasks_of(trace_tasks(Fn(fn), inputs, backward=False)) if t.kind == kind]
            task = max(tasks, key=lambda t: len(t.ops))
            entry = search_task(task, env, policy, budget_s=600, max_candidates=settings.max_candidates)
            row = {"case": name, "ops": len(task.ops), "outcome": entry.outcome, "reason": entry.reason,
                   "search_s": round(entry.timings["search_s"], 1), "phase_s": entry.timings["phase_s"]}
            if entry.timings.get("ours_ms") and entry.timings.get("inductor_ms"):
                t = entry.timings
                nbytes = sum(math.prod(s.shape) * torch.empty(0, dtype=s.torch_dtype).element_size()
                             for s in task.inputs + task.outputs)
                ours = t["ours_ms"]["median"]
                row.update(ours_ms=ours, inductor_ms=t["inductor_ms"]["median"], eager_ms=t["eager_ms"]["median"],
                           speedup_vs_inductor=t["speedup_vs_inductor"], speedup_vs_eager=t["speedup_vs_eager"],
                           gbs=nbytes / (ours * 1e-3) / 1e9, origin=entry.origin, timings=t)
                row["copy_fraction"] = row["gbs"] / copy_gbs
            rows.append(row)
            print(json.dumps({k: v for k, v in row.items() if k != "timings"}), flush=True)
    return {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "date": str(datetime.date.today()),
            "copy_gbs": copy_gbs, "rows": rows}


def print_rows(results: dict) -> None:
    print(f"\nGPU: {results['gpu']} | torch {results['torch']} | copy {results['copy_gbs']:.0f} GB/s | "
          f"{results['date']}")
    print(f"{'case':<26} {'ours ms':>9} {'inductor':>9} {'eager':>9} {'vs ind':>7} {'vs eager':>8} {'GB/s':>7} "
          f"{'of copy':>7} {'search':>7}  outcome")
    for r in results["rows"]:
        if "ours_ms" in r:
            print(f"{r['case']:<26} {r['ours_ms']:>9.4f} {r['inductor_ms']:>9.4f} {r['eager_ms']:>9.4f} "
                  f"{r['speedup_vs_inductor']:>6.2f}x {r['speedup_vs_eager']:>7.2f}x {r['gbs']:>7.0f} "
                  f"{r['copy_fraction']:>6.0%} {r['search_s']:>6.0f}s  {r['outcome']}")
        else:
            print(f"{r['case']:<26} {'-':>9} {'':>9} {'':>9} {'':>7} {'':>8} {'':>7} {'':>7} {r['search_s']:>6.0f}s  "
                  f"{r['outcome']}: {r['reason'][:80]}")


def main(make_cases=cases, kind: str = "pointwise") -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", help="also write the results as JSON here")
    parser.add_argument("--only", help="run only cases whose name contains this")
    parser.add_argument("-v", "--verbose", action="store_true", help="log each candidate's verdict and time")
    args = parser.parse_args()
    if args.verbose:
        logging.basicConfig(level=logging.INFO, format="%(message)s")
    if not torch.cuda.is_available():
        print("needs a CUDA GPU")
        return 1
    results = run_cases(args.only, make_cases, kind)
    print_rows(results)
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
