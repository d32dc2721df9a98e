"""The built-in policy: the skill library in skills/, no model needed.

Each family (rewrites that remove work, then kernel templates) says whether it applies to a task
and proposes its candidates; they all compete in one round, as templates enumerate their own
launch configurations, so feedback from the environment ends the search.
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


def _families() -> list:
    """(name, module with supports(task) and propose(task)) for every family of the library."""
    from skills import pointwise, rewrites, rows
    return [("rewrites", rewrites), ("rows", rows), ("pointwise", pointwise)]


class BuiltinPolicy:
    name = "builtin"

    @property
    def revision(self) -> str:
        """The library's source: any change to it re-opens the search of cached losers."""
        return _skills_revision()

    def why_not(self, task: Task) -> str | None:
        """None if some family applies to `task`, else the reasons none does."""
        reasons = []
        for name, family in _families():
            why = family.supports(task)
            if why is None:
                return None
            reasons.append(f"{name}: {why}")
        return "; ".join(reasons)

    def propose(self, task: Task, feedback: list) -> list[Candidate]:
        if feedback:
            return []
        return [c for _, family in _families() if family.supports(task) is None for c in family.propose(task)]
