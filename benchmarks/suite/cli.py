"""python -m benchmarks.suite: the problems, run on this GPU, against Inductor and eager.

    python -m benchmarks.suite                              # everything, fp32 and bf16
    python -m benchmarks.suite --level 2 --dtype bf16 -o search_budget_s=60
    python -m benchmarks.suite --only 'gemm_*' gpt2 --rounds 20
    python -m benchmarks.suite --dry-run --only softmax     # on the CPU, small sizes (CI)
    python -m benchmarks.suite --list
"""
from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import logging
import shlex
import shutil
import sys
import tempfile
from pathlib import Path

import torch
import torch._functorch.config

from agent_backend.dispatch import user_precision
from agent_backend.env.profile import TIMER_FLUSHES
from agent_backend.options import resolve
from agent_backend.warm import parse_options

from . import report, timing
from .problem import DTYPES
from .registry import select
from .runner import RunConfig, run_problem, warm_up


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.suite", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--level", type=int, nargs="+", choices=(1, 2, 3), help="levels to run (default: all)")
    parser.add_argument("--group", nargs="+", help="groups to run, e.g. rewrites transformers (default: all)")
    parser.add_argument("--only", nargs="+", metavar="NAME", help="problem names or glob patterns")
    parser.add_argument("--dtype", nargs="+", choices=tuple(DTYPES), default=list(DTYPES),
                        help="dtypes to run, where a problem runs in them (default: all)")
    parser.add_argument("--rounds", type=int, help="interleaved timing rounds (default 10; dry run 2)")
    parser.add_argument("--calls", type=int, help="timed calls per contender per round (default 5; dry run 1)")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"), help="directory for the JSON and .md")
    parser.add_argument("--dry-run", action="store_true",
                        help="on the CPU at the problems' small sizes: checks that everything runs, times nothing real")
    parser.add_argument("-o", "--option", action="append", default=[], metavar="NAME=VALUE",
                        help="a cuda_agent backend option, VALUE as JSON where it parses (e.g. -o search_budget_s=60)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--flush", choices=TIMER_FLUSHES, default="both",
                        help="how the L2 is flushed before each timed call: write (as do_bench: the call pays "
                             "the dirty lines' write-back), read (a clean, cold L2) or both, in alternate rounds, "
                             "ours judged under the one less favourable to it, as the backend's search judges "
                             "its candidates (default: both)")
    parser.add_argument("--settle", type=float, default=0.0, metavar="SECONDS",
                        help="with -o mode=background: after the first compile, wait up to SECONDS for the "
                             "background work and compile again (up to 3 times, while work remains), then time "
                             "what the last compile runs; every compile's time is recorded")
    parser.add_argument("--list", action="store_true", help="list the selected problems and exit")
    parser.add_argument("-v", "--verbose", action="store_true", help="log the backend's decisions and searches")
    return parser


def _list(problems) -> str:
    return "\n".join(f"L{p.level} {p.group:<13} {p.name:<28} {','.join(p.dtypes):<9} "
                     f"{'train' if p.train else 'inference':<9} {p.note}".rstrip() for p in problems)


def _backend_options(pairs: list[str]) -> dict:
    """The -o options, with a fresh kernel cache directory unless one is given: every run
    searches from nothing, and no earlier result makes a problem look better than it is."""
    options = parse_options(pairs)
    options.setdefault("cache_dir", tempfile.mkdtemp(prefix="cuda_agent_suite_"))
    resolve(options)
    return options


def _run_header(args, command: list[str], device: str, options: dict, copy_rate: float) -> dict:
    try:
        transformers_version = importlib.metadata.version("transformers")
    except importlib.metadata.PackageNotFoundError:
        transformers_version = None
    gpu = torch.cuda.get_device_name() if device == "cuda" else None
    return {"suite": "cuda-agent benchmark suite", "format": 1, "gpu": gpu or "CPU (dry run)",
            "gpu_short": report.gpu_short_name(gpu) if gpu else "cpu", "device": device, "torch": torch.__version__,
            "cuda": torch.version.cuda, "transformers": transformers_version,
            "date": str(datetime.date.today()), "started": datetime.datetime.now().isoformat(timespec="seconds"),
            "command": "python -m benchmarks.suite " + shlex.join(command), "dry_run": args.dry_run,
            "sizes": "small" if args.dry_run else "full", "dtypes": args.dtype, "rounds": args.rounds,
            "calls": args.calls, "timer": timing.describe(device, args.flush), "seed": args.seed,
            "options": options, "precision": user_precision(resolve(options)), "copy_gb_s": copy_rate / 1e9}


def _print_summaries(rows: list[dict]) -> None:
    for s in report.summaries(rows):
        geomean = "-" if s["geomean_vs_inductor"] is None else f"{s['geomean_vs_inductor']:.3f}x"
        print(f"{s['scope']:<20} geomean vs Inductor {geomean:>8} over {s['timed']} timed cases; "
              f"our kernels ran in {s['cases_with_our_kernels']}; {s['mismatches']} mismatches, "
              f"{s['errors']} errors, {s['skipped']} skipped")


def run_suite(problems, args, command: list[str], options: dict) -> report.ReportWriter:
    device = "cpu" if args.dry_run else "cuda"
    copy_rate = timing.copy_bytes_per_s(device)
    run = _run_header(args, command, device, options, copy_rate)
    json_path, md_path = report.output_paths(args.out, run["gpu_short"], run["date"], args.dry_run)
    writer = report.ReportWriter(run, json_path, md_path)
    compile_dir = tempfile.mkdtemp(prefix="cuda_agent_suite_compile_")
    cfg = RunConfig(device=device, small=args.dry_run, rounds=args.rounds, calls=args.calls, options=options,
                    copy_bytes_per_s=copy_rate, compile_dir=compile_dir, seed=args.seed, settle_s=args.settle,
                    flush=args.flush)
    print(f"{run['gpu']} | torch {run['torch']} | {len(problems)} problems | kernel cache {options['cache_dir']} | "
          f"writing {json_path}", flush=True)
    # Inductor's caches of compiled graphs off: every compile runs our pass (and reports which
    # subgraphs it gave our kernels), and compile times are not replays of an earlier run.
    try:
        with torch._inductor.config.patch(fx_graph_cache=False), \
                torch._functorch.config.patch(enable_autograd_cache=False):
            run["warmup_compile_s"] = warm_up(cfg)
            for problem in problems:
                for dtype in (d for d in args.dtype if d in problem.dtypes):
                    row = run_problem(problem, dtype, cfg)
                    writer.add(row)
                    print(report.console_line(row), flush=True)
    finally:
        shutil.rmtree(compile_dir, ignore_errors=True)
    return writer


def main(argv: list[str] | None = None) -> int:
    command = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(command)
    if args.verbose:
        logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        problems = select(args.level, args.only, args.group)
        if args.list:
            print(_list(problems))
            return 0
        options = _backend_options(args.option)
    except ValueError as e:  # a bad selection, or a bad option (OptionError)
        print(e)
        return 2
    if not args.dry_run and not torch.cuda.is_available():
        print("the suite needs a CUDA GPU (--dry-run runs it on the CPU at small sizes)")
        return 1
    args.rounds = args.rounds or (2 if args.dry_run else 10)
    args.calls = args.calls or (1 if args.dry_run else 5)
    writer = run_suite(problems, args, command, options)
    print()
    _print_summaries(writer.rows)
    print(f"\nwrote {writer.json_path} and {writer.md_path}")
    return 0
