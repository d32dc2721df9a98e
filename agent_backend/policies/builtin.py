"""The built-in policy: the template library in skills/, no model needed.

Templates enumerate their own launch configurations, so one round of proposals is the whole
search; feedback from the environment ends it.
"""
from __future__ import annotations

import functools
from pathlib import Path

from ..specs import Candidate, Task
from . import source_revision


@functools.cache
def _skills_revision() -> str:
    import skills
    return source_revision(Path(skills.__file__).parent)


class BuiltinPolicy:
    name = "builtin"

    @property
    def revision(self) -> str:
        """The templates' source: any change to them re-opens the search of cached losers."""
        return _skills_revision()

    def why_not(self, task: Task) -> str | None:
        """None if a template applies to `task`, else the reason none does."""
        if task.kind != "pointwise":
            return f"no built-in template for {task.kind} subgraphs yet"
        from skills.pointwise import supports
        return supports(task)

    def propose(self, task: Task, feedback: list) -> list[Candidate]:
        if feedback or self.why_not(task) is not None:
            return []
        from skills.pointwise import propose
        return propose(task)
