"""What the L2 flush before each timed call costs a short kernel. The worker's profiler and the
suite flushed by writing a buffer of twice the L2 size (since 2026-12-06 they alternate that with a
read flush, profile.TIMER_FLUSHES): the L2 is then full of dirty lines, and the timed kernel's
reads evict them, that is, write them back to memory. On an H100 (2026-11-24) every
contender of the level-1 long-row reductions (16 x 393216, 25 MB in fp32) ran 13-25 us against a
floor of 8 us, eager included: this script tells whether the flush is that fixed cost.

    python benchmarks/flush_effect.py [--out results.json]

Eager and Inductor's sum over the rows, and a copy of the same bytes, each timed after a write
flush (`zero_`), after a read flush (a sum over the buffer: it writes back the dirty lines itself
and leaves clean ones) and with no flush (the inputs partly in L2), in interleaved rounds; GPU
time between events, behind a GPU sleep that hides the host's launch work (as profile.CudaTimer).
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout

from output import emit  # noqa: E402

ROUNDS, CALLS, SHAPE = 20, 5, (16, 393216)


def measure() -> dict:
    from agent_backend.env.verify import sleep_cycles_per_ms

    x = torch.randn(SHAPE, device="cuda")
    out = torch.empty_like(x)
    compiled = torch.compile(lambda t: t.sum(-1), backend="inductor")
    contenders = {"eager_sum": lambda: x.sum(-1), "inductor_sum": lambda: compiled(x), "copy": lambda: out.copy_(x)}
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    buffer = torch.empty(2 * l2 // 4, dtype=torch.int32, device="cuda")
    flushes = {"write": buffer.zero_, "read": buffer.sum, "none": lambda: None}
    cover = int(0.5 * sleep_cycles_per_ms(torch.device("cuda")))  # 0.5 ms outlasts any launch here
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def time_call(flush, fn) -> float:
        flush()
        torch.cuda._sleep(cover)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) * 1e3

    for fn in contenders.values():  # warm-up: Inductor's compile, module loads
        fn()
    us = {(f, c): [] for f in flushes for c in contenders}
    for r in range(ROUNDS):
        for f in list(flushes)[r % 3:] + list(flushes)[:r % 3]:
            for c, fn in contenders.items():
                us[f, c] += [time_call(flushes[f], fn) for _ in range(CALLS)]
    input_bytes = x.numel() * x.element_size()
    return {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "shape": list(SHAPE),
            "input_mb": input_bytes / 2**20, "l2_mb": l2 / 2**20, "calls": ROUNDS * CALLS,
            "median_us": {f: {c: round(statistics.median(us[f, c]), 2) for c in contenders} for f in flushes}}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="also write the results (JSON) here")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("flush_effect.py needs a CUDA GPU")
    emit(measure(), args.out)


if __name__ == "__main__":
    main()
