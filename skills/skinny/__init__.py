"""Built-in template: a half-precision matrix product by a few vectors (nn.Linear at up to 16
rows of input, a matrix times a few columns) with its pointwise epilogue, on the tensor cores,
reading the matrix once. See README.md beside this file."""
from __future__ import annotations

from agent_backend.specs import Candidate, Task
from skills.pointwise.errors import candidates_of, why_not

from .candidates import propose_candidates
from .plan import DTYPES, MAX_VECTORS, build_plan


def most_vectors(dtype) -> int:
    """The most vectors a product of `dtype` may have for this template (0: none)."""
    return MAX_VECTORS if dtype in DTYPES else 0


def supports(task: Task) -> str | None:
    """None if the template can handle `task`, else a short reason why not."""
    return why_not(build_plan, task)


def propose(task: Task) -> list[Candidate]:
    """One candidate per block shape; [] when unsupported."""
    return candidates_of(build_plan, propose_candidates, task)


__all__ = ["supports", "propose", "most_vectors"]
