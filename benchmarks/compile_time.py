"""First compiles as a user meets them (issue 11): each compile in a fresh process, ours in its
default mode against Inductor, the two interleaved round by round (A, B, then B, A).

    python -m benchmarks.compile_time --only gpt2 llama bert --rounds 3 --warm-rounds 3 --settle 150
    python -m benchmarks.compile_time --dry-run --only gpt2      # on the CPU, small sizes (CI)

A trial is one process: it builds the suite's problem (seeded), compiles it with one backend and
times torch.compile and the first call (or training step), synchronised: torch's import and the
model's build are not timed, each backend's own imports (ours, Inductor's) are. Caches, per trial:
  cold: a fresh Inductor and Triton cache directory, and for ours a fresh kernel cache
        (CUDA_AGENT_CACHE_DIR: kernels, the GPU's floors and the launch op's build);
  warm: the directories a priming process of the same backend left: for ours, a process that
        compiled, waited up to --settle seconds for the background work and compiled again
        while work remained (as a user's later runs would), for Inductor one compile.
Ours runs with the options given (-o), in mode "background" unless one says otherwise; the
priming process runs with the same options, since they are part of the graph cache's key.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BACKENDS = ("ours", "inductor")
RESULT_PREFIX = "COMPILE_TIME_RESULT "


def _child(args: argparse.Namespace) -> None:
    """One trial: build, compile with one backend, time the first call; print the result. The
    timing starts before torch.compile, so each backend's own imports count (our package's,
    Inductor's)."""
    import torch

    from .suite.problem import build, make_call
    from .suite.registry import select
    from .suite.settle import compile_until_settled

    problem, = select(only=[args.problem])
    device = "cpu" if args.dry_run else "cuda"
    model, inputs = build(problem, "bf16" if "bf16" in problem.dtypes else problem.dtypes[0], device,
                          small=args.dry_run)

    def timed(call, start: float) -> float:
        call()
        if device == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - start

    if device == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    if args.backend == "ours":
        from agent_backend.warm import parse_options
        fn = torch.compile(model, backend="cuda_agent", options=parse_options(args.option))
    else:
        fn = torch.compile(model, backend="inductor")
    call = make_call(model, fn, inputs, problem.train)
    result = {"compile_s": timed(call, start)}
    if args.backend == "ours":
        from agent_backend import background, backend

        def decided(since: int) -> list:
            return [d for report in backend.reports[since:] for d in report.decisions if d.task is not None]
        decisions = decided(0)
        result |= {"tasks": len(decisions), "ours": sum(bool(d.winner_key) for d in decisions),
                   "queued": background.pending()}

        def again() -> tuple[float, list]:
            seen = len(backend.reports)
            return timed(call, time.perf_counter()), decided(seen)
        if args.settle:  # a priming run: what later processes will find
            later = compile_until_settled(again, args.settle)
            result |= {"later_s": [seconds for seconds, _ in later], "pending_at_exit": background.pending(),
                       "ours_after": sum(bool(d.winner_key) for d in later[-1][1])}
    print(RESULT_PREFIX + json.dumps(result), flush=True)


def _trial(problem: str, backend: str, dirs: Path, args: argparse.Namespace, settle: float = 0.0) -> dict:
    """Run one trial in a fresh process with its caches under `dirs`; its result or its error."""
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(dirs / "inductor"), TRITON_CACHE_DIR=str(dirs / "triton"),
               CUDA_AGENT_CACHE_DIR=str(dirs / "kernels"))
    command = [sys.executable, "-m", "benchmarks.compile_time", "--child", "--problem", problem,
               "--backend", backend, "--settle", str(settle)] + (["--dry-run"] if args.dry_run else [])
    command += [a for option in args.option for a in ("-o", option)]
    start = time.perf_counter()
    try:
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=args.trial_timeout + 3 * settle,
                              cwd=Path(__file__).resolve().parent.parent)
    except subprocess.TimeoutExpired:
        return {"error": f"no result within {args.trial_timeout + 3 * settle:.0f} s"}
    lines = [line for line in done.stdout.splitlines() if line.startswith(RESULT_PREFIX)]
    if done.returncode != 0 or not lines:
        return {"error": f"exit {done.returncode}: {done.stderr[-1500:]}"}
    return json.loads(lines[-1][len(RESULT_PREFIX):]) | {"process_s": time.perf_counter() - start}


def _summary(trials: dict) -> dict:
    """Median first-compile seconds of each backend, and ours over Inductor's."""
    medians = {}
    for backend in BACKENDS:
        seconds = [t["compile_s"] for t in trials[backend] if "compile_s" in t]
        medians[backend] = statistics.median(seconds) if seconds else None
    ratio = medians["ours"] / medians["inductor"] if all(medians.values()) else None
    return {"median_s": medians, "ratio": ratio}


def _measure(problem: str, root: Path, args: argparse.Namespace) -> dict:
    row: dict = {"problem": problem, "cold": {b: [] for b in BACKENDS}, "warm": {b: [] for b in BACKENDS}}
    for r in range(args.rounds):
        for backend in BACKENDS if r % 2 == 0 else BACKENDS[::-1]:
            row["cold"][backend].append(_trial(problem, backend, root / problem / f"cold-{backend}-{r}", args))
            _log(problem, "cold", backend, row["cold"][backend][-1])
    row["cold_summary"] = _summary(row["cold"])
    if args.warm_rounds:
        row["prime"] = {backend: _trial(problem, backend, root / problem / f"warm-{backend}", args,
                                        settle=args.settle if backend == "ours" else 0.0) for backend in BACKENDS}
        for backend in BACKENDS:
            _log(problem, "prime", backend, row["prime"][backend])
        for r in range(args.warm_rounds):
            for backend in BACKENDS if r % 2 == 0 else BACKENDS[::-1]:
                row["warm"][backend].append(_trial(problem, backend, root / problem / f"warm-{backend}", args))
                _log(problem, "warm", backend, row["warm"][backend][-1])
        row["warm_summary"] = _summary(row["warm"])
    return row


def _log(problem: str, phase: str, backend: str, trial: dict) -> None:
    what = trial.get("error") or f"{trial['compile_s']:.2f} s" + "".join(
        f", {k} {trial[k]}" for k in ("tasks", "ours", "queued", "later_s", "ours_after") if k in trial)
    print(f"[{problem} {phase} {backend}] {what}", file=sys.stderr, flush=True)


def _print_table(rows: list[dict]) -> None:
    print(f"{'problem':14s} {'cold ours':>10s} {'cold Ind.':>10s} {'ratio':>6s} {'warm ours':>10s} "
          f"{'warm Ind.':>10s} {'ratio':>6s}")
    for row in rows:
        cells = []
        for phase in ("cold_summary", "warm_summary"):
            s = row.get(phase, {"median_s": {}, "ratio": None})
            cells += [f"{s['median_s'].get(b) or float('nan'):10.2f}" for b in BACKENDS]
            cells.append(f"{s['ratio']:6.2f}" if s["ratio"] else f"{'-':>6s}")
        print(f"{row['problem']:14s} " + " ".join(cells))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.compile_time", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="+", default=["gpt2", "llama", "bert"], metavar="NAME",
                        help="suite problems (default: the three inference models)")
    parser.add_argument("--rounds", type=int, default=3, help="cold trials per backend")
    parser.add_argument("--warm-rounds", type=int, default=3, help="warm trials per backend (0: none, no priming)")
    parser.add_argument("--settle", type=float, default=150.0, metavar="SECONDS",
                        help="how long ours' priming process waits for background work before each later compile")
    parser.add_argument("--trial-timeout", type=float, default=300.0, metavar="SECONDS")
    parser.add_argument("-o", "--option", action="append", default=[], metavar="NAME=VALUE",
                        help="a cuda_agent backend option for every trial of ours")
    parser.add_argument("--dry-run", action="store_true", help="on the CPU at the problems' small sizes")
    parser.add_argument("--out", type=Path, help="write the results as JSON here too")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--problem", help=argparse.SUPPRESS)
    parser.add_argument("--backend", choices=BACKENDS, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        _child(args)
        return 0
    from .suite.registry import select
    select(only=args.only)  # an unknown name is an error before any trial runs
    import torch
    results = {"benchmark": "compile_time", "date": datetime.date.today().isoformat(),
               "gpu": "cpu (dry run)" if args.dry_run else torch.cuda.get_device_name(0), "torch": torch.__version__,
               "options": args.option, "rounds": args.rounds, "warm_rounds": args.warm_rounds, "settle_s": args.settle,
               "problems": []}
    with tempfile.TemporaryDirectory(prefix="compile_time_") as root:
        for problem in args.only:
            results["problems"].append(_measure(problem, Path(root), args))
            if args.out:  # after each problem: a run cut short keeps what it measured
                args.out.parent.mkdir(parents=True, exist_ok=True)
                args.out.write_text(json.dumps(results, indent=1) + "\n")
    _print_table(results["problems"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
