"""The fast path for candidate authors: compile a CUDA source to a CUBIN (NVRTC, else
`nvcc -cubin`) and launch its kernel on torch's current stream, one native call per launch.

    k = load_kernel(SRC, "scale", ["ptr", "ptr", "f32", "i64"])
    k.launch(grid=(n + 255) // 256, block=256, args=[x, out, 2.0, n])
"""
from __future__ import annotations

from typing import Sequence

import torch

from agent_backend.env.launcher import launcher_module
from agent_backend.env.nvrtc import compile_cubin, current_arch, normalize_arch

# Argument types a kernel may take, and the codes the launcher packs them by.
ARG_TYPE_CODES = {"ptr": "p", "i32": "i", "i64": "l", "f32": "f", "f64": "d"}


def arg_type_codes(arg_types: Sequence[str]) -> str:
    """["ptr", "i32"] -> "pi"; raises on anything the launcher cannot pack."""
    if isinstance(arg_types, str):
        raise TypeError(f"arg_types is a list such as ['ptr', 'i32'], not the string {arg_types!r}")
    unknown = [t for t in arg_types if t not in ARG_TYPE_CODES]
    if unknown:
        raise ValueError(f"unknown arg types {unknown}; each must be one of {list(ARG_TYPE_CODES)}")
    return "".join(ARG_TYPE_CODES[t] for t in arg_types)


class Kernel:
    """One `extern "C" __global__` function of a CUBIN, loaded on the current CUDA device.

    Build one from a cached binary with `Kernel(cubin, name, arg_types, arch=...)`;
    `load_kernel` compiles first. `cubin` and `arch` are what a binary cache stores.
    """

    def __init__(self, cubin: bytes, name: str, arg_types: Sequence[str], *, arch: str):
        codes = arg_type_codes(arg_types)
        self.cubin = bytes(cubin)
        self.name = name
        self.arg_types = tuple(arg_types)
        self.arch = normalize_arch(arch)
        self.device = torch.cuda.current_device()  # initialises CUDA in this process
        launcher = launcher_module()
        module = launcher.load_module(self.cubin, self.device)
        self._function = launcher.Function(launcher.get_function(module, name), name, codes)
        self._current_stream = torch._C._cuda_getCurrentRawStream  # an int handle, no Stream object

    def launch(self, grid, block, args: Sequence, shared_mem: int = 0, cluster=None) -> None:
        """Launch on torch's current stream of this kernel's device.

        grid, block: an int or a tuple of up to 3 ints. args: one per arg type; a "ptr" takes a
        CUDA tensor (its data_ptr()) or an int address. shared_mem: dynamic shared memory in
        bytes; the kernel's limit is raised to it for you. cluster: None, or the shape of
        a thread-block cluster (an int or up to 3 ints; sm_90+, at most 8 blocks portably), which
        must divide the grid: its blocks share distributed shared memory."""
        self._function.launch(grid, block, args, shared_mem, self._current_stream(self.device), cluster)

    def __repr__(self) -> str:
        return f"Kernel({self.name!r}, {list(self.arg_types)}, arch={self.arch!r}, device={self.device})"


def load_kernel(cuda_src: str, name: str, arg_types: Sequence[str], *, options: Sequence[str] = (),
                arch: str | None = None) -> Kernel:
    """Compile `cuda_src` once per (source, options, arch, compiler) and load kernel `name`.

    options: extra compiler flags such as "--use_fast_math" or "-maxrregcount=64".
    arch: defaults to the current GPU's, e.g. "sm_90"; "sm_90a" enables wgmma and setmaxnreg.
    Raises CompileError with the compiler's trimmed errors."""
    arch = normalize_arch(arch) if arch is not None else current_arch()
    cubin = compile_cubin(cuda_src, arch=arch, options=options)
    return Kernel(cubin, name, arg_types, arch=arch)
