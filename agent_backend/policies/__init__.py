"""Policies write candidates for a task. A policy has:

- `name` and `revision`: who wrote a result. A cached loser (Inductor won, or the search failed)
  written by another policy or another revision of this one is searched again, since the
  newer policy may now win; a cached winner stays until something beats it.
- `why_not(task) -> str | None`: None if the policy can propose for `task`, else why not.
- `propose(task, feedback) -> list[Candidate]`: the next candidates, given the evaluations so far
  (in the order of the candidates proposed); PolicyError when it cannot propose now.
"""
from __future__ import annotations

import hashlib
from pathlib import Path

from ..options import Settings


class PolicyError(RuntimeError):
    """The policy cannot propose now (its model server is down, say): nothing is cached, so the
    next compile tries again."""


def make_policy(settings: Settings):
    if settings.policy == "builtin":
        from .builtin import BuiltinPolicy
        return BuiltinPolicy()
    if settings.policy == "llm":
        from .chat import make_chat
        from .llm import LLMPolicy
        return LLMPolicy(make_chat(settings), settings.llm_samples)
    raise ValueError(f"unknown policy {settings.policy!r}")  # options.py validated it already


def source_revision(root: Path) -> str:
    """A short hash of the Python sources under `root`: changes whenever any of them does."""
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]
