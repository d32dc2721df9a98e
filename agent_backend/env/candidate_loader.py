"""Turning program text into modules: the task's Model and a candidate's ModelNew.

Runs inside a worker process only: a candidate's source is executed here and nowhere else.
Sources get pseudo file names, so tracebacks point at the candidate's own lines, and
exceptions come back as short text a model can act on.
"""
from __future__ import annotations

import itertools
import linecache
import re
import sys
import traceback
import types

import torch

from agent_backend.env.compile_errors import CompileError
from agent_backend.env.extension import keyed_extension_builds

TASK_FILE = "<task>"
CANDIDATE_FILE = "<candidate>"
_MAX_MESSAGE_LINES = 30
_MAX_MESSAGE_CHARS = 3000
_module_ids = itertools.count()


class CandidateError(Exception):
    """Candidate code raised; the message is the trimmed traceback."""


def _shorten(text: str) -> str:
    lines = text.strip().splitlines()
    if len(lines) > _MAX_MESSAGE_LINES:
        lines = lines[:_MAX_MESSAGE_LINES] + [f"... ({len(lines) - _MAX_MESSAGE_LINES} more lines)"]
    text = "\n".join(lines)
    return text if len(text) <= _MAX_MESSAGE_CHARS else text[:_MAX_MESSAGE_CHARS] + " ..."


# Advice torch appends to CUDA errors, which says nothing about the candidate.
_CUDA_ERROR_BOILERPLATE = re.compile(
    r"^(Search for `cuda|CUDA kernel errors might|For debugging consider passing|Compile with `TORCH_USE_CUDA_DSA)")


def describe_exception(exc: BaseException) -> str:
    """A compiler error as the compiler said it; anything else as the candidate's own frames
    of the traceback, and the message."""
    if isinstance(exc, CompileError):
        return _shorten(str(exc))
    frames = traceback.extract_tb(exc.__traceback__)
    lines = [f"{f.filename} line {f.lineno}, in {f.name}: {(f.line or '').strip()}"
             for f in frames if f.filename in (CANDIDATE_FILE, TASK_FILE)]
    message = "".join(traceback.format_exception_only(type(exc), exc)).strip().splitlines()
    lines += [line for line in message if not _CUDA_ERROR_BOILERPLATE.match(line)]
    return _shorten("\n".join(lines))


def load_source(source: str, filename: str) -> types.ModuleType:
    """Execute `source` as a fresh module registered in sys.modules (some libraries look a
    class's module up there)."""
    name = f"cuda_agent_{filename.strip('<>')}_{next(_module_ids)}"
    module = types.ModuleType(name)
    module.__file__ = filename
    sys.modules[name] = module
    linecache.cache[filename] = (len(source), None, source.splitlines(keepends=True), filename)
    try:
        exec(compile(source, filename, "exec"), module.__dict__)
    except BaseException:
        unload(module)
        raise
    return module


def unload(module: types.ModuleType) -> None:
    sys.modules.pop(module.__name__, None)


def load_task(program: str, device: torch.device) -> tuple[types.ModuleType, torch.nn.Module]:
    """The task's program (trusted: we wrote it) and its Model on `device`."""
    module = load_source(program, TASK_FILE)
    model = module.Model(*module.get_init_inputs()).to(device)
    return module, model


def load_candidate(source: str, task_module: types.ModuleType, device: torch.device,
                   build_root: str | None) -> tuple[types.ModuleType, torch.nn.Module]:
    """Execute the candidate's source and build ModelNew(*get_init_inputs()) on `device`;
    CandidateError (with a short message) when that raises or there is no ModelNew.
    torch.utils.cpp_extension builds go to keyed folders under `build_root` (default: the
    cache's)."""
    try:
        with keyed_extension_builds(build_root):
            module = load_source(source, CANDIDATE_FILE)
            model_class = getattr(module, "ModelNew", None)
            if not (isinstance(model_class, type) and issubclass(model_class, torch.nn.Module)):
                raise CandidateError("the source defines no class ModelNew(nn.Module)")
            model = model_class(*task_module.get_init_inputs()).to(device)
    except CandidateError:
        raise
    except BaseException as exc:  # SystemExit, KeyboardInterrupt too: candidate code raised them
        raise CandidateError(describe_exception(exc)) from None
    return module, model
