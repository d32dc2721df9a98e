"""cuda_agent_core: what this machine is and where cuda-agent keeps its files.

The bottom layer, below both the kernel cache and the environment (docs/ARCHITECTURE.md):

    identity.py    the GPU, torch, CUDA and compiler a cache key names
    toolchain.py   which CUDA compiler this machine has (NVRTC, else nvcc) and its version
    paths.py       the cache directory, and writes a reader never sees half of

Why a package of its own: the cache keys need the machine's identity and the build artifacts
need the cache directory, so whichever of kernel_cache and agent_backend.env held these, the
other would import it, and the two used to import each other. kernel_cache is the part a team
shares and other tools read, so it must not depend on the environment; and finding the CUDA
compiler is no business of a store of results, so the store is not the honest owner either.
This package imports nothing of cuda-agent (tests/test_layering.py checks it), and nothing
heavy when imported: torch and the compilers are looked up only when asked for.
"""
