"""The gate before a search: no kernel can run faster than its task's floor, so where Inductor
already runs within `min_speedup` of that floor, no candidate can win and the search is skipped.

A task's floor (`Floor`) is the GPU time of any kernel for it, or the host time of a launch,
whichever is longer. The GPU time is the longer of:
- memory: a copy (a memcpy) moving as many bytes as the task's inputs and outputs occupy (each
  storage once), timed interleaved with Inductor's kernel in the worker (search.gate_task), its
  launch included. A floor modelled from the machine's copy rate and launch time instead put
  Inductor's ratio about 10% apart on two H100s (2026-11-25), enough to cross the bar; the
  copy sees the same clocks and fixed costs as Inductor's kernel.
- compute: the FLOPs of its matmuls and convolutions over the GPU's measured peak at the
  fastest precision the user's settings allow each one; left out where a known rewrite applies
  (a rewrite can remove work, as a GEMM summed over N becomes a GEMV).
The host bound is the host time of the cheapest launch (a win is judged on the longer of a
kernel's GPU and host time, env/profile.py counted_speedup).

The copy is not a strict bound: on GPT-2's bf16 training step (H100, 2026-11-25) Inductor ran
some tasks up to 18% faster than the copy of their bytes (15.6 us against 19.1 us); no kernel of
ours had beaten Inductor by 5% on any of them in a full search.

The judgement (`judge`): a kernel that runs at `floor * (1 + slack)` at best beats Inductor by
`inductor / (floor * (1 + slack))`; when that is not above `min_speedup`, the search is skipped.
`slack` is how far above the floor the best kernels are taken to stay (option gate_slack, 0.03:
on an H100 our best pointwise kernel, a bf16 GELU that beat Inductor by 1.11x, ran at 1.02x the
copy of its bytes).

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

    host_ms: float  # host time of the cheapest kernel launch
    peak_tflops: dict = field(default_factory=dict)  # precision in PRECISIONS -> TFLOP/s of a large matmul

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> "Floors":
        return cls(float(d["host_ms"]), {k: float(v) for k, v in d["peak_tflops"].items()})


@dataclass(frozen=True)
class Work:
    """One matmul or convolution of a task: its FLOPs and the precisions it may run at."""

    op: str
    flops: float
    precisions: tuple[str, ...]  # empty: no measured peak applies (fp64, say)


@dataclass(frozen=True)
class Floor:
    memory_ms: float  # a copy of the task's bytes, timed beside Inductor's kernel, its launch included
    compute_ms: float
    host_ms: float
    note: str = ""  # why a bound was left out

    @property
    def gpu_ms(self) -> float:
        return max(self.memory_ms, self.compute_ms)

    @property
    def ms(self) -> float:
        return max(self.gpu_ms, self.host_ms)

    @property
    def bound(self) -> str:
        """What sets the floor: "host", "memory" or "compute"."""
        if self.host_ms > self.gpu_ms:
            return "host"
        return "compute" if self.compute_ms > self.memory_ms else "memory"


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

def task_floor(copy_ms: float, work: list[Work], floors: Floors, *, rewritable: bool) -> Floor:
    """The floor of a task whose bytes a copy moved in `copy_ms` and that does `work`, on a GPU
    with `floors`. `rewritable`: a known rewrite applies, which may remove work, so FLOPs set no floor."""
    compute_ms, notes = 0.0, []
    if rewritable and work:
        notes.append("a rewrite applies: FLOPs set no floor")
    else:
        for w in work:
            peaks = [floors.peak_tflops[p] for p in w.precisions if floors.peak_tflops.get(p)]
            if not peaks:
                notes.append(f"no measured peak for {w.op}")
                continue
            compute_ms += w.flops / (max(peaks) * 1e12) * 1e3
    return Floor(copy_ms, compute_ms, floors.host_ms, "; ".join(notes))
