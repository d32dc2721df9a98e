"""Timing contenders against each other in one process, interleaved, with L2 flushed.

Each round times `calls` calls of every contender in turn (the contender that goes first moves
on by one each round, so none always follows the same neighbour). Each call is timed by the
worker's own timer (agent_backend.env.profile.CudaTimer): the L2 cache is flushed (by writing
it; `--flush read` reads it instead, leaving nothing to write back; `--flush both` alternates the
two by round, as the worker does, and judges ours under the less favourable), a GPU sleep
that outlasts the host's work of launching the call is queued, then come the start event, the
call and the end event. Without that sleep the window caught the host's per-call work whenever
it outlasted the flush (seen on an H100, 2026-11-24: the same Inductor code measured 17 us at p10
and 35-105 us at the median), so ratios of short kernels measured host jitter. The host's time
per call is reported beside (`host_median`): where ours exceeds its GPU time, a model made of
such calls would wait on the host. On the CPU (the dry run) calls are timed with the host clock.
"""
from __future__ import annotations

from typing import Callable

import torch

from agent_backend.env.floors import copy_call
from agent_backend.env.profile import CpuTimer, Timing, cuda_timer_description, make_timer, summarize
from agent_backend.env.verify import sleep_cycles_per_ms


def describe(device: str, flush: str = "write") -> str:
    return cuda_timer_description(flush) if device == "cuda" else CpuTimer.description


def time_interleaved(contenders: dict[str, Callable[[], object]], rounds: int, calls: int, device: str,
                     warmup: int = 2, flush: str = "write") -> dict[str, dict]:
    """name -> the timing stats of its `rounds` x `calls` timed calls (profile.summarize: median,
    p10, p90, trials, host_median; milliseconds; with `flush` "both", the same per flush under
    "by_flush"); `flush`: how the L2 is flushed before each call (profile.TIMER_FLUSHES: "both"
    alternates write and read by round)."""
    dev = torch.device(device)
    timer = make_timer(dev, sleep_cycles_per_ms(dev) if dev.type == "cuda" else 0.0, flush)
    warm = [timer.time_call(fn) for fn in contenders.values() for _ in range(max(warmup, 1))]
    timer.fit_cover(max(t.host_ms for t in warm))
    names = list(contenders)
    samples: dict[str, list[Timing]] = {name: [] for name in names}
    for r in range(rounds):
        timer.begin_round(r)
        for name in names[r % len(names):] + names[:r % len(names)]:
            samples[name] += [timer.time_call(contenders[name]) for _ in range(calls)]
    drain_floor_ms = min(t.drain_ms for timings in samples.values() for t in timings)
    return {name: summarize(timings, drain_floor_ms) for name, timings in samples.items()}


COPY_BYTES = {"cuda": 1 << 30, "cpu": 64 << 20}  # the copy floors are measured with, per device type


def copy_bytes_per_s(device: str) -> float:
    """A large device-to-device copy's rate (COPY_BYTES), counting bytes read plus bytes written
    (the unit a problem's floor_bytes is in): median of 20 copies."""
    nbytes = COPY_BYTES[device]
    copy = copy_call(2 * nbytes, device)  # the gate's copy: a memcpy of nbytes
    ms = time_interleaved({"copy": copy}, rounds=1, calls=20, device=device, warmup=3)["copy"]["median"]
    return 2 * nbytes / (ms * 1e-3)
