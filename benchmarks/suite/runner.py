"""Run one problem in one dtype: eager, Inductor and cuda_agent on the same model and inputs.

Order of work: (a network: compile it small with Inductor, untimed) -> build (seeded) -> eager's
result -> compile ours, then Inductor (each timed on its first call, synchronised, each in a fresh
Inductor/Triton cache directory so that neither reuses kernels the other, or an earlier run,
compiled) -> correctness against eager -> interleaved timing of all three, with our winners' call
counts snapshotted around it.
"""
from __future__ import annotations

import copy
import gc
import time
import traceback
from dataclasses import dataclass
from typing import Callable

import torch
from torch._inductor.utils import fresh_cache

from agent_backend import background, backend
from agent_backend.env.floors import copy_call
from agent_backend.env.profile import gpu_speedups_by_flush

from . import correctness, kernels, timing
from .problem import Problem, build, make_call
from .settle import compile_until_settled

NETWORK_LEVEL = 3  # the suite's level of small networks and transformers


@dataclass(frozen=True)
class RunConfig:
    device: str  # "cuda", or "cpu" for the dry run
    small: bool  # the problems' small sizes
    rounds: int
    calls: int  # timed calls per contender per round
    options: dict  # the cuda_agent backend's options
    copy_bytes_per_s: float  # for floors
    compile_dir: str  # where each compile gets its fresh Inductor and Triton cache
    seed: int = 0
    settle_s: float = 0.0  # > 0: wait up to this long for background work and compile ours again (_settle)
    flush: str = "both"  # how the timer flushes the L2 before each call (agent_backend.env.profile.TIMER_FLUSHES)


def _synchronize(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _first_call(call: Callable[[], list[torch.Tensor]], device: str, compile_dir: str
                ) -> tuple[list[torch.Tensor], float]:
    """The result of the first call and its wall time: the compile, and for ours the search.
    The cache directory is kept (delete=False): compiled code and Inductor's process pools
    may still read from it after the first call."""
    _synchronize(device)
    start = time.perf_counter()
    with fresh_cache(dir=compile_dir, delete=False):
        result = call()
        _synchronize(device)
    return result, time.perf_counter() - start


def _compile_ours(calls: dict, cfg: RunConfig) -> tuple[list[torch.Tensor], float, list]:
    """Our first call (the compile, `_first_call`), and the decisions of the graphs it compiled."""
    seen = len(backend.reports)
    result, seconds = _first_call(calls["ours"], cfg.device, cfg.compile_dir)
    return result, seconds, [d for report in backend.reports[seen:] for d in report.decisions]


def _correctness(ours: list, theirs: list, expected: list, dtype: str, tolerance: float) -> dict:
    ours_check = correctness.compare(ours, expected, dtype, tolerance)
    inductor_check = correctness.compare(theirs, expected, dtype, tolerance)
    ours_check["verdict"] = correctness.verdict(ours_check, inductor_check)
    inductor_check["verdict"] = "ok" if inductor_check["within_tol"] else "MISMATCH"
    return {"ours": ours_check, "inductor": inductor_check}


def _floor_bytes(problem: Problem, inputs: list, outputs: list) -> int | None:
    return None if problem.floor_bytes is None or problem.train else problem.floor_bytes(inputs, outputs)


def _floor(nbytes: int | None, ms: dict, copy: dict | None, copy_bytes_per_s: float) -> dict | None:
    """The problem's bytes at a large copy's rate, and what fraction of it ours and Inductor
    reach; and of a copy of as many bytes timed beside them, which pays what any kernel of that
    size pays under the timer (its launch, the flushed L2's write-back): the floor it can reach."""
    if nbytes is None:
        return None
    floor_ms = nbytes / copy_bytes_per_s * 1e3
    names = ("ours", "inductor")
    return {"bytes": nbytes, "ms": floor_ms, "copy_ms": copy["median"],
            "pct": {name: 100 * floor_ms / ms[name]["median"] for name in names},
            "pct_of_copy": {name: 100 * copy["median"] / ms[name]["median"] for name in names}}


def _warm_up_like(problem: Problem, dtype: str, cfg: RunConfig) -> None:
    """Compile the problem at its small size with Inductor alone, untimed: a process's first
    compile of a network pays one-off costs (Inductor's first lowerings of its ops, its compile
    workers' first builds: 0.7 s for GPT-2 on an H100) that would fall on ours, compiled first."""
    model, inputs = build(problem, dtype, cfg.device, True, cfg.seed)
    fn = torch.compile(model, backend="inductor")
    _first_call(make_call(model, fn, inputs, problem.train), cfg.device, cfg.compile_dir)
    torch._dynamo.reset()


def _measure(problem: Problem, dtype: str, cfg: RunConfig) -> dict:
    if problem.level >= NETWORK_LEVEL:  # single ops compile in about a second, where this is noise
        _warm_up_like(problem, dtype, cfg)
    model, inputs = build(problem, dtype, cfg.device, cfg.small, cfg.seed)
    models = {"ours": copy.deepcopy(model), "inductor": copy.deepcopy(model), "eager": model}
    fns = {"ours": torch.compile(models["ours"], backend="cuda_agent", options=cfg.options),
           "inductor": torch.compile(models["inductor"], backend="inductor"), "eager": model}
    calls = {name: make_call(models[name], fns[name], inputs, problem.train) for name in models}
    expected = calls["eager"]()

    ours, ours_compile_s, decisions = _compile_ours(calls, cfg)
    theirs, inductor_compile_s = _first_call(calls["inductor"], cfg.device, cfg.compile_dir)
    compile_s = {"ours": ours_compile_s, "inductor": inductor_compile_s}
    if cfg.settle_s:
        ours, theirs, decisions, settled = _settle(calls, cfg)
        compile_s |= settled
    checks = _correctness(ours, theirs, expected, dtype, problem.tolerance)
    del ours, theirs

    floor_bytes = _floor_bytes(problem, inputs, expected)
    same_bytes = {"copy": copy_call(floor_bytes, cfg.device)} if floor_bytes is not None else {}
    before = kernels.winner_calls()
    ms = timing.time_interleaved(calls | same_bytes, cfg.rounds, cfg.calls, cfg.device, flush=cfg.flush)
    after = kernels.winner_calls()
    copy_ms = ms.pop("copy", None)
    return {"sizes": dict(vars(problem.sizes(cfg.small))), "ms": ms, **_vs_inductor(ms["ours"], ms["inductor"]),
            "vs_eager": ms["eager"]["median"] / ms["ours"]["median"],
            "compile_s": compile_s, "correct": checks,
            "kernels": kernels.kernels_run(before, after, decisions), "subgraphs": kernels.subgraph_summary(decisions),
            "floor": _floor(floor_bytes, ms, copy_ms, cfg.copy_bytes_per_s)}


def _vs_inductor(ours: dict, inductor: dict) -> dict:
    """Inductor's GPU time over ours ("vs_inductor"); timed after both flushes, the lesser of the
    two flushes' ratios (the worker judges a candidate so, by counted time), each beside it."""
    ratios = gpu_speedups_by_flush(ours, inductor)
    if not ratios:
        return {"vs_inductor": inductor["median"] / ours["median"]}
    return {"vs_inductor": min(ratios.values()), "vs_inductor_by_flush": ratios}


def _settle(calls: dict, cfg: RunConfig) -> tuple[list, list, list, dict]:
    """Ours compiled again once the background work settles (settle.compile_until_settled, up to
    cfg.settle_s a wait), then Inductor again (fresh cache directory) as the baseline for the last
    one. Returns the last outputs and decisions of ours, Inductor's, and the compile times."""
    later = compile_until_settled(lambda: _compile_ours(calls, cfg), cfg.settle_s)
    ours, _, decisions = later[-1]
    theirs, inductor_s = _first_call(calls["inductor"], cfg.device, cfg.compile_dir)
    return ours, theirs, decisions, {"ours_later": [seconds for _, seconds, _ in later],
                                     "inductor_again": inductor_s, "pending_at_timing": background.pending()}


class _AddOne(torch.nn.Module):
    def forward(self, x):
        return x + 1


def warm_up(cfg: RunConfig) -> dict[str, float]:
    """Compile a one-op model with each backend, so that the one-off costs of a process's first
    compile (imports, Inductor's set-up) are not charged to the first problem; their seconds.
    One op is below the backend's smallest subgraph, so nothing is searched here."""
    x = torch.ones(8, device=cfg.device)
    seconds = {}
    for name, backend_name, options in (("ours", "cuda_agent", cfg.options), ("inductor", "inductor", None)):
        fn = torch.compile(_AddOne(), backend=backend_name, options=options)
        _, seconds[name] = _first_call(lambda: fn(x), cfg.device, cfg.compile_dir)
    torch._dynamo.reset()
    return seconds


def run_problem(problem: Problem, dtype: str, cfg: RunConfig) -> dict:
    """The problem's row: status "ok" with its measurements, "skipped" with why, or "error" with
    what went wrong (the suite goes on either way)."""
    row = {"problem": problem.name, "level": problem.level, "group": problem.group, "dtype": dtype,
           "mode": "train" if problem.train else "inference"}
    missing = problem.missing()
    if missing:
        return row | {"status": "skipped",
                      "reason": f"{', '.join(missing)} is not installed (pip install {' '.join(missing)})"}
    torch._dynamo.reset()
    try:
        return row | _measure(problem, dtype, cfg) | {"status": "ok"}
    except Exception as e:  # noqa: BLE001  one broken problem must not end the run
        return row | {"status": "error", "error": f"{type(e).__name__}: {e}"[:2000],
                      "traceback": traceback.format_exc()[-4000:]}
    finally:
        torch._dynamo.reset()
        gc.collect()
        if cfg.device == "cuda":
            torch.cuda.empty_cache()
