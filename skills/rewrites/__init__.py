"""Built-in rewrites: candidates that compute what a task computes with less work (a GEMM whose
output is summed becomes a GEMV, hand-written attention one fused call, ...), written as ordinary
ModelNew programs in ATen ops, so they are compiled, verified and timed like any candidate and
trusted no more. See README.md beside this file."""
from __future__ import annotations

import torch.fx as fx

from agent_backend.specs import Candidate, Task

from . import affine_fold, attention, fused_attention, gemm_epilogue, gemm_reduce, trivial_reductions
from .graph import candidate_source, copy_graph

ORIGIN = "builtin:rewrite:"
# In the order they are tried: a later rule sees what an earlier one left.
RULES = (attention.RULE, fused_attention.CAUSAL_MASK, fused_attention.GROUPED_KV, gemm_reduce.RULE, affine_fold.RULE,
         gemm_epilogue.RULE, trivial_reductions.RULE)


def explain(task: Task) -> list[tuple[str, str | None]]:
    """(rule, None if it applies to `task` on its own, else why not), for every rule."""
    if task.graph_module is None:
        return [(rule.name, "the task has no graph (read from a cache)") for rule in RULES]
    return [(rule.name, rule.apply(copy_graph(task.graph_module))) for rule in RULES]


def supports(task: Task) -> str | None:
    """None if some rule applies to `task`, else why none does."""
    reasons = explain(task)
    if any(why is None for _, why in reasons):
        return None
    return "no rewrite applies (" + "; ".join(f"{name}: {why}" for name, why in reasons) + ")"


def propose(task: Task) -> list[Candidate]:
    """Every applicable rule in turn on one graph; and where several apply, each alone too."""
    if task.graph_module is None:
        return []
    graph, applied = copy_graph(task.graph_module), []
    for rule in RULES:
        if rule.apply(graph) is None:
            applied.append(rule.name)
            graph.eliminate_dead_code()  # what the rule replaced is no one's input any more
    if not applied:
        return []
    candidates = [_candidate(candidate_source(graph, applied), applied)]
    if len(applied) > 1:
        candidates += [_candidate(rebuilt[1], [name]) for name in applied
                       if (rebuilt := _apply(task, [name])) is not None]
    return candidates


def rebuild(task: Task, origin: str) -> tuple[fx.Graph, str] | None:
    """The graph a rewrite candidate of `task` computes (the rules its origin names, applied to the
    task's graph as propose applies them) and its source; None if `origin` names no rewrite or
    a rule no longer applies. Where the source equals a verified winner's, the graph is that
    winner in ATen ops, for the backend to hand to Inductor in place of a call."""
    if task.graph_module is None or not origin.startswith(ORIGIN):
        return None
    names = origin[len(ORIGIN):].split("+")
    if not set(names) <= {rule.name for rule in RULES}:
        return None
    return _apply(task, names)


def _apply(task: Task, names: list[str]) -> tuple[fx.Graph, str] | None:
    graph = copy_graph(task.graph_module)
    for rule in RULES:
        if rule.name in names:
            if rule.apply(graph) is not None:
                return None
            graph.eliminate_dead_code()
    return graph, candidate_source(graph, names)


def _candidate(source: str, rules: list[str]) -> Candidate:
    return Candidate(source, ORIGIN + "+".join(rules), {"rules": list(rules)})


__all__ = ["ORIGIN", "RULES", "explain", "supports", "propose", "rebuild"]
