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
    add_cache_parser(sub)
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
    if args.command == "cache":
        from kernel_cache.cli import run_cache_command
        return run_cache_command(args, verifier=_verify_entry)
    return 2


if __name__ == "__main__":
    sys.exit(main())
