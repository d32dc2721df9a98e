"""The one way a template says no, and the two answers every template gives from it."""
from __future__ import annotations

from typing import Callable


class Unsupported(Exception):
    """The template cannot take this task; the message is the reason `supports` returns."""


def why_not(plan: Callable, task) -> str | None:
    """None if `plan(task)` plans the task, else the reason it raised Unsupported with."""
    try:
        plan(task)
    except Unsupported as e:
        return str(e)
    return None


def candidates_of(plan: Callable, propose: Callable, task) -> list:
    """`propose(plan(task))`, or [] where `plan` raises Unsupported."""
    try:
        return propose(plan(task))
    except Unsupported:
        return []
