"""The environment's benchmark in one run on the GPU: compile time and launch overhead per build
path, then pointwise tasks (our kernel vs Inductor vs eager, bandwidth vs a D2D copy).

    python benchmarks/environment.py --out benchmarks/results/environment-<gpu>-<date>.json
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import compile_and_launch  # noqa: E402
import pointwise  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, help="also write all results as JSON here")
    parser.add_argument("--skip-extension", action="store_true", help="skip the load_inline build (about a minute)")
    parser.add_argument("--only", help="run only pointwise cases whose name contains this")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("needs a CUDA GPU")
        return 1
    # A fresh cache root: cold compiles, and no earlier result short-cuts the search.
    os.environ["CUDA_AGENT_CACHE_DIR"] = tempfile.mkdtemp(prefix="cuda_agent_bench_")
    build = compile_and_launch.measure(skip_extension=args.skip_extension)
    tasks = pointwise.run_cases(args.only)
    compile_and_launch.print_table(build)
    pointwise.print_rows(tasks)
    if args.out:
        args.out.write_text(json.dumps({"compile_and_launch": build, "pointwise": tasks}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
