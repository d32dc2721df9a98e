"""The fast path's launcher module (launcher/launcher.cpp): built once per machine and Python,
kept in the cache directory, imported from there.

It is built with the C++ compiler directly against pybind11 and Python's headers (a few
seconds), not through torch.utils.cpp_extension, whose torch headers cost about a minute.
"""
from __future__ import annotations

import functools
import hashlib
import importlib.util
import os
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path
from types import ModuleType

import pybind11
from filelock import FileLock

from agent_backend.env.compile_errors import CompileError
from cuda_agent_core.paths import default_cache_dir

MODULE_NAME = "_cuda_agent_launcher"  # must match PYBIND11_MODULE in launcher.cpp
SOURCE = Path(__file__).with_name("launcher") / "launcher.cpp"
HEADERS = (SOURCE.with_name("cuda_driver.h"),)  # included by SOURCE, so part of the build key
CXX_FLAGS = ("-O2", "-std=c++17", "-shared", "-fPIC", "-fvisibility=hidden")


def build_command(source: Path, output: Path) -> list[str]:
    includes = [f"-I{pybind11.get_include()}", f"-I{sysconfig.get_path('include')}"]
    return [os.environ.get("CXX", "c++"), *CXX_FLAGS, *includes, str(source), "-o", str(output), "-ldl"]


def build_key() -> str:
    """Changes with the sources, the flags, Python's ABI and pybind11's version."""
    parts = [SOURCE.read_bytes(), *(h.read_bytes() for h in HEADERS), " ".join(CXX_FLAGS).encode(),
             sys.version.encode(), sysconfig.get_config_var("EXT_SUFFIX").encode(), pybind11.__version__.encode()]
    return hashlib.sha256(b"\0".join(parts)).hexdigest()[:16]


@functools.cache
def launcher_module() -> ModuleType:
    """The launcher, built into <cache dir>/launcher/<key>/ unless another process already did."""
    build_dir = default_cache_dir() / "launcher" / build_key()
    library = build_dir / f"{MODULE_NAME}{sysconfig.get_config_var('EXT_SUFFIX')}"
    if not library.is_file():
        build_dir.mkdir(parents=True, exist_ok=True)
        with FileLock(str(build_dir) + ".lock"):
            if not library.is_file():  # another process may have built it while we waited
                _build(library)
    return _import(library)


def _build(library: Path) -> None:
    # Build under a temporary name, then rename: an importer never sees half a library.
    fd, partial = tempfile.mkstemp(dir=library.parent, prefix=".partial-", suffix=".so")
    os.close(fd)
    try:
        done = subprocess.run(build_command(SOURCE, Path(partial)), capture_output=True, text=True)
        if done.returncode != 0:
            raise CompileError.from_log(done.stdout + done.stderr)
        os.replace(partial, library)
    finally:
        if os.path.exists(partial):
            os.unlink(partial)


def _import(library: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(MODULE_NAME, library)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
