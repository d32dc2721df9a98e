"""The identity of this machine as a cache key names it: the device (name, compute capability,
SM count) and the software (torch, the CUDA torch was built with, the CUDA compiler).

The driver version is deliberately not part of it: a binary for an architecture runs on any
driver new enough (docs/CACHE.md, "The key"). torch is imported only when an identity is asked
for, so reading a cache (the CLI, a bundle merge) does not pay for importing it.
"""
from __future__ import annotations

import functools
import platform
from typing import NamedTuple

from .toolchain import find_compiler


class Device(NamedTuple):
    name: str  # e.g. "NVIDIA H100 80GB HBM3", or "cpu:x86_64"
    capability: str  # compute capability "9.0"; "" for a CPU
    sm_count: int  # streaming multiprocessors; 0 for a CPU


class Software(NamedTuple):
    torch: str
    cuda: str  # CUDA version torch was built with, "none" for a CPU build
    compiler: str  # e.g. "nvrtc 12.8", "nvcc 12.8.93" or "unknown"


def device_identity(device_type: str, index: int | None) -> Device:
    """A device of this machine. The SM count tells apart parts that share a name and
    capability but not a speed, such as MIG slices of one GPU model."""
    if device_type != "cuda":
        return Device(f"{device_type}:{platform.machine()}", "", 0)
    return _cuda_identity(index)


@functools.lru_cache(maxsize=None)
def _cuda_identity(index: int | None) -> Device:
    import torch

    index = torch.cuda.current_device() if index is None else index
    major, minor = torch.cuda.get_device_capability(index)
    props = torch.cuda.get_device_properties(index)
    return Device(torch.cuda.get_device_name(index), f"{major}.{minor}", props.multi_processor_count)


def software_identity() -> Software:
    import torch

    return Software(torch=torch.__version__, cuda=torch.version.cuda or "none", compiler=compiler_version())


@functools.lru_cache(maxsize=1)
def compiler_version() -> str:
    """The CUDA compiler kernels are built with here, as the environment picks it
    (toolchain.find_compiler: NVRTC, else nvcc), or "unknown" where there is none. Looked up
    once per process."""
    try:
        return find_compiler().version
    except Exception:  # no compiler, or its discovery failed: a key must still be computable
        return "unknown"
