"""Built-in template: fused pointwise chains (unary/binary elementwise ops with broadcasting and
scalar constants, fp32/fp16/bf16/fp64/bool) as one vectorized CUDA kernel, searched over launch
configurations. See README.md beside this file."""
from __future__ import annotations

from agent_backend.specs import Candidate, Task

from .candidates import propose_candidates
from .errors import Unsupported
from .plan import build_plan


def supports(task: Task) -> str | None:
    """None if the template can handle `task`, else a short reason why not."""
    try:
        build_plan(task)
    except Unsupported as e:
        return str(e)
    return None


def propose(task: Task) -> list[Candidate]:
    """One candidate per launch configuration worth trying; [] when unsupported."""
    try:
        plan = build_plan(task)
    except Unsupported:
        return []
    return propose_candidates(plan)


__all__ = ["supports", "propose"]
