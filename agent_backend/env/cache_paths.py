"""Where cuda-agent keeps what it builds, and how files get there without torn writes."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path


def cache_root() -> Path:
    """$CUDA_AGENT_CACHE_DIR, else $XDG_CACHE_HOME/cuda_agent, else ~/.cache/cuda_agent."""
    explicit = os.environ.get("CUDA_AGENT_CACHE_DIR")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "cuda_agent"


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
