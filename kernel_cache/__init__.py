"""kernel_cache: the store of kernel-search results, shared across processes and machines.

    from kernel_cache import KernelCache, make_key
    with KernelCache.open() as cache:
        lookup = cache.get(make_key(task.hash, task.inputs, "cuda", precision))

docs/CACHE.md describes the store, the key, the layers and the trust model.
"""
# Where KernelCache.open() looks by default, named here for the tools that read the cache; it
# lives below this package because the environment's build artifacts share the directory.
from cuda_agent_core.paths import default_cache_dir

from .entry import ENTRY_FORMAT_VERSION, Entry, EntryFormatError, make_provenance
from .keys import KEY_FORMAT_VERSION, CacheKey, make_key
from .layers import KernelCache, Lookup

__all__ = [
    "CacheKey", "Entry", "EntryFormatError", "KernelCache", "Lookup", "make_key", "make_provenance",
    "default_cache_dir", "ENTRY_FORMAT_VERSION", "KEY_FORMAT_VERSION",
]
