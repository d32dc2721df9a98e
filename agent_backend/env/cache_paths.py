"""Where cuda-agent keeps what it builds, and how files get there without torn writes."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

# Build artifacts (cubins, the launcher, extensions) live beside the kernel cache.
from kernel_cache.layers import default_cache_dir as cache_root  # noqa: F401


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write to a temporary file beside `path`, then rename it over `path`: a reader in another
    process sees the old file or the whole new one, never a part."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
