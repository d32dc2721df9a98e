"""Every problem of the suite, and the selection a command line asks for."""
from __future__ import annotations

import fnmatch

from . import problems_level1, problems_level2, problems_level3, problems_rewrites, problems_transformers
from .problem import Problem

PROBLEMS: tuple[Problem, ...] = tuple(
    problems_level1.PROBLEMS + problems_level2.PROBLEMS + problems_rewrites.PROBLEMS + problems_level3.PROBLEMS
    + problems_transformers.PROBLEMS)


def select(levels: list[int] | None = None, only: list[str] | None = None,
           groups: list[str] | None = None) -> list[Problem]:
    """Problems in `levels` and `groups` whose names match one of `only` (names or glob patterns);
    a pattern that matches no problem is an error, so a typo never runs an empty suite."""
    chosen = [p for p in PROBLEMS if (not levels or p.level in levels) and (not groups or p.group in groups)]
    if not only:
        return chosen
    unmatched = [pattern for pattern in only if not fnmatch.filter([p.name for p in PROBLEMS], pattern)]
    if unmatched:
        raise ValueError(f"no problem named {', '.join(unmatched)}; `--list` shows them all")
    return [p for p in chosen if any(fnmatch.fnmatchcase(p.name, pattern) for pattern in only)]
