"""Inductor's lowering of the launch op: the fallback Inductor makes for any custom op (its
outputs as buffers of one extern kernel, the inputs' layouts fixed by the op's tag), except that
the generated Python wrapper calls graph_launch.launch, the op's C++ kernel with no dispatcher in
between, instead of torch.ops.cuda_agent.launch.in<N>. torch.ops' path from Python (parsing the
arguments against the schema, the boxed call, the autograd fallback) cost about 3 us of the op's
11 us a call on an H100's host; issue 10 allows a winner 3 us over a bare launch. A C++ wrapper
(cpp_wrapper) still calls the op.
"""
from __future__ import annotations

import functools
import logging

from agent_backend.env import launch_op

log = logging.getLogger("cuda_agent")

NAME = "cuda_agent_launch"
IMPORT = f"from agent_backend.env.graph_launch import launch as {NAME}"


@functools.cache
def install() -> bool:
    """Register the lowering for every launch overload, once a process (Inductor's lowering module
    takes about 2 s to import, so this waits for the first graph that holds the op, or the first
    profile). False where this torch's Inductor lacks what it relies on: graphs then call torch.ops
    and a profile times that."""
    try:
        from torch._inductor import ir
        from torch._inductor.lowering import fallback_handler, lowerings
        from torch._inductor.virtualized import V
    except ImportError as e:
        log.info("cuda_agent: compiled graphs call the launch op through torch.ops (%s)", e)
        return False

    class DirectLaunch(ir.FallbackKernel):
        """The launch op's extern kernel, called in a Python wrapper as NAME."""

        def codegen(self, wrapper) -> None:
            if not V.graph.cpp_wrapper:
                wrapper.add_import_once(IMPORT)
                self.python_kernel_name = NAME
            super().codegen(wrapper)

    def lowering(op):
        fallback = fallback_handler(op)

        def lower(*args, **kwargs):
            outputs = fallback(*args, **kwargs)
            kernel = _extern_kernel(outputs, ir)
            if type(kernel) is ir.FallbackKernel:  # anything else: Inductor changed; leave it as made
                kernel.__class__ = DirectLaunch
            return outputs

        return lower

    for op in launch_op.overloads():
        lowerings[op] = lowering(op)
    return True


def _extern_kernel(outputs, ir):
    """The one kernel behind the lowered op's outputs (each a MultiOutput of it, in a TensorBox
    and a StorageBox), or None where they are built otherwise."""
    kernels = {}
    for node in outputs if isinstance(outputs, (list, tuple)) else ():
        for _ in range(4):
            if isinstance(node, ir.MultiOutput) or not hasattr(node, "data"):
                break
            node = node.data
        if not isinstance(node, ir.MultiOutput) or not node.inputs:
            return None
        kernels[id(node.inputs[0])] = node.inputs[0]
    return next(iter(kernels.values())) if len(kernels) == 1 else None
