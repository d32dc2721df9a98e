"""Policies write candidates for a task: `propose(task, feedback) -> list[Candidate]`."""
from __future__ import annotations

from ..options import Settings


def make_policy(settings: Settings):
    if settings.policy == "builtin":
        from .builtin import BuiltinPolicy
        return BuiltinPolicy()
    raise ValueError(f"unknown policy {settings.policy!r}")  # options.py validated it already
