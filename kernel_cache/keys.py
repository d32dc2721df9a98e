"""Cache keys: everything that decides whether a stored result is valid here.

A key part that is missing gives wrong hits on another machine (a kernel tuned and verified for
one GPU or one precision reused where it was never checked); a part too many gives no hits
across a team (a host name or a path in the key would make every machine miss). docs/CACHE.md
says why each part is here.

The machine's parts (GPU, software) come from cuda_agent_core.identity, below this package: the
cache depends on nothing of the environment. torch is imported only inside `make_key`, so
reading a cache (the CLI, a bundle merge) does not pay for importing it.
"""
from __future__ import annotations

import functools
import hashlib
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, Sequence

from cuda_agent_core import identity

if TYPE_CHECKING:
    import torch

# Bump when the meaning or layout of a key changes: every older entry then simply misses.
KEY_FORMAT_VERSION = 1


def canonical_json(value: Any) -> str:
    """The one text a JSON value hashes and signs as: sorted keys, no spaces, ASCII only."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def key_digest(key_json: dict) -> str:
    return hashlib.sha256(canonical_json(key_json).encode()).hexdigest()


@dataclass(frozen=True)
class CacheKey:
    """One lookup: a task on one input signature, one GPU, one software stack, one precision."""

    task_hash: str
    inputs: tuple[str, ...]  # one signature string per input, from `input_signature`
    gpu: str  # device name, e.g. "NVIDIA H100 80GB HBM3", or "cpu:x86_64"
    capability: str  # compute capability "9.0"; "" for a CPU
    sm_count: int  # streaming multiprocessors; 0 for a CPU
    torch: str
    cuda: str  # CUDA version torch was built with, "none" for a CPU build
    compiler: str  # e.g. "nvrtc 12.8", "nvcc 12.8.93" or "unknown"
    precision: str  # canonical JSON of the precision settings
    format_version: int = KEY_FORMAT_VERSION

    def to_json(self) -> dict:
        return {
            "format_version": self.format_version,
            "task_hash": self.task_hash,
            "inputs": list(self.inputs),
            "gpu": {"name": self.gpu, "capability": self.capability, "sm_count": self.sm_count},
            "software": {"torch": self.torch, "cuda": self.cuda, "compiler": self.compiler},
            "precision": json.loads(self.precision),
        }

    @classmethod
    def from_json(cls, d: dict) -> "CacheKey":
        try:
            return cls(
                task_hash=d["task_hash"],
                inputs=tuple(d["inputs"]),
                gpu=d["gpu"]["name"],
                capability=d["gpu"]["capability"],
                sm_count=d["gpu"]["sm_count"],
                torch=d["software"]["torch"],
                cuda=d["software"]["cuda"],
                compiler=d["software"]["compiler"],
                precision=canonical_json(d["precision"]),
                format_version=d["format_version"],
            )
        except (KeyError, TypeError) as exc:
            raise ValueError(f"not a cache key: {exc!r}") from exc

    @functools.cached_property
    def digest(self) -> str:
        """Hex sha256 of the canonical JSON of every part: the row name in the store."""
        return key_digest(self.to_json())


class InputSpec(Protocol):
    """What a key reads of an input (agent_backend.specs.TensorSpec is one)."""

    shape: Sequence[int]
    stride: Sequence[int]
    dtype: str  # "float32"
    device: str  # device type: "cuda" or "cpu"


def input_signature(spec: InputSpec) -> str:
    """`float32[4,8]/[8,1]@cuda`: dtype, shape, strides and device type of one input."""
    shape = ",".join(str(n) for n in spec.shape)
    stride = ",".join(str(n) for n in spec.stride)
    return f"{spec.dtype}[{shape}]/[{stride}]@{spec.device}"


def make_key(task_hash: str, inputs: Sequence[InputSpec], device: "str | torch.device",
             precision: dict) -> CacheKey:
    """The key for `task_hash` on `inputs`, run on `device` under `precision` (the backend's
    dict of precision switches), with the GPU and software identity filled in from this process."""
    import torch

    device = torch.device(device)
    gpu = identity.device_identity(device.type, device.index)
    software = identity.software_identity()
    return CacheKey(
        task_hash=task_hash,
        inputs=tuple(input_signature(s) for s in inputs),
        gpu=gpu.name,
        capability=gpu.capability,
        sm_count=gpu.sm_count,
        torch=software.torch,
        cuda=software.cuda,
        compiler=software.compiler,
        precision=canonical_json(precision),
    )
