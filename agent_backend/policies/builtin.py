"""The built-in policy: the template library in skills/, no model needed.

Templates enumerate their own launch configurations, so one round of proposals is the whole
search; feedback from the environment ends it.
"""
from __future__ import annotations

from ..specs import Candidate, Task


class BuiltinPolicy:
    name = "builtin"

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
