"""The torch-extension path (`torch.utils.cpp_extension.load_inline` / `load`, the format models
trained on KernelBench write), made safe for many candidates at once.

Candidates often all call their extension by one name. Inside `keyed_extension_builds`, each
build goes to `<build_root>/<name>_<hash16>/` and the module is renamed to match, where the hash
covers every source and flag: identical candidates reuse one build, different ones build in
parallel (in different processes) without clobbering each other, and a file lock per key keeps
two processes from building the same one twice.
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
import inspect
import json
import os
import sys
from pathlib import Path
from typing import Any, Callable, Iterator

import torch
import torch.utils.cpp_extension as cpp_extension
from filelock import FileLock

from agent_backend.env.compile_errors import CompileError
from cuda_agent_core.paths import default_cache_dir

# Arguments that change where or how loudly a build happens, not what it builds.
_UNKEYED_ARGUMENTS = ("name", "build_directory", "verbose", "keep_intermediates")

# Modules this process has loaded, by keyed name: a reuse skips even ninja's up-to-date check.
_loaded: dict[str, Any] = {}


@contextlib.contextmanager
def keyed_extension_builds(build_root: str | Path | None = None) -> Iterator[Path]:
    """While active, `cpp_extension.load_inline` and `load` build into keyed directories under
    `build_root` (default: <cache dir>/extensions) and raise CompileError on compiler errors."""
    root = Path(build_root) if build_root is not None else default_cache_dir() / "extensions"
    originals = cpp_extension.load_inline, cpp_extension.load
    cpp_extension.load_inline = _keyed(originals[0], root, _inline_sources)
    cpp_extension.load = _keyed(originals[1], root, _file_sources)
    try:
        yield root
    finally:
        cpp_extension.load_inline, cpp_extension.load = originals


def extension_key(arguments: dict[str, Any]) -> str:
    """sha256 of a build's keyed arguments and of what else changes its binary: torch, CUDA,
    Python, and the GPU architectures it is built for."""
    keyed = {k: v for k, v in arguments.items() if k not in _UNKEYED_ARGUMENTS}
    payload = json.dumps([keyed, _build_environment()], sort_keys=True, default=repr)
    return hashlib.sha256(payload.encode()).hexdigest()


def _build_environment() -> dict[str, Any]:
    capabilities = ([torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count())]
                    if torch.cuda.is_available() else [])
    return {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": sys.implementation.cache_tag,
        "arch_list": os.environ.get("TORCH_CUDA_ARCH_LIST"),  # else torch targets the visible GPUs
        "capabilities": capabilities,
    }


def _inline_sources(arguments: dict[str, Any]) -> dict[str, Any]:
    return arguments  # load_inline's sources are already text


def _file_sources(arguments: dict[str, Any]) -> dict[str, Any]:
    """load() names files: key on their names and contents, not on where they happen to be."""
    paths = arguments["sources"]
    paths = [paths] if isinstance(paths, (str, os.PathLike)) else paths
    contents = {os.path.basename(p): Path(p).read_text() for p in paths}
    return {**arguments, "sources": contents}


def _keyed(build: Callable, root: Path, describe: Callable[[dict], dict]) -> Callable:
    signature = inspect.signature(build)

    @functools.wraps(build)
    def keyed_build(*args, **kwargs):
        call = signature.bind(*args, **kwargs)
        call.apply_defaults()  # so spelling out a default does not change the key
        name = f"{call.arguments['name']}_{extension_key(describe(call.arguments))[:16]}"
        if name in _loaded:
            return _loaded[name]
        build_dir = root / name
        build_dir.mkdir(parents=True, exist_ok=True)
        call.arguments["name"] = name
        call.arguments["build_directory"] = str(build_dir)
        with FileLock(str(build_dir) + ".lock"):
            # torch's own lock file, left behind by a build that was killed, would make this
            # build wait forever; under our lock no other process is building here.
            (build_dir / "lock").unlink(missing_ok=True)
            module = _build_reporting_errors(build, call)
        _loaded[name] = module
        return module

    return keyed_build


def _build_reporting_errors(build: Callable, call: inspect.BoundArguments) -> Any:
    try:
        return build(*call.args, **call.kwargs)
    except RuntimeError as error:
        if not str(error).startswith("Error building extension"):
            raise
        raise CompileError.from_log(str(error)) from error
    except (ImportError, OSError) as error:  # built, but does not load: an undefined symbol, most often
        raise CompileError.from_log(f"the extension built but does not load: {error}") from error
