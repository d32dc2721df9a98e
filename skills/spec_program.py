"""The program a kernel template's candidate is: a KernelBench-style source whose ModelNew is a
launch spec (agent_backend/env/launch_spec.py), run by the C++ launch op with no Python per call.
The kernels' sources are in the program, compiled for the current GPU at import; a vectorised
MAIN kernel and, where its vector loads need aligned inputs, a FALLBACK that does not."""
from __future__ import annotations

import string
from typing import Iterable

_HEADER = '''\
# $origin - $description.
INPUTS = $inputs  # (shape, stride, dtype) of each input
OUTPUTS = $outputs
KERNEL_NAME = "$name"

MAIN_SOURCE = r\'\'\'$main_source\'\'\'
MAIN_LAUNCH = $main_launch  # (grid, block, dynamic shared memory, cluster, split-row workspace bytes, persistent)
# Bytes each input's data pointer must be a multiple of for MAIN's vector loads; where one is
# not, FALLBACK (the same computation, one element per access) runs instead.
MAIN_ALIGNMENT = $alignment
FALLBACK_SOURCE = $fallback_source
FALLBACK_LAUNCH = $fallback_launch
'''

_SPEC_MODEL = string.Template('''\
import torch

from agent_backend.env.launch_op import launch_spec_model
from agent_backend.env.launch_spec import Arg, KernelLaunch, LaunchSpec
from agent_backend.specs import TensorSpec

''' + _HEADER + '''ARGS = [Arg.input(k) for k in range(len(INPUTS))] + [Arg.output(k) for k in range(len(OUTPUTS))]


def _launch(source, launch, alignment=()):
    grid, block, shared, cluster, workspace, persistent = launch
    # a split row's blocks synchronise the grid: a cooperative launch, given its workspace
    return KernelLaunch.compile(source, KERNEL_NAME, grid=grid, block=block,
                                args=ARGS + ([Arg.workspace(workspace)] if workspace else []), shared_mem=shared,
                                alignment=alignment, cluster=cluster, cooperative=workspace > 0, persistent=persistent)


KERNELS = [_launch(MAIN_SOURCE, MAIN_LAUNCH, MAIN_ALIGNMENT)]
if FALLBACK_SOURCE:
    KERNELS.append(_launch(FALLBACK_SOURCE, FALLBACK_LAUNCH))
ModelNew = launch_spec_model(LaunchSpec(inputs=[TensorSpec(*s, "cuda") for s in INPUTS],
                                        outputs=[TensorSpec(*s, "cuda") for s in OUTPUTS], kernels=KERNELS))
''')


def spec_program(*, origin: str, description: str, name: str, inputs: Iterable, outputs: Iterable,
                 main: tuple[str, tuple, tuple[int, ...]], fallback: tuple[str, tuple] | None) -> str:
    """The program of kernel `name` over `inputs`/`outputs` (TensorSpecs, the kernels' arguments
    in order, then a workspace where a launch asks for one). `main`: (source, launch, alignment),
    a launch being (grid, block, dynamic shared memory, cluster, workspace bytes, persistent) and
    the alignment the bytes each input's data pointer must be a multiple of; `fallback`: (source,
    launch) of the kernel that runs on inputs main's alignment refuses, or None."""
    main_source, main_launch, alignment = main
    return _SPEC_MODEL.substitute(
        origin=origin, description=description, name=name, inputs=signatures(inputs), outputs=signatures(outputs),
        main_source=main_source, main_launch=main_launch, alignment=alignment,
        fallback_source=f"r'''{fallback[0]}'''" if fallback else None,
        fallback_launch=fallback[1] if fallback else None)


def signatures(specs: Iterable) -> str:
    """Python source of a list of (shape, stride, dtype) for TensorSpecs."""
    return "[" + ", ".join(f"({s.shape}, {s.stride}, {s.dtype!r})" for s in specs) + "]"
