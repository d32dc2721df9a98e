"""The `cuda-agent` command line."""
from __future__ import annotations

import argparse
import logging
import sys


def build_parser() -> argparse.ArgumentParser:
    from kernel_cache.cli import add_cache_parser

    parser = argparse.ArgumentParser(prog="cuda-agent", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress (INFO) to stderr")
    sub = parser.add_subparsers(dest="command", required=True)
    explain = sub.add_parser("explain", help="print the subgraphs the backend would hand to the agent")
    explain.add_argument("target", metavar="FILE.py:FACTORY",
                         help="a file and a function in it returning (model, example_inputs)")
    explain.add_argument("--json", action="store_true", help="machine-readable output")
    for name, help_text in (("warm", "search kernels for a model's subgraphs now and cache them (offline warm-up)"),
                            ("report", "say, per subgraph of a model, what the cache would run (no search)")):
        command = sub.add_parser(name, help=help_text)
        command.add_argument("target", metavar="FILE.py:FACTORY",
                             help="a file and a function in it returning (model, example_inputs)")
        command.add_argument("-o", "--option", action="append", default=[], metavar="NAME=VALUE",
                             help="a backend option, as in torch.compile(options=...); VALUE is JSON where it parses")
        command.add_argument("--no-backward", action="store_true", help="forward graphs only")
        command.add_argument("--json", action="store_true", help="machine-readable output")
    add_cache_parser(sub)
    trajectories = sub.add_parser("trajectories", help="the recorded candidates, as data to train models on")
    trajectory_commands = trajectories.add_subparsers(dest="trajectories_command", required=True, metavar="COMMAND")
    export = trajectory_commands.add_parser("export", help="every evaluated candidate as a chat example with a reward")
    export.add_argument("--format", choices=("jsonl", "parquet"), default="jsonl",
                        help="jsonl (default) or parquet (needs pyarrow)")
    export.add_argument("-o", "--out", help="the file to write (default for jsonl: standard output)")
    export.add_argument("--cache-dir", help="the local cache directory the trajectories lie in (default: "
                                            "$CUDA_AGENT_CACHE_DIR, else $XDG_CACHE_HOME/cuda_agent, else ~/.cache/cuda_agent)")
    return parser


def _verify_entry(entry):
    """`cache verify` on this machine: re-run the verifier on the entry's task in a worker."""
    from .verify_entry import verify_entry
    return verify_entry(entry)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.verbose:
        logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.command == "explain":
        from .explain import run_explain
        return run_explain(args.target, args.json)
    if args.command in ("warm", "report"):
        # A search is long: show its progress, as one line on a terminal, else as log lines.
        if args.command == "warm" and not args.verbose and not sys.stderr.isatty():
            logging.basicConfig(level=logging.INFO, format="%(message)s")
        from .warm import run_warm_or_report
        return run_warm_or_report(args.command, args.target, args.option, args.json, not args.no_backward)
    if args.command == "cache":
        from kernel_cache.cli import run_cache_command
        return run_cache_command(args, verifier=_verify_entry)
    if args.command == "trajectories":
        from .trajectory_export import run_trajectories_command
        return run_trajectories_command(args)
    return 2


if __name__ == "__main__":
    sys.exit(main())
