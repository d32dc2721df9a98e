"""Which CUDA compiler this machine has, and its version: NVRTC where its library loads, else
`nvcc`. Compiling with them is the environment's job (agent_backend.env.nvrtc); finding them is
here because a cache key names the compiler (identity.compiler_version), and it must name the
very one the environment compiles with.

torch is imported only where its CUDA version picks the NVRTC library, so importing this module
stays cheap.
"""
from __future__ import annotations

import ctypes
import functools
import glob
import os
import re
import shutil
import site
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

COMPILERS = ("nvrtc", "nvcc")


@dataclass(frozen=True)
class Nvrtc:
    """A loaded NVRTC library (its nvrtcGetErrorString set to return bytes) and its version."""

    library: ctypes.CDLL
    version: str  # "nvrtc 12.8"


@dataclass(frozen=True)
class Nvcc:
    path: str
    version: str  # "nvcc 12.8.93"


@functools.cache
def cuda_home() -> Path | None:
    """The CUDA toolkit: $CUDA_HOME or $CUDA_PATH, else the one holding `nvcc` on PATH, else
    /usr/local/cuda."""
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            return Path(os.environ[var])
    nvcc = shutil.which("nvcc")
    candidates = [Path(nvcc).resolve().parent.parent] if nvcc else []
    # The `nvcc` on PATH may be a wrapper script outside the toolkit: check for its headers.
    for home in (*candidates, Path("/usr/local/cuda")):
        if (home / "include" / "cuda.h").is_file():
            return home
    return None


def nvrtc_library_candidates() -> list[str]:
    """Where libnvrtc may be, best first: the one torch's CUDA would load by name, the pip wheels'
    (nvidia/cu13/lib, nvidia/cuda_nvrtc/lib), then the toolkit's."""
    import torch

    candidates = []
    if torch.version.cuda:
        candidates.append(f"libnvrtc.so.{torch.version.cuda.split('.')[0]}")
    roots = [*site.getsitepackages(), site.getusersitepackages(), *sys.path]
    for root in dict.fromkeys(r for r in roots if r):
        for pattern in ("nvidia/cu*/lib/libnvrtc.so*", "nvidia/cuda_nvrtc/lib/libnvrtc.so*"):
            candidates += sorted(glob.glob(os.path.join(root, pattern)), reverse=True)
    home = cuda_home()
    if home is not None:
        for lib_dir in ("lib64", "lib"):
            candidates += sorted(glob.glob(str(home / lib_dir / "libnvrtc.so*")), reverse=True)
    return list(dict.fromkeys(candidates))


def check_nvrtc(library: ctypes.CDLL, status: int, call: str) -> None:
    """Raise RuntimeError with NVRTC's own words when `call` returned an error status."""
    if status != 0:  # NVRTC_SUCCESS
        raise RuntimeError(f"{call} failed: {library.nvrtcGetErrorString(status).decode()}")


@functools.cache
def find_nvrtc() -> Nvrtc | None:
    for candidate in nvrtc_library_candidates():
        try:
            return _load_nvrtc(candidate)
        except (OSError, AttributeError):  # not loadable here, or not an NVRTC library
            continue
    return None


def _load_nvrtc(candidate: str) -> Nvrtc:
    library = ctypes.CDLL(candidate)
    library.nvrtcGetErrorString.restype = ctypes.c_char_p
    major, minor = ctypes.c_int(), ctypes.c_int()
    check_nvrtc(library, library.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor)), "nvrtcVersion")
    return Nvrtc(library, f"nvrtc {major.value}.{minor.value}")


@functools.cache
def find_nvcc() -> Nvcc | None:
    nvcc = shutil.which("nvcc")
    home = cuda_home()
    if nvcc is None and home is not None and (home / "bin" / "nvcc").is_file():
        nvcc = str(home / "bin" / "nvcc")
    if nvcc is None:
        return None
    banner = subprocess.run([nvcc, "--version"], capture_output=True, text=True, check=True).stdout
    release = re.search(r"V(\d+\.\d+\.\d+)", banner)
    return Nvcc(nvcc, f"nvcc {release.group(1) if release else banner.strip().splitlines()[-1]}")


def find_compiler(name: str = "auto") -> Nvrtc | Nvcc:
    """"nvrtc", "nvcc", or "auto": NVRTC where its library is found, else nvcc."""
    if name not in ("auto", *COMPILERS):
        raise ValueError(f"unknown compiler {name!r}; use one of {('auto', *COMPILERS)}")
    found = None
    if name in ("auto", "nvrtc"):
        found = find_nvrtc()
    if found is None and name in ("auto", "nvcc"):
        found = find_nvcc()
    if found is None:
        wanted = "libnvrtc or nvcc" if name == "auto" else name
        raise RuntimeError(f"no CUDA compiler: cannot find {wanted} (set CUDA_HOME, or install nvidia-cuda-nvrtc)")
    return found
