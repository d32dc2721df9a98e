"""A kernel launch described as data: what the C++ launch op (launch_op.py) runs for a candidate
whose launch is a pure function of its task's signature.

A LaunchSpec names the tensors the op takes (shape, stride, dtype) and the ones it allocates
and returns, and the kernels that may compute them: each a CUBIN, a kernel name, a grid, a
block, dynamic shared memory, its arguments (an input's or an output's data pointer, a
constant, scratch memory of a given size that the op allocates for each launch, or counters:
memory the op zeroes once and keeps for the kernel, which every launch must leave zeroed), the
alignment its vector accesses need of each input's data pointer, the shape of its thread-block
clusters (sm_90+; (1, 1, 1): none), and whether it is a cooperative launch (all blocks resident
at once, so the kernel may synchronise its whole grid). The op
launches the first kernel whose alignment the inputs meet (say, a vectorised kernel, then a
scalar fallback).

    spec = LaunchSpec(inputs=(x_spec,), outputs=(x_spec,), kernels=(
        KernelLaunch.compile(SRC, "scale", grid=blocks, block=256, args=(Arg.input(0), Arg.output(0), Arg("f32", 2.0))),))

Being data, a spec is stored in a kernel-cache entry (entry.launch["spec"], its CUBINs in
entry.binaries) and registered again in another process without running candidate code.
"""
from __future__ import annotations

import functools
import hashlib
import json
from dataclasses import dataclass
from typing import Sequence

from agent_backend.env.nvrtc import compile_cubin, current_arch, normalize_arch
from agent_backend.specs import TensorSpec

SPEC_FORMAT = 1
ARG_KINDS = ("input", "output", "i32", "i64", "f32", "f64", "workspace", "counters")
_INT_RANGES = {"i32": (-2**31, 2**31 - 1), "i64": (-2**63, 2**63 - 1), "workspace": (1, 2**40), "counters": (1, 2**20)}
ENTRY_KEY = "spec"  # where a cache entry's `launch` holds the spec


@dataclass(frozen=True)
class Arg:
    """One kernel argument: the data pointer of input/output `value` (an index), a constant of
    type i32, i64, f32 or f64, a workspace: `value` bytes of uninitialised scratch memory, or
    counters: `value` bytes that the op zeroes before the kernel's first launch on a stream and
    keeps for its later launches there (a launch captured in a CUDA graph takes its own, zeroed
    on every replay), so the kernel must leave them zeroed, as a barrier whose last user resets
    it does (verification checks that)."""

    kind: str
    value: int | float

    def __post_init__(self):
        if self.kind not in ARG_KINDS:
            raise ValueError(f"argument kind {self.kind!r} is not one of {ARG_KINDS}")
        if self.kind in ("f32", "f64"):
            if isinstance(self.value, bool) or not isinstance(self.value, (int, float)):
                raise TypeError(f"a {self.kind} argument is a number, not {self.value!r}")
            object.__setattr__(self, "value", float(self.value))
            return
        if isinstance(self.value, bool) or not isinstance(self.value, int):
            raise TypeError(f"an {self.kind} argument is an int, not {self.value!r}")
        low, high = _INT_RANGES.get(self.kind, (0, 2**31 - 1))
        if not low <= self.value <= high:
            raise ValueError(f"{self.kind} argument {self.value} is out of range [{low}, {high}]")

    @classmethod
    def input(cls, index: int) -> "Arg":
        return cls("input", index)

    @classmethod
    def output(cls, index: int) -> "Arg":
        return cls("output", index)

    @classmethod
    def workspace(cls, nbytes: int) -> "Arg":
        return cls("workspace", nbytes)

    @classmethod
    def counters(cls, nbytes: int) -> "Arg":
        return cls("counters", nbytes)


def _dim3(value: int | Sequence[int], what: str) -> tuple[int, int, int]:
    sizes = (value,) if isinstance(value, int) else tuple(value)
    if not 1 <= len(sizes) <= 3 or not all(isinstance(s, int) and 1 <= s < 2**32 for s in sizes):
        raise ValueError(f"{what} must be a positive int or 1 to 3 positive ints, got {value!r}")
    return (*sizes, *(1,) * (3 - len(sizes)))


@dataclass(frozen=True)
class KernelLaunch:
    """One kernel of a spec and how to launch it. `alignment`: per input, the bytes its data
    pointer must be a multiple of for this kernel to run (empty: no requirement). `cluster`:
    the blocks of one thread-block cluster in each dimension, which the grid must hold a whole
    number of (launched through cuLaunchKernelEx; (1, 1, 1): a plain launch). `cooperative`: a
    cooperative launch, which fails rather than start a grid that cannot be resident at once.
    `persistent` (clusters only): the grid is the most blocks worth launching, and only as many
    clusters as the GPU can hold at once are (cuOccupancyMaxActiveClusters, per device: it
    depends on how the chip's SMs fall into GPCs), so the kernel must loop over its work by
    gridDim; a cluster that waited for another to finish would double the time."""

    cubin: bytes
    arch: str
    name: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    args: tuple[Arg, ...]
    shared_mem: int = 0
    alignment: tuple[int, ...] = ()
    cluster: tuple[int, int, int] = (1, 1, 1)
    cooperative: bool = False
    persistent: bool = False

    def __post_init__(self):
        object.__setattr__(self, "arch", normalize_arch(self.arch))
        object.__setattr__(self, "grid", _dim3(self.grid, "grid"))
        object.__setattr__(self, "block", _dim3(self.block, "block"))
        object.__setattr__(self, "cluster", _dim3(self.cluster, "cluster"))
        object.__setattr__(self, "args", tuple(self.args))
        object.__setattr__(self, "alignment", tuple(self.alignment))
        if any(g % c for g, c in zip(self.grid, self.cluster)):
            raise ValueError(f"the grid {self.grid} must be a whole number of clusters {self.cluster} in each dimension")
        if not isinstance(self.cubin, bytes) or not self.cubin:
            raise TypeError("cubin must be the compiled module's bytes")
        if not all(isinstance(a, Arg) for a in self.args):
            raise TypeError("args must be Arg values")
        if sum(a.kind == "counters" for a in self.args) > 1:
            raise ValueError("a kernel takes at most one counters argument")
        if not isinstance(self.cooperative, bool):
            raise TypeError(f"cooperative must be a bool, got {self.cooperative!r}")
        if not isinstance(self.persistent, bool):
            raise TypeError(f"persistent must be a bool, got {self.persistent!r}")
        if self.persistent and (self.cluster == (1, 1, 1) or self.cooperative or self.grid[1:] != (1, 1)):
            raise ValueError("a persistent launch is one of clusters along x, not cooperative")
        if not 0 <= self.shared_mem < 2**31:
            raise ValueError(f"shared_mem must be a byte count, got {self.shared_mem}")
        if not all(isinstance(a, int) and a >= 1 for a in self.alignment):
            raise ValueError(f"alignment must be positive byte counts, got {self.alignment}")

    @classmethod
    def compile(cls, source: str, name: str, *, grid: int | Sequence[int], block: int | Sequence[int],
                args: Sequence[Arg], shared_mem: int = 0, alignment: Sequence[int] = (),
                cluster: int | Sequence[int] = 1, cooperative: bool = False, persistent: bool = False,
                options: Sequence[str] = (), arch: str | None = None) -> "KernelLaunch":
        """Compile `source` (NVRTC, else nvcc; cached by content) for `arch`, by default the
        current GPU's, and describe the launch of its kernel `name`."""
        arch = normalize_arch(arch) if arch is not None else current_arch()
        cubin = compile_cubin(source, arch=arch, options=options)
        return cls(cubin, arch, name, grid, block, tuple(args), shared_mem, tuple(alignment), cluster, cooperative,
                   persistent)

    @property
    def binary_name(self) -> str:
        """The CUBIN's name in a cache entry's binaries: its architecture and content."""
        return f"{self.arch}:{hashlib.sha256(self.cubin).hexdigest()[:16]}"


@dataclass(frozen=True)
class LaunchSpec:
    """Inputs the op checks, outputs it allocates (on the inputs' device, with exactly these
    strides), and the kernels to choose from, in order of preference."""

    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    kernels: tuple[KernelLaunch, ...]

    def __post_init__(self):
        for name in ("inputs", "outputs", "kernels"):
            object.__setattr__(self, name, tuple(getattr(self, name)))
        if not self.inputs:
            raise ValueError("a launch spec takes at least one input (its device is the inputs' device)")
        if not self.outputs or not self.kernels:
            raise ValueError("a launch spec needs at least one output and one kernel")
        counts = {"input": len(self.inputs), "output": len(self.outputs)}
        for kernel in self.kernels:
            for arg in kernel.args:
                if arg.kind in counts and arg.value >= counts[arg.kind]:
                    raise ValueError(f"kernel {kernel.name!r}: {arg.kind} {arg.value} does not exist "
                                     f"({counts[arg.kind]} {arg.kind}s)")
            if kernel.alignment and len(kernel.alignment) != len(self.inputs):
                raise ValueError(f"kernel {kernel.name!r}: alignment names {len(kernel.alignment)} inputs, "
                                 f"the spec has {len(self.inputs)}")

    def to_json(self) -> tuple[dict, dict[str, bytes]]:
        """(plain JSON, the CUBINs it names by KernelLaunch.binary_name)."""
        kernels = [{"binary": k.binary_name, "name": k.name, "grid": list(k.grid), "block": list(k.block),
                    "shared_mem": k.shared_mem, "args": [[a.kind, a.value] for a in k.args],
                    "alignment": list(k.alignment),
                    # written only where set: the specs cached before keep their digests
                    **({"cluster": list(k.cluster)} if k.cluster != (1, 1, 1) else {}),
                    **({"cooperative": True} if k.cooperative else {}),
                    **({"persistent": True} if k.persistent else {})} for k in self.kernels]
        spec = {"format": SPEC_FORMAT, "inputs": [s.to_json() for s in self.inputs],
                "outputs": [s.to_json() for s in self.outputs], "kernels": kernels}
        return spec, {k.binary_name: k.cubin for k in self.kernels}

    @classmethod
    def from_json(cls, spec: dict, binaries: dict[str, bytes]) -> "LaunchSpec":
        """Raises ValueError for anything but what to_json wrote (a binary missing, too)."""
        try:
            if spec["format"] != SPEC_FORMAT:
                raise ValueError(f"launch spec format {spec['format']!r} is not {SPEC_FORMAT}")
            kernels = tuple(
                KernelLaunch(binaries[k["binary"]], k["binary"].split(":", 1)[0], k["name"], tuple(k["grid"]),
                             tuple(k["block"]), tuple(Arg(kind, value) for kind, value in k["args"]),
                             k["shared_mem"], tuple(k["alignment"]), tuple(k.get("cluster", (1, 1, 1))),
                             k.get("cooperative", False) is True, k.get("persistent", False) is True)
                for k in spec["kernels"])
            return cls(tuple(TensorSpec.from_json(s) for s in spec["inputs"]),
                       tuple(TensorSpec.from_json(s) for s in spec["outputs"]), kernels)
        except (KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"not a launch spec: {exc!r}") from exc

    @functools.cached_property
    def digest(self) -> str:
        """Names the spec by its content (CUBINs by their hashes)."""
        text = json.dumps(self.to_json()[0], sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()


def store_in_entry(entry, spec: LaunchSpec) -> None:
    """Put `spec` into a kernel-cache entry: its JSON under launch["spec"], its CUBINs beside
    the entry's other binaries."""
    data, binaries = spec.to_json()
    entry.launch = {**entry.launch, ENTRY_KEY: data}
    entry.binaries = {**entry.binaries, **binaries}


def read_from_entry(entry) -> LaunchSpec | None:
    """The spec a kernel-cache entry holds, or None (a candidate of another form, or an entry
    written before launch specs); ValueError for a damaged one."""
    data = entry.launch.get(ENTRY_KEY)
    return None if data is None else LaunchSpec.from_json(data, entry.binaries)


def strip_from_entry(entry) -> None:
    """Drop the spec of an entry whose binaries were not built here (an untrusted team entry,
    verified here from its source): the spec is derived again from the source."""
    data = entry.launch.get(ENTRY_KEY)
    if data is None:
        return
    names = {k.get("binary") for k in data.get("kernels", [])}
    entry.launch = {k: v for k, v in entry.launch.items() if k != ENTRY_KEY}
    entry.binaries = {k: v for k, v in entry.binaries.items() if k not in names}
