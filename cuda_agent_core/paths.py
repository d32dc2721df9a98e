"""Where cuda-agent keeps what it stores and builds, and how files get there without torn writes.

One directory holds the kernel cache's files (kernel_cache.layers) and the build artifacts
(cubins, the launcher, extensions: agent_backend.env), so one setting moves them all.
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

CACHE_DIR_ENV = "CUDA_AGENT_CACHE_DIR"


def default_cache_dir() -> Path:
    """CUDA_AGENT_CACHE_DIR, else $XDG_CACHE_HOME/cuda_agent, else ~/.cache/cuda_agent."""
    if os.environ.get(CACHE_DIR_ENV):
        return Path(os.environ[CACHE_DIR_ENV]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base).expanduser() / "cuda_agent"


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
