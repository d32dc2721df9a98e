"""CUDA source -> CUBIN for one GPU architecture, through NVRTC in this process (tens of
milliseconds) or `nvcc -cubin` (a third of a second), cached by content in memory and on disk.

A CUBIN holds machine code for exactly one architecture, so no JIT step runs when it loads;
the architecture and the compiler's version are part of every cache key. Which compiler this
machine has is found by cuda_agent_core.toolchain (the kernel cache's keys name the same one).
"""
from __future__ import annotations

import ctypes
import hashlib
import json
import re
import subprocess
import tempfile
from pathlib import Path
from typing import Sequence

import torch

from agent_backend.env.compile_errors import CompileError
from cuda_agent_core.paths import atomic_write_bytes, default_cache_dir
from cuda_agent_core.toolchain import Nvcc, Nvrtc, check_nvrtc, cuda_home, find_compiler

# Both compilers take these spellings. -lineinfo keeps source lines for profilers and sanitizers.
COMMON_OPTIONS = ("-std=c++17", "-lineinfo")
# The file name compilers print in errors ("kernel.cu(3): error: ..."), the same for both.
SOURCE_NAME = "kernel.cu"
CACHE_FORMAT = 1
_ARCH = re.compile(r"^(?:sm_)?(\d{2,3}[af]?)$")

_memory_cache: dict[str, bytes] = {}


def normalize_arch(arch: str | int) -> str:
    """90, "90", "sm_90" -> "sm_90"; "sm_90a" stays (the arch-specific target wgmma needs)."""
    match = _ARCH.match(str(arch))
    if not match:
        raise ValueError(f"unknown GPU architecture {arch!r}; write it like 'sm_90' or 'sm_90a'")
    return f"sm_{match.group(1)}"


def current_arch() -> str:
    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}"


class NvrtcCompiler:
    """NVRTC through ctypes: no process to start, no files to write."""

    _SUCCESS = 0

    def __init__(self, nvrtc: Nvrtc):
        self._lib = nvrtc.library
        self.version = nvrtc.version

    def compile(self, source: str, arch: str, options: Sequence[str]) -> bytes:
        lib = self._lib
        program = ctypes.c_void_p()
        self._check(
            lib.nvrtcCreateProgram(ctypes.byref(program), source.encode(), SOURCE_NAME.encode(), 0, None, None),
            "nvrtcCreateProgram",
        )
        try:
            flags = [f"--gpu-architecture={arch}", *COMMON_OPTIONS, *_nvrtc_include_options(), *options]
            c_flags = (ctypes.c_char_p * len(flags))(*(flag.encode() for flag in flags))
            status = lib.nvrtcCompileProgram(program, len(flags), c_flags)
            if status != self._SUCCESS:
                log = self._program_log(program)
                raise CompileError.from_log(log or lib.nvrtcGetErrorString(status).decode())
            size = ctypes.c_size_t()
            self._check(lib.nvrtcGetCUBINSize(program, ctypes.byref(size)), "nvrtcGetCUBINSize")
            cubin = ctypes.create_string_buffer(size.value)
            self._check(lib.nvrtcGetCUBIN(program, cubin), "nvrtcGetCUBIN")
            return cubin.raw
        finally:
            lib.nvrtcDestroyProgram(ctypes.byref(program))

    def _program_log(self, program: ctypes.c_void_p) -> str:
        size = ctypes.c_size_t()
        self._check(self._lib.nvrtcGetProgramLogSize(program, ctypes.byref(size)), "nvrtcGetProgramLogSize")
        log = ctypes.create_string_buffer(size.value)
        self._check(self._lib.nvrtcGetProgramLog(program, log), "nvrtcGetProgramLog")
        return log.value.decode(errors="replace")

    def _check(self, status: int, call: str) -> None:
        check_nvrtc(self._lib, status, call)


class NvccCompiler:
    """`nvcc -cubin` in a private temporary directory."""

    def __init__(self, nvcc: Nvcc):
        self._nvcc = nvcc.path
        self.version = nvcc.version

    def compile(self, source: str, arch: str, options: Sequence[str]) -> bytes:
        compute = arch.replace("sm_", "compute_")
        with tempfile.TemporaryDirectory(prefix="cuda_agent_nvcc_") as work:
            Path(work, SOURCE_NAME).write_text(source)
            # -gencode rather than -arch: nvcc 13.0's -arch=sm_90a also runs a plain sm_90 pass.
            command = [self._nvcc, "-cubin", f"-gencode=arch={compute},code={arch}", *COMMON_OPTIONS, *options,
                       "-o", "kernel.cubin", SOURCE_NAME]
            # Run inside the directory so errors name "kernel.cu", not a temporary path.
            done = subprocess.run(command, cwd=work, capture_output=True, text=True)
            if done.returncode != 0:
                raise CompileError.from_log(done.stdout + done.stderr)
            return Path(work, "kernel.cubin").read_bytes()


def _nvrtc_include_options() -> list[str]:
    # NVRTC has no default include path; the toolkit's headers give cuda_fp16.h, cuda_bf16.h and
    # (under include/cccl since CUDA 13) cuda/std.
    home = cuda_home()
    if home is None:
        return []
    return [f"-I{d}" for d in (home / "include", home / "include" / "cccl") if d.is_dir()]


def get_compiler(name: str = "auto") -> NvrtcCompiler | NvccCompiler:
    """"nvrtc", "nvcc", or "auto": NVRTC where its library is found, else nvcc."""
    found = find_compiler(name)
    return NvrtcCompiler(found) if isinstance(found, Nvrtc) else NvccCompiler(found)


def cubin_cache_key(source: str, arch: str, options: Sequence[str], compiler_version: str) -> str:
    payload = json.dumps([CACHE_FORMAT, source, arch, list(options), compiler_version])
    return hashlib.sha256(payload.encode()).hexdigest()


def compile_cubin(source: str, *, arch: str | None = None, options: Sequence[str] = (), compiler: str = "auto",
                  cache_dir: Path | None = None) -> bytes:
    """The CUBIN of `source` for `arch` (default: the current GPU's), from memory, else from
    `cache_dir` (default: <cache dir>/cubin), else compiled and stored in both.
    Raises CompileError with the compiler's trimmed errors."""
    arch = normalize_arch(arch) if arch is not None else current_arch()
    options = tuple(options)
    chosen = get_compiler(compiler)
    key = cubin_cache_key(source, arch, options, chosen.version)
    cubin = _memory_cache.get(key)
    if cubin is None:
        cubin = _load_or_compile(chosen, key, source, arch, options, cache_dir or default_cache_dir() / "cubin")
        _memory_cache[key] = cubin
    return cubin


def _load_or_compile(compiler: NvrtcCompiler | NvccCompiler, key: str, source: str, arch: str,
                     options: tuple[str, ...], cache_dir: Path) -> bytes:
    path = cache_dir / f"{key}.cubin"
    if path.is_file():
        return path.read_bytes()
    cubin = compiler.compile(source, arch, options)
    # The source beside its binary, so a person can see what ran.
    atomic_write_bytes(path.with_suffix(".cu"), source.encode())
    atomic_write_bytes(path, cubin)
    return cubin
