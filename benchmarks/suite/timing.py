"""Timing contenders against each other in one process, interleaved, with L2 flushed.

Each round times `calls` calls of every contender in turn (the contender that goes first moves
on by one each round, so none always follows the same neighbour). On CUDA each call sits between
two CUDA events, after a write of a buffer twice the L2 size (at least 256 MB) that evicts what
the previous call left there; the flush also gives the host a head start, so a call's launch
overhead is hidden up to the flush's own duration. On the CPU (the dry run) calls are timed with
the host clock and nothing is flushed.
"""
from __future__ import annotations

import statistics
import time
from typing import Callable

import torch

MIN_FLUSH_BYTES = 256 << 20


def flush_bytes(device: str) -> int:
    """Twice the L2 size, at least 256 MB; 0 on the CPU (nothing is flushed there)."""
    if device != "cuda":
        return 0
    return max(MIN_FLUSH_BYTES, 2 * getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0))


def flush_buffer(device: str) -> torch.Tensor | None:
    nbytes = flush_bytes(device)
    return torch.empty(nbytes, dtype=torch.uint8, device=device) if nbytes else None


def _time_calls(fn: Callable[[], object], calls: int, flush: torch.Tensor | None) -> list[float]:
    """Milliseconds per call."""
    if flush is None:
        times = []
        for _ in range(calls):
            start = time.perf_counter()
            fn()
            times.append((time.perf_counter() - start) * 1e3)
        return times
    events = []
    for _ in range(calls):
        flush.zero_()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        events.append((start, end))
    torch.cuda.synchronize()
    return [start.elapsed_time(end) for start, end in events]


def time_interleaved(contenders: dict[str, Callable[[], object]], rounds: int, calls: int, device: str,
                     warmup: int = 2) -> dict[str, list[float]]:
    """name -> every timed call's milliseconds, `rounds` x `calls` of them."""
    flush = flush_buffer(device)
    for fn in contenders.values():
        for _ in range(warmup):
            fn()
    names = list(contenders)
    samples: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            samples[name] += _time_calls(contenders[name], calls, flush)
    return samples


def summarize(times_ms: list[float]) -> dict:
    ordered = sorted(times_ms)
    return {"median": statistics.median(ordered), "p10": ordered[int(0.1 * (len(ordered) - 1))],
            "p90": ordered[int(0.9 * (len(ordered) - 1))], "n": len(ordered)}


def copy_bytes_per_s(device: str, nbytes: int) -> float:
    """A large device-to-device copy's rate, counting bytes read plus bytes written (the unit a
    problem's floor_bytes is in): median of 20 copies."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    copy = lambda: dst.copy_(src)  # noqa: E731
    ms = statistics.median(time_interleaved({"copy": copy}, rounds=1, calls=20, device=device, warmup=3)["copy"])
    return 2 * nbytes / (ms * 1e-3)
