"""Re-verify a cached kernel on this machine (for `cuda-agent cache verify`)."""
from __future__ import annotations

import torch

from .specs import Candidate, Task


def verify_entry(entry) -> tuple[bool, str]:
    """(passed, reason): the entry's candidate against its own task, in a worker on this GPU. A
    pass is recorded in entry.verification (under these rules: the next compile trusts it)."""
    if entry.outcome != "kernel":
        return True, f"nothing to run (outcome {entry.outcome})"
    if not entry.task or not entry.source:
        return False, "entry has no task or no source to verify"
    task = Task.from_json(entry.task)
    if task.inputs and task.inputs[0].device == "cuda" and not torch.cuda.is_available():
        return False, "not verified: no CUDA device here"
    from .dispatch import shared_environment
    # Verify at the precision the entry was keyed under, not this shell's settings.
    env = shared_environment(None, (entry.key or {}).get("precision") or {})
    ev = env.evaluate(task, Candidate(entry.source, entry.origin), profile=False)
    if ev.passed:
        entry.verification = ev.verification_record()
    return ev.passed, ev.reason or ev.status
