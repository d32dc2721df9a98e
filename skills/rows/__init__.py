"""Built-in template: row reductions and normalisations (softmax, log_softmax, layer/RMS norm,
logsumexp, sum/mean/amax/amin/var over dims) and scans along rows (cumsum), with their pointwise
prologue and epilogue, as one CUDA kernel that reads each row from global memory once. See
README.md beside this file."""
from __future__ import annotations

from agent_backend.specs import Candidate, Task
from skills.pointwise.errors import Unsupported

from .candidates import launch_configs, propose_candidates
from .plan import build_plan


def supports(task: Task) -> str | None:
    """None if the template can handle `task`, else a short reason why not."""
    try:
        launch_configs(build_plan(task))
    except Unsupported as e:
        return str(e)
    return None


def propose(task: Task) -> list[Candidate]:
    """One candidate per launch shape worth trying; [] when unsupported."""
    try:
        return propose_candidates(build_plan(task))
    except Unsupported:
        return []


__all__ = ["supports", "propose"]
