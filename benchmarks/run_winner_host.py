"""Host time per call of a winner run through cuda_agent::run_winner (the path of every winner
that is not a launch spec), against calling its forward directly and against the same op
defined with torch.library.custom_op, as run_winner was until 2026-11-23.

    python benchmarks/run_winner_host.py [--device cpu|cuda] [--out results.json]

The winner is `x + 1` on a (16,) tensor, so nearly all of each call is dispatch. The three are
timed in interleaved rounds (A, B, C, A, B, C, ...) in one process; prints JSON with the median
microseconds per call and each way's overhead over the direct call.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout, uninstalled

from agent_backend import runtime  # noqa: E402
from agent_backend.specs import TensorSpec  # noqa: E402
from output import emit  # noqa: E402

WINNER = '''
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x):
        return x + 1
'''
CALLS, ROUNDS = 2000, 15


@torch.library.custom_op("cuda_agent_bench::run_winner_custom_op", mutates_args=())
def _as_custom_op(key: str, program: str, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    """run_winner's body, defined as the custom_op defined it."""
    return runtime.run_winner(key, program, inputs)


def _per_call_us(fn, sync) -> float:
    start = time.perf_counter()
    for _ in range(CALLS):
        fn()
    sync()
    return (time.perf_counter() - start) / CALLS * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--out")
    args = parser.parse_args()
    device = torch.device(args.device)
    x = torch.randn(16, device=device)
    winner = runtime.load_winner(runtime.Winner("bench", WINNER, (TensorSpec.of(x),), "bench"), device)
    forward = winner.forward_on(device if device.index is not None or device.type == "cpu"
                                else torch.device("cuda", torch.cuda.current_device()))
    ways = {
        "direct forward": lambda: forward(x),
        "run_winner op": lambda: torch.ops.cuda_agent.run_winner.default("bench", "", [x]),
        "as torch.library.custom_op": lambda: _as_custom_op("bench", "", [x]),
    }
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    samples = {name: [] for name in ways}
    for name, fn in ways.items():  # warm-up
        _per_call_us(fn, sync)
    for _ in range(ROUNDS):
        for name, fn in ways.items():
            samples[name].append(_per_call_us(fn, sync))
    median = {name: statistics.median(s) for name, s in samples.items()}
    result = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "date": time.strftime("%Y-%m-%d"),
        "host_us_per_call": median,
        "overhead_over_direct_us": {n: m - median["direct forward"] for n, m in median.items()
                                    if n != "direct forward"},
    }
    emit(result, args.out)


if __name__ == "__main__":
    main()
