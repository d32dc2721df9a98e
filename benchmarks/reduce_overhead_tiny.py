"""Issue 10's tiny graph under CUDA graphs: 4096 elements, 3 pointwise ops, with a winner of ours
(the pointwise template's first candidate, stored in a fresh kernel cache as the task's winner,
so that our launch op runs in the graph), compiled with mode="reduce-overhead" by cuda_agent
(mode "cached": nothing is searched) and by Inductor, then timed interleaved.

    python benchmarks/reduce_overhead_tiny.py [--out results.json]

Each round times CALLS calls of one contender back to back (wall clock, synchronised at the
end), the contenders alternating and the first rotating; the medians per call are compared.
Target: ours within 10% of Inductor. Also checked: our op ran only while CUDA graphs were
recorded (replays do not call it), and the results match eager.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]  # run from a checkout; tests/helpers stores the winner

from output import emit  # noqa: E402

ROUNDS, CALLS, ELEMENTS = 20, 200, 4096


class Gate(torch.nn.Module):
    def forward(self, x, y):
        return torch.tanh(x * 0.5 + y) * torch.sigmoid(y)


def _per_call_us(fn, x, y) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(CALLS):
        fn(x, y)
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / CALLS * 1e6


def measure() -> dict:
    from agent_backend import runtime
    from helpers import collect_tasks, put_cached_entry
    from skills.pointwise import propose

    os.environ["CUDA_AGENT_CACHE_DIR"] = tempfile.mkdtemp(prefix="cuda_agent_tiny_")
    os.environ["CUDA_AGENT_MODE"] = "cached"  # torch.compile takes a mode or options, not both
    x, y = (torch.randn(4, ELEMENTS // 4, device="cuda") for _ in range(2))
    (task,) = collect_tasks(Gate(), [x, y], backward=False, min_ops=2)
    candidate = propose(task)[0]
    key = put_cached_entry(task, source=candidate.source, origin=candidate.origin, device="cuda")
    torch._dynamo.reset()
    ours = torch.compile(Gate(), backend="cuda_agent", mode="reduce-overhead")
    inductor = torch.compile(Gate(), backend="inductor", mode="reduce-overhead")
    times: dict[str, list[float]] = {"ours": [], "inductor": []}
    with torch.no_grad():
        expected = Gate()(x, y)
        for name, fn in (("ours", ours), ("inductor", inductor)):
            for _ in range(3):  # warm-up, record, replay
                torch.testing.assert_close(fn(x, y), expected, atol=1e-5, rtol=1e-5)
        for r in range(ROUNDS):
            order = ("ours", "inductor") if r % 2 == 0 else ("inductor", "ours")
            for name in order:
                times[name].append(_per_call_us(ours if name == "ours" else inductor, x, y))
    winner = runtime.registered(key)
    ours_us, inductor_us = statistics.median(times["ours"]), statistics.median(times["inductor"])
    return {
        "gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "date": time.strftime("%Y-%m-%d"),
        "elements": ELEMENTS, "rounds": ROUNDS, "calls_per_round": CALLS,
        "winner": candidate.origin, "winner_is_launch_spec": winner is not None and winner.spec is not None,
        "our_op_calls": winner.calls if winner else None,
        "graph_calls": 3 + ROUNDS * CALLS,
        "ours_us_per_call": round(ours_us, 2), "inductor_us_per_call": round(inductor_us, 2),
        "ours_vs_inductor": round(inductor_us / ours_us, 3), "target": "ours within 10% of Inductor",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, help="also write the results here")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("reduce_overhead_tiny.py needs a CUDA GPU")
    emit(measure(), args.out)


if __name__ == "__main__":
    main()
