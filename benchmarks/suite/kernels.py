"""Which of our kernels a compiled model ran, and what the backend decided for its subgraphs.

Winners live in agent_backend.runtime's registry, each counting its calls; the difference of two
snapshots taken around the timed calls says which ran there. A rewrite inlined into the compiled
graph as ATen ops (agent_backend/inline.py) is never called: it runs wherever the graph its
decision belongs to runs ("calls": "inlined"). A winner's origin names who wrote
it: "builtin:<family>:<detail>" for the built-in library (rewrite, pointwise, ...), else the
policy's name (e.g. "llm").
"""
from __future__ import annotations

from agent_backend import runtime
from agent_backend.graph_pass import Decision


def winner_calls() -> dict[str, int]:
    """key -> calls so far, for every winner loaded in this process."""
    return {key: winner.calls for key, winner in runtime._registry.items()}


def family(origin: str) -> str:
    parts = origin.split(":")
    return parts[1] if parts[0] == "builtin" and len(parts) > 1 else parts[0]


def kernels_run(before: dict[str, int], after: dict[str, int], decisions: list[Decision]) -> list[dict]:
    """Our kernels called between two snapshots, with the subgraph each replaced (from `decisions`)."""
    won = {d.winner_key: d for d in decisions if d.winner_key}
    ran = [(key, calls - before.get(key, 0)) for key, calls in after.items() if calls > before.get(key, 0)]
    ran += [(key, "inlined") for key, d in won.items() if d.inlined]
    return [_kernel(key, calls, won.get(key)) for key, calls in ran]


def _kernel(key: str, calls, decision: Decision | None) -> dict:
    winner, task = runtime.registered(key), decision.task if decision else None
    return {"key": key[:12], "origin": winner.origin, "family": family(winner.origin), "calls": calls,
            "kind": task.kind if task else None, "ops": len(task.ops) if task else None,
            "reason": decision.reason if decision else None}


def subgraph_summary(decisions: list[Decision]) -> dict:
    """How many subgraphs the backend made tasks of, how many it gave our kernels, why the rest
    stayed with Inductor (commonest reason first), and for each task whether our kernel runs it
    and whether the gate skipped its search (for gate_compare), with the gate's ratio where it
    timed the task (Inductor's time over the floor: what a kernel at the floor would have been)
    and the candidates its search tried (search.tried)."""
    tasks = [d for d in decisions if d.task is not None]
    reasons: dict[str, int] = {}
    for d in tasks:
        if not d.winner_key:
            reasons[d.reason] = reasons.get(d.reason, 0) + 1
    ordered = sorted(reasons.items(), key=lambda kv: -kv[1])
    return {"tasks": len(tasks), "ours": sum(1 for d in tasks if d.winner_key),
            "left_to_inductor": [{"reason": r, "count": n} for r, n in ordered],
            "each": [{"hash": d.task.hash[:16], "kind": d.task.kind, "ours": bool(d.winner_key),
                      "gated": bool(d.gate and d.gate.get("skipped")),
                      "gate_ratio": d.gate.get("ratio") if d.gate else None, "tried": d.tried} for d in tasks]}
