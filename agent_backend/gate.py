"""The gate before a search: no kernel can run faster than its task's floor, so where Inductor
already runs within `min_speedup` of that floor, no candidate can win and the search is skipped.

A task's floor (`Floor`) is the GPU time of any kernel for it, or the host time of a launch,
whichever is longer. The GPU time is a launch's fixed cost plus the longer of:
- memory: the bytes its inputs and outputs occupy (each storage once) over the GPU's measured
  copy rate;
- compute: the FLOPs of its matmuls and convolutions over the GPU's measured peak at the
  fastest precision the user's settings allow each one; left out where a known rewrite applies
  (a rewrite can remove work, as a GEMM summed over N becomes a GEMV).
The launch (the GPU time of the smallest kernel, timed as the profiler times calls) adds to the
transfer where the transfer is small and hides behind it where it is large: on an H100
(2026-11-25, the profiler's timing) the smallest kernel took 3.6 us, a copy moving 25 MB 12.8 us
(8.4 us at the copy rate + 4.4), one moving 134 MB 45.9 us (+1.0) and 268 MB 90.3 us (+0.5). The
floor adds `launch * min(1, (L2 / 2) / bytes)`, which stays under each of those. Taking the
longer of the two instead put a small task's floor at its bytes alone, far below what any
kernel reaches, and the gate searched every small pointwise task of a training step for nothing.
Where the gate timed a copy moving the task's bytes beside Inductor's kernel (search.gate_task,
interleaved in the worker: same clocks, same fixed costs), that copy's time, its launch included,
is the memory part instead of the model above: Inductor's ratio to a floor from the machine's
floors moved by about 10% from one H100 to another (2026-11-25), enough to cross the bar.
The host bound is the host time of the cheapest launch (a win is judged on the longer of a
kernel's GPU and host time, env/profile.py counted_speedup).

The judgement (`judge`): a kernel that runs at `floor * (1 + slack)` at best beats Inductor by
`inductor / (floor * (1 + slack))`; when that is not above `min_speedup`, the search is skipped.
`slack` is how far above the floor the best kernels are taken to stay (option gate_slack, 0.10:
on an H100 our best pointwise kernel, a bf16 GELU that beat Inductor by 1.09-1.10x, ran at 1.10x
its floor).

Plain arithmetic over task descriptions and measured numbers: no GPU, no files.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Iterable

import torch
import torch.fx as fx
from torch.utils._pytree import tree_map
from torch.utils.flop_counter import flop_registry

from .specs import Task, TensorSpec, dtype_from_name

PRECISIONS = ("fp32", "tf32", "bf16", "fp16")  # the peaks a GPU's floors hold


@dataclass(frozen=True)
class Floors:
    """What one GPU can do at best, measured once per machine (env/floors.py)."""

    copy_gbps: float  # bytes read plus bytes written per second of a large device-to-device copy, / 1e9
    launch_ms: float  # GPU time of the smallest kernel
    host_ms: float  # host time of the cheapest kernel launch
    peak_tflops: dict = field(default_factory=dict)  # precision in PRECISIONS -> TFLOP/s of a large matmul
    l2_bytes: int = 0  # the L2 cache's size (0: unknown, and then no launch adds to a transfer)

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> "Floors":
        return cls(float(d["copy_gbps"]), float(d["launch_ms"]), float(d["host_ms"]),
                   {k: float(v) for k, v in d["peak_tflops"].items()}, int(d["l2_bytes"]))


@dataclass(frozen=True)
class Work:
    """One matmul or convolution of a task: its FLOPs and the precisions it may run at."""

    op: str
    flops: float
    precisions: tuple[str, ...]  # empty: no measured peak applies (fp64, say)


@dataclass(frozen=True)
class Floor:
    memory_ms: float
    compute_ms: float
    launch_ms: float  # the smallest kernel's GPU time
    host_ms: float
    note: str = ""  # why a bound was left out
    launch_share: float = 1.0  # the part of the launch that adds to the transfer (the module's doc)

    @property
    def gpu_ms(self) -> float:
        return max(self.launch_ms, self.launch_ms * self.launch_share + max(self.memory_ms, self.compute_ms))

    @property
    def ms(self) -> float:
        return max(self.gpu_ms, self.host_ms)

    @property
    def bound(self) -> str:
        """What sets the floor: "host", else the largest part of the GPU time ("memory",
        "compute" or "launch")."""
        if self.host_ms > self.gpu_ms:
            return "host"
        parts = {"memory": self.memory_ms, "compute": self.compute_ms, "launch": self.launch_ms * self.launch_share}
        return max(parts, key=parts.get)


@dataclass(frozen=True)
class Verdict:
    """The gate's decision on one task, with the numbers it was made from."""

    skip: bool
    inductor_ms: float
    floor: Floor
    min_speedup: float
    slack: float

    @property
    def ratio(self) -> float:
        """Inductor's time over the floor: the speedup a kernel at the floor would have."""
        return self.inductor_ms / max(self.floor.ms, 1e-12)

    @property
    def threshold(self) -> float:
        return self.min_speedup * (1.0 + self.slack)

    @property
    def margin(self) -> float:
        """How far Inductor is above the floor (0.10: 10% slower than a kernel at the floor)."""
        return self.ratio - 1.0

    def reason(self) -> str:
        what = "Inductor at floor" if self.skip else "room above the floor"
        return (f"{what}: Inductor {self.inductor_ms:.4f} ms, floor {self.floor.ms:.4f} ms ({self.floor.bound}), "
                f"margin {self.margin:.1%}; a kernel at the floor would be {self.ratio:.3f}x, the bar is "
                f"{self.threshold:.3f}x (min_speedup {self.min_speedup:g}, slack {self.slack:g})")

    def to_json(self) -> dict:
        return {"skipped": self.skip, "inductor_ms": self.inductor_ms, "floor_ms": self.floor.ms,
                "bound": self.floor.bound, "floor": asdict(self.floor), "ratio": self.ratio, "margin": self.margin,
                "threshold": self.threshold, "min_speedup": self.min_speedup, "slack": self.slack}


def judge(inductor_ms: float, floor: Floor, min_speedup: float, slack: float) -> Verdict:
    """Skip the search when a kernel at `floor * (1 + slack)` would not beat Inductor by more
    than `min_speedup`, the bar a winner must pass."""
    skip = inductor_ms <= floor.ms * min_speedup * (1.0 + slack)
    return Verdict(skip, inductor_ms, floor, min_speedup, slack)


def still_skips(recorded: dict, min_speedup: float, slack: float) -> bool:
    """Whether a recorded verdict (Verdict.to_json) skips the search under today's bar."""
    return bool(recorded.get("skipped")) and recorded["inductor_ms"] <= recorded["floor_ms"] * min_speedup * (1.0 + slack)


# -- bytes ----------------------------------------------------------------------------------------

def tensor_bytes(spec: TensorSpec) -> int:
    """Bytes a kernel must touch for one tensor at least: its distinct elements (a broadcast
    input, stride 0, is read once; a view with gaps is read without them)."""
    numel = math.prod(spec.shape)
    return min(numel, spec.storage_elements()) * dtype_from_name(spec.dtype).itemsize


def moved_bytes(tensors: Iterable[tuple[object, TensorSpec]]) -> int:
    """(storage, spec) pairs -> bytes moved at least: each storage once, as its largest tensor."""
    per_storage: dict[object, int] = {}
    for storage, spec in tensors:
        per_storage[storage] = max(per_storage.get(storage, 0), tensor_bytes(spec))
    return sum(per_storage.values())


def _storage(node: fx.Node) -> object:
    from torch.multiprocessing.reductions import StorageWeakRef
    val = node.meta.get("val")
    return StorageWeakRef(val.untyped_storage()).cdata if isinstance(val, torch.Tensor) else node


def task_bytes(task: Task) -> int:
    """Bytes of the task's inputs and outputs, each storage once. Storages are known from the
    task's graph (a transposed view and its base are one storage); a task read from a cache has
    no graph, and then each tensor counts as its own storage."""
    specs = list(task.inputs) + list(task.outputs)
    if task.graph_module is None:
        return moved_bytes(enumerate(specs))
    graph = task.graph_module.graph
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    (output,) = [n for n in graph.nodes if n.op == "output"]
    nodes = placeholders + list(output.args[0])
    return moved_bytes((_storage(n), spec) for n, spec in zip(nodes, specs))


# -- FLOPs ----------------------------------------------------------------------------------------

def allowed_precisions(dtype: str, conv: bool, precision: dict) -> tuple[str, ...]:
    """The precisions a kernel may compute one matmul (or convolution) of `dtype` at, under the
    user's settings (dispatch.user_precision): what the verifier lets a candidate use."""
    if dtype == "bfloat16":
        return ("bf16",)
    if dtype == "float16":
        return ("fp16",)
    if dtype != "float32":
        return ()
    allowed = ["fp32"]
    if conv:
        tf32 = precision.get("allow_cudnn_tf32", False)
    else:
        tf32 = precision.get("allow_tf32", False) or precision.get("matmul_precision", "highest") != "highest"
    if tf32 or precision.get("allow_reduced_precision", False):
        allowed.append("tf32")
    if precision.get("allow_reduced_precision", False) or precision.get("matmul_precision") == "medium":
        allowed.append("bf16")
    return tuple(allowed)


def _value(a):
    return a.meta.get("val") if isinstance(a, fx.Node) else a


def task_work(task: Task, precision: dict) -> list[Work]:
    """The task's matmuls, convolutions and attention calls with their FLOPs (torch's own
    formulas, torch.utils.flop_counter), from the task's graph; none for a task without one."""
    if task.graph_module is None:
        return []
    work = []
    for node in task.graph_module.graph.nodes:
        packet = getattr(node.target, "overloadpacket", None)
        if node.op != "call_function" or packet not in flop_registry:
            continue
        args, kwargs = tree_map(_value, (node.args, node.kwargs))
        flops = flop_registry[packet](*args, **kwargs, out_val=node.meta.get("val"))
        first = next(a for a in args if isinstance(a, torch.Tensor))
        conv = "conv" in packet.__name__
        work.append(Work(str(node.target), float(flops),
                         allowed_precisions(str(first.dtype).removeprefix("torch."), conv, precision)))
    return work


# -- the floor ------------------------------------------------------------------------------------

def task_floor(moved: int, work: list[Work], floors: Floors, *, rewritable: bool,
               copy_ms: float | None = None) -> Floor:
    """The floor of a task that moves `moved` bytes and does `work`, on a GPU with `floors`.
    `rewritable`: a known rewrite applies, which may remove work, so FLOPs set no floor.
    `copy_ms`: a copy moving `moved` bytes, timed beside Inductor's kernel; where given, it is
    the memory part (its launch included, so no launch adds) in place of the L2-knee model."""
    memory_ms = copy_ms if copy_ms is not None else moved / (floors.copy_gbps * 1e9) * 1e3
    compute_ms, notes = 0.0, ["memory: a copy of the same bytes, timed beside Inductor"] if copy_ms is not None else []
    if rewritable and work:
        notes.append("a rewrite applies: FLOPs set no floor")
    else:
        for w in work:
            peaks = [floors.peak_tflops[p] for p in w.precisions if floors.peak_tflops.get(p)]
            if not peaks:
                notes.append(f"no measured peak for {w.op}")
                continue
            compute_ms += w.flops / (max(peaks) * 1e12) * 1e3
    hidden_above = floors.l2_bytes / 2  # bytes past which the launch starts to hide (the module's doc)
    launch_share = 0.0 if copy_ms is not None else min(1.0, hidden_above / moved) if moved else 1.0
    return Floor(memory_ms, compute_ms, floors.launch_ms, floors.host_ms, "; ".join(notes), launch_share)
