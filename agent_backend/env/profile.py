"""Timing a verified candidate against Inductor and eager, in the same worker, on the same
input sets, under the same precision settings. The candidate is called the way a compiled graph
would call it as a winner (runtime.as_called_by_a_graph): through the C++ launch op for a launch
spec, else through run_winner around its ModelNew, so its host time is what a user pays per call
(the profile's "dispatch" names the op).

Contenders are timed in interleaved rounds (each round calls every contender once, in a
rotating order, on the next of several input sets), after a warm-up, for an adaptive number of
trials (about TARGET_TIMED_S of wall time per contender, at least MIN_TRIALS). Only timing
primitives captured before any candidate ran are used.

On CUDA each call is timed by events on the current stream: the L2 cache is flushed, a GPU
sleep is queued that outlasts the host's work of launching the call, then come the start
event, the call and the end event; then a device-wide synchronize and a "drained" event. The
sleep keeps host overhead out of the window: torch.compile's per-call wrappers (guards,
AOTAutograd) would otherwise count against Inductor, although in a compiled model they are paid
once per graph, not per subgraph. end -> drained is the synchronize's latency plus any work the
call left on other streams; its minimum over all calls of all contenders is the latency alone,
so a call's time is start -> end plus its own end -> drained less that minimum: never less than
its work on the current stream, and work on other streams counts. The host time of each call
is reported beside it (`host_median`), for candidates bound by launch overhead.

On the CPU, times are host times and include those wrappers, so a CPU profile never wins.

After timing, the candidate is checked once more, on the last timed input tensors with new
values, so a candidate that behaves only while being verified, or that replays cached results
when inputs repeat, is caught; one call's output from before that check is kept alive, so is one
that starts returning a buffer it keeps once timed.
"""
from __future__ import annotations

import math
import statistics
from typing import Any, Callable, NamedTuple

import torch

from agent_backend.env.guards import REAL, StateWatch
from agent_backend.env.results import Failure, counted_ms
from agent_backend.env.verify import InputDraw, Verifier

TARGET_TIMED_S = 0.3
MIN_TRIALS = 20
MAX_TRIALS = 500
WARMUP_CALLS = 3
INPUT_SETS = 4
_POST_CHECK_DRAW = InputDraw(1.0, 0.25)
_FALLBACK_FLUSH_BYTES = 256 * 2**20
_WARMUP_COVER_MS = 1.0
# Longer host work than this is not launch overhead (the call waits for the GPU, or works on
# the host): it then shows in the window, as it should.
_MAX_COVER_MS = 5.0


class Timing(NamedTuple):
    ms: float  # on CUDA: start -> end
    host_ms: float  # the host's time inside the call
    drain_ms: float = 0.0  # on CUDA: end -> drained
    flush: str = ""  # on CUDA: how the L2 was flushed before the call (FLUSHES)


# How the L2 is flushed before each timed call: "write" zeroes twice its size, leaving it full of
# dirty lines that the call then pays to write back (the worker's timer: as triton's do_bench);
# "read" sums twice its size instead, so the call starts with a cold L2 and nothing to write back,
# as a kernel does that follows kernels writing little. Kernels pay that write-back differently:
# on an H200 a 117 MB bf16 product read took cuBLAS 7.6 us longer after a write flush than back
# to back, a tensor-core kernel of ours 4.4 us (benchmarks/results/skinny_clean-h200-...).
# "both" alternates the two by round (the worker's timer): a candidate is judged under the one
# where it fares worse against Inductor (less_favourable_flush), so neither L2 state's favour makes
# a win: a kernel of that skinny template ran 1.10x cuBLAS after a write flush, 0.97x after a read.
FLUSHES = ("write", "read")
TIMER_FLUSHES = FLUSHES + ("both",)


class CudaTimer:
    wins_allowed = True

    def __init__(self, device: torch.device, cycles_per_ms: float, flush: str = "both"):
        if flush not in TIMER_FLUSHES:
            raise ValueError(f"flush must be one of {TIMER_FLUSHES}, not {flush!r}")
        self.stream = torch.cuda.current_stream(device)
        l2_bytes = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0)
        flush_bytes = 2 * l2_bytes if l2_bytes else _FALLBACK_FLUSH_BYTES
        self.flush_buffer = torch.zeros(flush_bytes // 4, dtype=torch.int32, device=device)
        self.flush_sum = torch.empty((), dtype=torch.int64, device=device)
        self.flushes = FLUSHES if flush == "both" else (flush,)
        self.flush = self.flushes[0]
        self.description = cuda_timer_description(flush)
        self.start, self.end, self.drained = (REAL.cuda_event_type(enable_timing=True) for _ in range(3))
        self.cycles_per_ms = cycles_per_ms
        self.cover_ms = _WARMUP_COVER_MS

    def fit_cover(self, host_ms: float) -> None:
        """Fix the sleep before the start event for the timed calls, from the longest host time
        of a warmed-up call: every contender is timed behind the same one."""
        self.cover_ms = min(_MAX_COVER_MS, 1.5 * host_ms + 0.02)

    def begin_round(self, index: int) -> None:
        """The flush of the timed calls of round `index` (every contender's call alike)."""
        self.flush = self.flushes[index % len(self.flushes)]

    def time_call(self, call: Callable[[], Any]) -> Timing:
        if self.flush == "write":
            REAL.zero_(self.flush_buffer)
        else:
            REAL.sum(self.flush_buffer, dim=0, out=self.flush_sum)
        REAL.cuda_sleep(int(self.cover_ms * self.cycles_per_ms))
        REAL.event_record(self.start, self.stream)
        host_start = REAL.perf_counter_ns()
        result = call()
        host_ms = (REAL.perf_counter_ns() - host_start) / 1e6
        REAL.event_record(self.end, self.stream)
        REAL.cuda_synchronize()
        REAL.event_record(self.drained, self.stream)
        REAL.cuda_synchronize()
        del result
        return Timing(REAL.event_elapsed_time(self.start, self.end), host_ms,
                      REAL.event_elapsed_time(self.end, self.drained), self.flush)


class CpuTimer:
    description = "time.perf_counter_ns around each call (host time, wrappers included: never a win)"
    wins_allowed = False

    def fit_cover(self, host_ms: float) -> None:
        pass  # nothing to hide on the CPU: host time is the time

    def begin_round(self, index: int) -> None:
        pass  # no cache to flush

    def time_call(self, call: Callable[[], Any]) -> Timing:
        start = REAL.perf_counter_ns()
        call()
        ms = (REAL.perf_counter_ns() - start) / 1e6
        return Timing(ms, ms)


def cuda_timer_description(flush: str) -> str:
    how = {"write": "by writing (dirty)", "read": "by reading (clean)",
           "both": "by writing (dirty) and by reading (clean) in alternate rounds"}[flush]
    return (f"CUDA events; L2 flushed {how} and the host's launch time hidden before each call; "
            "device-wide synchronize before the end event")


def make_timer(device: torch.device, cycles_per_ms: float, flush: str = "both") -> CudaTimer | CpuTimer:
    """A timer for one profile."""
    return CudaTimer(device, cycles_per_ms, flush) if device.type == "cuda" else CpuTimer()


def summarize(timings: list[Timing], drain_floor_ms: float) -> dict:
    """Median, p10, p90, trials and host_median of `timings`; where they were flushed more than one
    way, "by_flush" holds the same for each flush's own calls."""
    times = [t.ms + t.drain_ms - drain_floor_ms for t in timings]
    deciles = statistics.quantiles(times, n=10, method="inclusive")
    stats = {"median": statistics.median(times), "p10": deciles[0], "p90": deciles[-1], "trials": len(times),
             "host_median": statistics.median(t.host_ms for t in timings)}
    flushes = list(dict.fromkeys(t.flush for t in timings))
    if len(flushes) > 1:
        stats["by_flush"] = {f: summarize([t for t in timings if t.flush == f], drain_floor_ms) for f in flushes}
    return stats


class _RuleBroken(Exception):
    def __init__(self, failure: Failure):
        super().__init__(failure.reason)
        self.failure = failure


def measure(contenders: dict[str, Callable[..., Any]], input_sets: list[list[torch.Tensor]],
            timer: CudaTimer | CpuTimer, after_call: Callable[[str], Failure | None]) -> tuple[dict, int]:
    """Timings per contender, and the index of the input set timed last."""
    names = list(contenders)
    warm = {}  # the last warm-up call of each contender
    for name in names:
        for _ in range(WARMUP_CALLS):
            warm[name] = timer.time_call(lambda: contenders[name](*input_sets[0]))
    timer.fit_cover(max(t.host_ms for t in warm.values()))
    wall_ms = []
    for name in names:
        start = REAL.perf_counter_ns()
        timer.time_call(lambda: contenders[name](*input_sets[0]))
        wall_ms.append((REAL.perf_counter_ns() - start) / 1e6)
    trials = min(MAX_TRIALS, max(MIN_TRIALS, math.ceil(TARGET_TIMED_S * 1e3 / max(wall_ms))))
    timings: dict[str, list[Timing]] = {name: [] for name in names}
    for trial in range(trials):
        # each flush in turn for as many rounds as there are contenders: each sees every order
        timer.begin_round(trial // len(names))
        inputs = input_sets[trial % len(input_sets)]
        shift = trial % len(names)
        for name in names[shift:] + names[:shift]:
            timings[name].append(timer.time_call(lambda: contenders[name](*inputs)))
            failure = after_call(name)
            if failure:
                raise _RuleBroken(failure)
    return timings, (trials - 1) % len(input_sets)


def time_contenders(contenders: dict[str, Callable[..., Any]], input_sets: list[list[torch.Tensor]],
                    timer: CudaTimer | CpuTimer,
                    after_call: Callable[[str], Failure | None] = lambda name: None) -> tuple[dict, int]:
    """Timing stats per contender (`summarize`), and the index of the input set timed last."""
    timings, last_set = measure(contenders, input_sets, timer, after_call)
    drain_floor_ms = min(t.drain_ms for contender in timings.values() for t in contender)
    return {name: summarize(t, drain_floor_ms) for name, t in timings.items()}, last_set


def counted_speedup(ours: dict, inductor: dict | None) -> float | None:
    """The speedup a win is judged on: Inductor's GPU time over ours, where ours is the longer of
    our GPU time and our host time per call. A kernel whose launch takes longer than it runs
    keeps the GPU waiting in a real model, so its GPU time alone would promise a false speedup."""
    if inductor is None:
        return None
    return inductor["median"] / max(counted_ms(ours), 1e-9)


def less_favourable_flush(ours: dict, inductor: dict) -> tuple[dict, dict, str | None]:
    """Our stats and Inductor's under the L2 flush where ours fares worse against Inductor's
    (counted_speedup), and that flush's name; the stats as they are where they were timed one way."""
    if "by_flush" not in ours or "by_flush" not in inductor:
        return ours, inductor, None
    flush = min(ours["by_flush"], key=lambda f: counted_speedup(ours["by_flush"][f], inductor["by_flush"][f]))
    return ours["by_flush"][flush], inductor["by_flush"][flush], flush


def gpu_speedups_by_flush(ours: dict, inductor: dict) -> dict[str, float]:
    """Inductor's GPU median over ours after each kind of L2 flush both were timed after; {}
    where they were timed one way."""
    if "by_flush" not in ours or "by_flush" not in inductor:
        return {}
    return {f: inductor["by_flush"][f]["median"] / max(stats["median"], 1e-9) for f, stats in ours["by_flush"].items()}


def profile_candidate(verifier: Verifier, contenders: dict[str, Callable[..., Any]],
                      input_sets: list[list[torch.Tensor]], timer: CudaTimer | CpuTimer, watch: StateWatch,
                      min_speedup: float, note: str | None = None) -> tuple[dict | None, Failure | None]:
    """`contenders` holds "ours" and "eager", and "inductor" where Inductor compiled the task
    (else `note` says why not). Returns the profile, or the rule the candidate broke."""

    def after_call(name: str) -> Failure | None:
        return watch.settings_changed("forward, while timed") if name == "ours" else None

    try:
        stats, last_set = time_contenders(contenders, input_sets, timer, after_call)
    except _RuleBroken as broken:
        return None, broken.failure
    # Timed calls' outputs are dropped as they come: one more call's is kept, so that a buffer
    # reused once timing began (an allocation saved) shows in the check's call.
    verifier.keep_returned(contenders["ours"](*input_sets[last_set]))
    failure = watch.violation("forward, while timed") or verifier.trial(_POST_CHECK_DRAW, input_sets[last_set])
    if failure:
        return None, Failure(failure.status, f"after timing: {failure.reason}", failure.restart)
    ours = max(stats["ours"]["median"], 1e-9)
    inductor = stats.get("inductor")
    speedup_vs_inductor = counted = judged_flush = None
    if inductor:  # under the flush less favourable to ours
        judged, inductor_judged, judged_flush = less_favourable_flush(stats["ours"], inductor)
        speedup_vs_inductor = inductor_judged["median"] / max(judged["median"], 1e-9)
        counted = counted_speedup(judged, inductor_judged)
    profile = {
        "ours_ms": stats["ours"],
        "inductor_ms": inductor,
        "eager_ms": stats["eager"],
        "speedup_vs_inductor": speedup_vs_inductor,
        "speedup_vs_eager": stats["eager"]["median"] / ours,
        "launch_bound": stats["ours"]["host_median"] > stats["ours"]["median"],
        "counted_speedup": counted,
        "min_speedup": min_speedup,
        "wins": timer.wins_allowed and counted is not None and counted > min_speedup,
        "gpu_wins": timer.wins_allowed and speedup_vs_inductor is not None and speedup_vs_inductor > min_speedup,
        "timer": timer.description,
        "judged_flush": judged_flush,
        "input_sets": len(input_sets),
    }
    if note:
        profile["note"] = note
    return profile, None
