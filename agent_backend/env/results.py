"""Plain-data results of the environment: the verdict on one candidate, and the time limits.

Only these cross from the workers to the caller, as JSON, so nothing a candidate writes can
reach the calling process as code.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

STATUSES = ("compile_error", "runtime_error", "crash", "timeout", "incorrect", "rejected", "passed")


@dataclass(frozen=True)
class Timeouts:
    """Wall-clock limits per phase, enforced by the calling process (a worker that runs past one
    is killed and restarted). `compile_s` covers executing the candidate's source and building
    ModelNew, and also the one-off Inductor compile of a task's reference in a worker;
    `start_s` covers a worker's start-up (importing torch, creating the CUDA context, and on a
    GPU building the launch op where the cache root has none yet: 15-30 s, once)."""

    compile_s: float = 120.0
    verify_s: float = 60.0
    profile_s: float = 120.0
    start_s: float = 180.0


@dataclass
class Evaluation:
    """The verdict on one candidate. Only status == "passed" means correct; `profile` is set
    only for a passed candidate evaluated with profiling, and `profile["wins"]` says whether it
    beat Inductor by more than `profile["min_speedup"]`. `phase_s` holds the caller's wall time
    per worker request ("prepare", "load", "verify", "profile"), less any wait for the worker to
    start, which is split into the parts the worker timed ("worker_start:torch", ":cuda_context",
    ":launch_op", ":sleep_calibration") and the rest ("worker_start:process": its process's start
    and imports). The phases add up to the caller's time in requests."""

    status: str
    reason: str = ""
    compile_s: float | None = None
    verification: dict = field(default_factory=dict)
    profile: dict | None = None
    worker_restarted: bool = False
    device: str = ""
    phase_s: dict = field(default_factory=dict)

    def __post_init__(self):
        if self.status not in STATUSES:
            raise ValueError(f"unknown status {self.status!r}")

    @property
    def passed(self) -> bool:
        return self.status == "passed"

    @property
    def wins(self) -> bool:
        return self.passed and bool(self.profile and self.profile.get("wins"))

    def verification_record(self) -> dict:
        """What a cache entry keeps of the verification: the verifier's details and the verdict,
        which kernel_cache.Entry.verified reads (without it a searched winner counted as
        unverified: `cache verify` failed it, a bundle merge ranked it below Inductor's entry)."""
        return {**self.verification, "passed": self.passed}

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> "Evaluation":
        return cls(**d)


@dataclass
class ReferenceTiming:
    """Inductor's reference for a task timed alone, as candidates are timed against it, and the
    floors (gate.Floors JSON) of the GPU it ran on: None where they were not asked for or are
    not measured there (`floors_note` says why). `inductor_ms` holds the profiler's stats
    (median, p10, p90, trials, host_median); None unless status is "passed". `copy_ms`: the
    same stats of the copy timed beside it, where one was asked for and the GPU timed it."""

    status: str
    reason: str = ""
    inductor_ms: dict | None = None
    copy_ms: dict | None = None
    floors: dict | None = None
    floors_note: str = ""
    device: str = ""
    phase_s: dict = field(default_factory=dict)

    def __post_init__(self):
        if self.status not in STATUSES:
            raise ValueError(f"unknown status {self.status!r}")


@dataclass(frozen=True)
class ContextTiming:
    """A whole graph timed as Inductor compiles it and with our winners in it (in_context.py):
    each the longer of GPU and host time per call (counted_ms), in ms; or why there are no
    times (`status` other than "passed")."""

    status: str
    reason: str = ""
    ours_ms: float | None = None
    inductor_ms: float | None = None
    device: str = ""
    ours_gpu_ms: float | None = None  # GPU time alone (the medians counted_ms took the longer of)
    inductor_gpu_ms: float | None = None
    ours_host_ms: float | None = None  # and host time alone (the worker's, not the user's process's)
    inductor_host_ms: float | None = None
    flush: str | None = None  # the L2 flush the times are from: the one less favourable to ours (profile.py)

    def __post_init__(self):
        if self.status not in STATUSES:
            raise ValueError(f"unknown status {self.status!r}")

    @property
    def speedup(self) -> float | None:
        """Inductor's time for the graph over ours."""
        if self.ours_ms is None or self.inductor_ms is None:
            return None
        return self.inductor_ms / max(self.ours_ms, 1e-9)

    @property
    def gpu_speedup(self) -> float | None:
        """Inductor's GPU time for the graph over ours."""
        if self.ours_gpu_ms is None or self.inductor_gpu_ms is None:
            return None
        return self.inductor_gpu_ms / max(self.ours_gpu_ms, 1e-9)


def counted_ms(stats: dict) -> float:
    """What a call costs in a model, from a profile's timing stats: its GPU time, or its host
    time where that is longer (a launch-bound kernel keeps the GPU waiting)."""
    return max(stats["median"], stats["host_median"])


def needs_context(profile: dict) -> bool:
    """A candidate faster than Inductor on the GPU whose launch takes longer than it runs: alone
    it keeps the GPU waiting, but in a graph whose GPU work outlasts the host's launches its host
    time is hidden. Only its whole graph, timed with and without it (the in-context check),
    can say which; it runs nowhere without that verdict."""
    return bool(profile.get("gpu_wins") and profile.get("launch_bound") and not profile.get("wins"))


# The user's numerics: what the reference, Inductor and the candidate all run under. The
# default is strict fp32: no TF32 in cuBLAS or cuDNN, matmul precision "highest", and no
# reduced-precision reductions inside fp16/bf16 GEMMs.
DEFAULT_PRECISION = {"allow_tf32": False, "allow_cudnn_tf32": False, "matmul_precision": "highest",
                     "allow_reduced_precision": False}
MATMUL_PRECISIONS = ("highest", "high", "medium")

# Post-grad ATen ops (overload dropped) whose fp32 numerics each switch may reduce.
_MATMUL_OPS = frozenset({"mm", "addmm", "bmm", "baddbmm", "addbmm", "mv", "addmv", "dot", "vdot", "matmul",
                         "_scaled_dot_product_efficient_attention", "_scaled_dot_product_flash_attention",
                         "_scaled_dot_product_cudnn_attention"})
_CONV_OPS = frozenset({"convolution", "_convolution", "convolution_backward", "cudnn_convolution",
                       "cudnn_convolution_transpose"})


def precision_settings(precision: dict | None) -> dict:
    """`precision` completed with the defaults, and checked."""
    unknown = set(precision or {}) - set(DEFAULT_PRECISION)
    if unknown:
        raise ValueError(f"unknown precision settings {sorted(unknown)}; known: {sorted(DEFAULT_PRECISION)}")
    settings = {**DEFAULT_PRECISION, **(precision or {})}
    if settings["matmul_precision"] not in MATMUL_PRECISIONS:
        raise ValueError(f"matmul_precision must be one of {MATMUL_PRECISIONS}")
    return settings


def fp32_reduced(precision: dict, ops) -> bool:
    """Whether a task made of `ops` ("aten.mm.default", ...) may compute fp32 in TF32 (or bf16 on
    the CPU) under these settings: only then is its fp32 output checked at a looser tolerance."""
    settings = precision_settings(precision)
    names = {op.split(".")[1] for op in ops if op.startswith("aten.")}
    matmul = settings["allow_tf32"] or settings["matmul_precision"] != "highest"
    return bool((matmul and names & _MATMUL_OPS) or (settings["allow_cudnn_tf32"] and names & _CONV_OPS))


@dataclass(frozen=True)
class Failure:
    """Why a phase in a worker did not pass; `restart` when the worker cannot be trusted or
    used any more (a broken CUDA context, a patched function, a thread left running)."""

    status: str
    reason: str
    restart: bool = False

    def to_json(self) -> dict:
        return asdict(self)

