"""Plain-data descriptions shared by every part: tensors, tasks and candidates.

Everything here crosses process boundaries (worker pipes, the SQLite cache), so it is JSON-able
and never holds live tensors or code objects, except `Task.graph_module`, which stays in the
process that built the task and is never serialised.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import torch

# Tasks take and return floating or boolean tensors only: these are the dtypes a random input
# generator can fill with values that mean something for any op.
FLOAT_DTYPES = ("float32", "float16", "bfloat16", "float64")
TASK_DTYPES = FLOAT_DTYPES + ("bool",)


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def dtype_from_name(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown dtype name {name!r}")
    return dtype


@dataclass(frozen=True)
class TensorSpec:
    """Shape, strides, dtype and device type of one tensor (static shapes only)."""

    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: str
    device: str  # device type: "cuda" or "cpu"
    # Integer inputs that index a dim (a gather's index): random draws lie in [0, high). Without
    # it an integer input is drawn as zeros, in bounds of anything it could index.
    high: int | None = None
    # Integer values the task compares the input with (cross-entropy's ignore_index): a quarter of
    # the draws take one of them, so a kernel that skips the compare is caught.
    special: tuple[int, ...] = ()

    @classmethod
    def of(cls, t: torch.Tensor) -> "TensorSpec":
        return cls(tuple(t.shape), tuple(t.stride()), dtype_name(t.dtype), t.device.type)

    @property
    def torch_dtype(self) -> torch.dtype:
        return dtype_from_name(self.dtype)

    def storage_elements(self) -> int:
        """Elements the strided view spans (what must be allocated to hold it)."""
        if any(s == 0 for s in self.shape):
            return 0
        return 1 + sum((n - 1) * st for n, st in zip(self.shape, self.stride))

    def storage_bytes(self) -> int:
        return self.storage_elements() * self.torch_dtype.itemsize

    def to_json(self) -> dict:
        d = {"shape": list(self.shape), "stride": list(self.stride), "dtype": self.dtype, "device": self.device}
        d = d if self.high is None else {**d, "high": self.high}
        return d if not self.special else {**d, "special": list(self.special)}

    @classmethod
    def from_json(cls, d: dict) -> "TensorSpec":
        return cls(tuple(d["shape"]), tuple(d["stride"]), d["dtype"], d["device"], d.get("high"),
                   tuple(d.get("special", ())))


def random_tensor(spec: TensorSpec, generator: torch.Generator, *, scale: float = 1.0,
                  offset: float = 0.0, binary: bool = False) -> torch.Tensor:
    """A tensor with `spec`'s shape and strides, drawn by `generator` on the generator's device.
    Drawing there (not on the CPU, then copying) keeps verification of large tasks fast: a
    candidate is checked on a dozen or more fresh input sets. `binary`: 0s and 1s instead (what
    masks and counts hold: `mask == 0` is never true of normal draws)."""
    n, device = spec.storage_elements(), generator.device
    if spec.high is not None:  # indices: every value in bounds, each one possible
        flat = torch.randint(0, spec.high, (n,), generator=generator, dtype=spec.torch_dtype, device=device)
    elif spec.dtype == "bool" or binary:
        flat = (torch.rand(n, generator=generator, device=device) > 0.5).to(spec.torch_dtype)
    elif not spec.torch_dtype.is_floating_point:
        # Integers are indices (a whole graph's token ids, say): 0 is in bounds of any non-empty dim.
        flat = torch.zeros(n, dtype=spec.torch_dtype, device=device)
    else:
        # fp16/bf16 values are drawn in fp32 and rounded; fp64 is drawn in fp64.
        draw_dtype = torch.float64 if spec.torch_dtype == torch.float64 else torch.float32
        flat = (torch.randn(n, generator=generator, dtype=draw_dtype, device=device) * scale + offset).to(
            spec.torch_dtype)
    if spec.special:
        values = torch.tensor(spec.special, dtype=spec.torch_dtype, device=device)
        picked = values[torch.randint(0, len(spec.special), (n,), generator=generator, device=device)]
        flat = torch.where(torch.randint(0, 4, (n,), generator=generator, device=device) == 0, picked, flat)
    return flat.as_strided(spec.shape, spec.stride)


def random_inputs(specs: tuple[TensorSpec, ...] | list[TensorSpec], seed: int, *, scale: float = 1.0,
                  offset: float = 0.0, binary: bool = False, device: str | None = None) -> list[torch.Tensor]:
    """Inputs for `specs` on `device` (default: each spec's own device). The same seed gives the
    same values on the same kind of device."""
    generators: dict[str, torch.Generator] = {}
    tensors = []
    for s in specs:
        where = device or s.device
        if where not in generators:
            generators[where] = torch.Generator(device=where).manual_seed(seed)
        tensors.append(random_tensor(s, generators[where], scale=scale, offset=offset, binary=binary))
    return tensors


@dataclass(frozen=True)
class Task:
    """One subgraph to beat Inductor on.

    `program` is a standalone KernelBench-style module (class Model, get_inputs,
    get_init_inputs) computing the subgraph; `hash` names its computation independently of node
    names, graph position and process; `inputs`/`outputs` are the signature it was seen with.
    """

    hash: str
    program: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    ops: tuple[str, ...]
    kind: str  # "pointwise", "matmul", "reduction", "norm", "softmax", "conv", "scan"
    # The subgraph (task.Subgraph: `.graph` with placeholders = inputs, output = a tuple of the
    # outputs; callable as an FX GraphModule); in-process only, for templates that read the ops.
    graph_module: Any = field(default=None, compare=False, repr=False)

    def on_device(self, device: str) -> "Task":
        """This task as if traced on `device` (its specs are data: a task traced on the CPU, as
        the templates would see it on a GPU)."""
        return replace(self, inputs=tuple(replace(s, device=device) for s in self.inputs),
                       outputs=tuple(replace(s, device=device) for s in self.outputs))

    def to_json(self) -> dict:
        return {
            "hash": self.hash,
            "program": self.program,
            "inputs": [s.to_json() for s in self.inputs],
            "outputs": [s.to_json() for s in self.outputs],
            "ops": list(self.ops),
            "kind": self.kind,
        }

    @classmethod
    def from_json(cls, d: dict) -> "Task":
        return cls(
            hash=d["hash"],
            program=d["program"],
            inputs=tuple(TensorSpec.from_json(s) for s in d["inputs"]),
            outputs=tuple(TensorSpec.from_json(s) for s in d["outputs"]),
            ops=tuple(d["ops"]),
            kind=d["kind"],
        )


@dataclass(frozen=True)
class Candidate:
    """An answer to a Task: KernelBench-style source defining `class ModelNew` with the same
    forward signature as the Task's Model. `origin` says who wrote it (e.g.
    "builtin:pointwise:b256v4", "llm:<model>", "test").

    A chat policy also keeps what the model was asked (`conversation`, chat messages) and all it
    said (`answer`), for the trajectories; and sets `rejection` on an answer with nothing to run
    (no code block), which the search then records as rejected without running it. None of these
    three goes to the workers."""

    source: str
    origin: str
    params: dict = field(default_factory=dict, compare=False)
    conversation: tuple[dict, ...] = field(default=(), compare=False, repr=False)
    answer: str | None = field(default=None, compare=False, repr=False)
    rejection: str | None = field(default=None, compare=False)

    def to_json(self) -> dict:
        return {"source": self.source, "origin": self.origin, "params": dict(self.params)}

    @classmethod
    def from_json(cls, d: dict) -> "Candidate":
        return cls(d["source"], d["origin"], dict(d.get("params", {})))

