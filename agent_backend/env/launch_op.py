"""The launch op, cuda_agent::launch(key, program, inputs): runs the LaunchSpec registered under
`key` from C++ (launcher/launch_op.cpp): input checks, output allocation and the launch, on
torch's current stream, with no Python in the call path. It is what a launch-spec candidate's
ModelNew calls (launch_spec_model) and what a compiled graph calls in place of a winner's
subgraph, so what is verified is what runs.

The op's schema is defined here, on import, so that a graph replayed by Inductor's cache finds
it; the C++ kernels (CUDA, Meta) load with the extension, built with torch.utils.cpp_extension
(15-30 s, once per machine, torch and Python) into <cache dir>/launch_op/<key>/. Until
then a Python default kernel loads the extension and dispatches again.
"""
from __future__ import annotations

import functools
import hashlib
import importlib.util
import logging
import sys
from pathlib import Path
from types import ModuleType
from typing import Callable

import torch
import torch.nn as nn
from filelock import FileLock

from agent_backend.env.launch_spec import LaunchSpec
from cuda_agent_core.paths import default_cache_dir

log = logging.getLogger("cuda_agent")

SOURCE = Path(__file__).with_name("launcher") / "launch_op.cpp"
HEADERS = (SOURCE.with_name("cuda_driver.h"),)  # included by SOURCE, so part of the build key
CXX_FLAGS = ("-O2",)
LD_FLAGS = ("-ldl",)  # dlopen lives in libdl before glibc 2.34
MODULE_PREFIX = "cuda_agent_launch_op"

# Inductor must hand our ops their inputs in exactly the strides the graph's fake tensors had:
# a winner is verified (and a launch spec checks its inputs) on that layout only. torch's
# default constraint for custom ops has not always been exact strides, so say it.
EXACT_STRIDES = (getattr(torch.Tag, "needs_exact_strides", torch.Tag.needs_fixed_stride_order),)

# launch.in1 .. launch.in8 take the inputs one by one: torch.ops parses separate tensors from
# Python about 0.5 us faster than a Tensor[] (scratch measurement on the 2-core build machine), and
# a compiled graph calls the op from Python on every run. launch_op.cpp registers as many.
MOST_POSITIONAL_INPUTS = 8
OP_NAMES = ("cuda_agent::launch", *(f"cuda_agent::launch.in{n}" for n in range(1, MOST_POSITIONAL_INPUTS + 1)))

_library = torch.library.Library("cuda_agent", "FRAGMENT")
_library.define("launch(str key, str program, Tensor[] inputs) -> Tensor[]", tags=EXACT_STRIDES)
for _n in range(1, MOST_POSITIONAL_INPUTS + 1):
    _library.define(f"launch.in{_n}(str key, str program, {', '.join(f'Tensor input{i}' for i in range(_n))})"
                    " -> Tensor[]", tags=EXACT_STRIDES)


def launch_overload(count: int) -> torch._ops.OpOverload:
    """The launch op's overload for `count` inputs: launch.in<count> where one takes that many
    one by one, else the default, which takes them as a list."""
    if 1 <= count <= MOST_POSITIONAL_INPUTS:
        return getattr(torch.ops.cuda_agent.launch, f"in{count}")
    return torch.ops.cuda_agent.launch.default


def overloads() -> list[torch._ops.OpOverload]:
    """Every overload of the launch op: the list form, then launch.in1 .. launch.in8."""
    return [launch_overload(count) for count in range(MOST_POSITIONAL_INPUTS + 1)]


def launch_call(key: str, program: str, inputs) -> tuple[torch._ops.OpOverload, tuple]:
    """The overload for these inputs and its arguments, as a graph calls it."""
    op = launch_overload(len(inputs))
    if op is torch.ops.cuda_agent.launch.default:
        return op, (key, program, list(inputs))
    return op, (key, program, *inputs)


def launcher(key: str, program: str, count: int) -> Callable[..., list[torch.Tensor]]:
    """launch(*inputs) -> outputs through the op, its overload for `count` inputs chosen once."""
    op = launch_overload(count)
    if op is torch.ops.cuda_agent.launch.default:
        return lambda *inputs: op(key, program, list(inputs))
    return lambda *inputs: op(key, program, *inputs)


def build_key() -> str:
    """Changes with the sources, the flags, torch (its headers and ABI) and Python."""
    parts = [SOURCE.read_bytes(), *(h.read_bytes() for h in HEADERS), " ".join(CXX_FLAGS + LD_FLAGS).encode(),
             torch.__version__.encode(), sys.implementation.cache_tag.encode()]
    return hashlib.sha256(b"\0".join(parts)).hexdigest()[:16]


@functools.cache
def native() -> ModuleType:
    """The extension, built unless another process already did; importing it registers the
    op's C++ kernels."""
    key = build_key()
    name = f"{MODULE_PREFIX}_{key}"
    build_dir = default_cache_dir() / "launch_op" / key
    build_dir.mkdir(parents=True, exist_ok=True)
    # Under the lock even to look: a build in progress writes the library in place.
    with FileLock(str(build_dir) + ".lock"):
        library = build_dir / f"{name}.so"  # the name cpp_extension gives it
        return _import(name, library) if library.is_file() else _build(name, build_dir)


def _build(name: str, build_dir: Path) -> ModuleType:
    from torch.utils import cpp_extension

    log.info("cuda_agent: building the launch op (once per machine, torch and Python) in %s", build_dir)
    (build_dir / "lock").unlink(missing_ok=True)  # torch's own, left by a killed build; ours is held
    return cpp_extension.load(name=name, sources=[str(SOURCE)], extra_cflags=list(CXX_FLAGS),
                              extra_ldflags=list(LD_FLAGS), build_directory=str(build_dir), is_python_module=True,
                              with_cuda=False)


def _import(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _launch_before_native(key: str, program: str, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    """The op's default kernel: runs where the C++ kernels are not loaded yet (a graph replayed
    by Inductor's cache in a new process), and for tensors they do not take."""
    if native.cache_info().currsize:
        devices = sorted({str(t.device) for t in inputs})
        raise ValueError(f"cuda_agent::launch: this kernel is specialised to CUDA tensors; got {devices}")
    native()
    return launcher(key, program, len(inputs))(*inputs)


_library.impl("launch", _launch_before_native, "CompositeExplicitAutograd")
for _n in range(1, MOST_POSITIONAL_INPUTS + 1):
    _library.impl(f"launch.in{_n}", lambda key, program, *inputs: _launch_before_native(key, program, list(inputs)),
                  "CompositeExplicitAutograd")


def _layouts(specs) -> list[tuple]:
    return [(list(s.shape), list(s.stride), s.dtype) for s in specs]


def register(key: str, spec: LaunchSpec, device: int | None) -> None:
    """Register `spec` under `key` and load its kernels on CUDA device `device` now (None:
    on each device's first launch). A key keeps its first spec; another one is a ValueError."""
    kernels = [(k.cubin, k.name, k.grid, k.block, k.shared_mem, [(a.kind, a.value) for a in k.args],
                list(k.alignment), k.cluster, k.cooperative, k.persistent) for k in spec.kernels]
    native().register_spec(key, spec.digest, -1 if device is None else device, _layouts(spec.inputs),
                           _layouts(spec.outputs), kernels)


def launch_count(key: str) -> int:
    """Launches made under `key` in this process (0 where nothing is registered)."""
    return max(native().launch_count(key), 0)


def counters_left(key: str) -> int:
    """Bytes of the counters of `key`'s kernels (Arg.counters) that are not zero, once the device
    has finished all queued work: a launch must leave them zeroed (0 where nothing is registered)."""
    torch.cuda.synchronize()
    return max(native().counters_left(key), 0)


class LaunchSpecModel(nn.Module):
    """A launch-spec candidate's ModelNew: forward is the launch op and nothing else. Made by
    launch_spec_model(spec); subclasses that change forward are not launch-spec candidates."""

    spec: LaunchSpec
    key: str

    def forward(self, *inputs: torch.Tensor):
        outputs = launcher(self.key, "", len(inputs))(*inputs)
        return outputs[0] if len(outputs) == 1 else tuple(outputs)


def launch_spec_model(spec: LaunchSpec) -> type[LaunchSpecModel]:
    """The ModelNew class for `spec`, registered under its digest and loaded on the current
    CUDA device.

        ModelNew = launch_spec_model(LaunchSpec(inputs=..., outputs=..., kernels=(...)))
    """
    register(spec.digest, spec, torch.cuda.current_device())
    return type("ModelNew", (LaunchSpecModel,), {"spec": spec, "key": spec.digest})


def spec_of(model_class: type) -> LaunchSpec | None:
    """The spec a ModelNew class runs, if it is exactly one launch_spec_model made."""
    if not (isinstance(model_class, type) and issubclass(model_class, LaunchSpecModel)):
        return None
    untouched = (model_class.__bases__ == (LaunchSpecModel,) and model_class.forward is LaunchSpecModel.forward
                 and model_class.__call__ is nn.Module.__call__ and model_class.__init__ is nn.Module.__init__)
    spec = model_class.__dict__.get("spec")
    if not untouched or not isinstance(spec, LaunchSpec) or model_class.__dict__.get("key") != spec.digest:
        return None
    return spec
