"""The Inductor post-grad pass: partition, make tasks, ask for winners, rewrite the graph."""
from __future__ import annotations

import logging
import operator
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.fx as fx
from torch._inductor.custom_graph_pass import CustomGraphPass
from torch._inductor.pattern_matcher import stable_topological_sort

from skills.rows.gemv import PRODUCTS, most_vectors

from . import inline, runtime
from .partition import Group, partition
from .specs import Task
from .task import UnsupportedGroup, boundary, extract_task

log = logging.getLogger("cuda_agent")


@dataclass
class Decision:
    """What happened to one subgraph: a winner key to dispatch, or why it stays with Inductor;
    `gate`: the gate's numbers where it timed the task (gate.Verdict.to_json); `speedup`: the
    winner's over Inductor, timed alone; `needs_context`: the winner runs only where the
    in-context check measured its graph faster with it (env.results.needs_context); `inlined`:
    the winner went into the graph as its ATen ops (inline.py), so it is never called; `tried`:
    each candidate of the search that decided it, in order (search.tried); `saved_gpu_ms`: the
    GPU time a call of the winner saved alone against Inductor's, where both were timed."""

    task: Task | None
    winner_key: str | None
    reason: str
    gate: dict | None = None
    speedup: float | None = None
    needs_context: bool = False
    inlined: bool = False
    tried: list = field(default_factory=list)
    saved_gpu_ms: float | None = None


# The in-context check's on one winner: keep it?, and what it found ("": nothing to say), or
# for one not kept why not.
Verdict = tuple[bool, str]


def unchecked(won: list[tuple[object, Decision]], found: str, why: str = "") -> list[Verdict]:
    """The verdicts where the in-context check measured nothing (`found`: what to say of it
    beside a kept winner, "" for nothing; `why`: why nothing, where `found` does not say): each
    winner stays, but one that needs a measured verdict (Decision.needs_context)."""
    unmeasured = (f"no in-context verdict ({why or found or 'none yet'}): its launch takes longer than it runs, "
                  f"so it runs only where its graph is measured faster with it")
    return [(False, unmeasured) if d.needs_context else (True, found) for _, d in won]


@dataclass
class GraphReport:
    graph_index: int
    decisions: list[Decision] = field(default_factory=list)

    def summary(self) -> str:
        won = sum(1 for d in self.decisions if d.winner_key)
        why = Counter(d.reason for d in self.decisions if not d.winner_key)
        left = "; ".join(f"{n}x {r}" for r, n in why.most_common(3))
        return (f"cuda_agent: graph {self.graph_index}: {len(self.decisions)} subgraph(s), {won} ran by our "
                f"kernels, {len(self.decisions) - won} left to Inductor" + (f" ({left})" if left else ""))


def rewrite(graph: fx.Graph, group: Group, key: str, task: Task) -> bool:
    """Replace the group's nodes (whose task is `task`) with the winner: a rewrite as its ATen ops
    (inline.py; True), anything else as one call of the winner's op (runtime.call_for) and getitems
    for its outputs. Either goes where the group's last node was; where a node between the group's
    nodes uses one of its outputs (a training graph's forward computes a LayerNorm's output, uses
    it, then computes the LayerNorm's saved 1/std for the backward), the graph is sorted again so
    that node follows the new ones."""
    used_early = _outputs_used_within(group)
    inlined = False
    try:
        sub = inline.aten_graph(key, task)
        if sub is not None:
            inline.splice(graph, group, sub)  # traces first: a failure leaves the graph as it was
            inlined = True
    except Exception as e:  # the op call below runs the same verified winner
        log.warning("cuda_agent: could not inline kernel %s (%s: %s); it runs through its op", key[:12],
                    type(e).__name__, e, exc_info=True)
    if not inlined:
        _call_winner(graph, group, key, task)
    if used_early:
        stable_topological_sort(graph)  # keeps every other node's order
    return inlined


def _call_winner(graph: fx.Graph, group: Group, key: str, task: Task) -> None:
    """The group's nodes replaced by one call of the winner's op and getitems for its outputs."""
    members = set(group.nodes)
    inputs, outputs = boundary(group)
    last = group.nodes[-1]
    op, args = runtime.call_for(key, runtime.program_arg(task.program), inputs)
    with graph.inserting_after(last):
        call = graph.call_function(op, args)
    call.meta["val"] = [o.meta["val"] for o in outputs]
    # Inductor holds an op inserted by a pass to the layouts of its inputs (the op's tag asks for
    # exact strides: the winner was verified on them) only where it finds them here.
    call.meta["eager_input_vals"] = (fx.node.map_arg(args, lambda n: n.meta["val"]), {})
    anchor = call
    for i, out in enumerate(outputs):
        with graph.inserting_after(anchor):
            item = graph.call_function(operator.getitem, (call, i))
        item.meta = dict(out.meta)
        out.replace_all_uses_with(item, delete_user_cb=lambda user: user not in members)
        anchor = item
    for n in reversed(group.nodes):
        graph.erase_node(n)


def _outputs_used_within(group: Group) -> bool:
    """Whether a node that is not the group's, placed between its first and last nodes, uses a
    value the group computes: then it would come before the call that replaces the group."""
    members = set(group.nodes)
    node = group.nodes[0]
    while node is not group.nodes[-1]:
        if node not in members and any(a in members for a in node.all_input_nodes):
            return True
        node = node.next
    return False


def worth_a_search(group: Group, min_ops: int) -> bool:
    """At least `min_ops` ops, or a reduction, scan or matrix-vector product however small: a
    single pointwise op is already what Inductor writes, a single reduction may not be (a float32
    sum over 16 rows of 393216: Inductor's kernels 80-107 us, eager's 21 us, H100), nor a scan (a
    bf16 cumsum of 8192 x 4096: Inductor's 82 us, 60% of the copy rate; the rows family's 51 us,
    H100), nor cuBLAS's GEMV (fp32, 1 x 4096 by 4096 x 4096: 32.9 us, the rows family's 21.2, H200)."""
    return (group.op_count() >= min_ops or group.kind in ("reduction", "scan")
            or any(_matrix_vector(n) for n in group.nodes))


def _matrix_vector(node: fx.Node) -> bool:
    """An mm or addmm of as few output rows or columns as the rows template takes: a matrix times
    a vector, or a few (skills/rows/gemv.py: up to 8 in fp32, 2 in fp16/bf16)."""
    value = node.meta.get("val")
    return (node.target in PRODUCTS and isinstance(value, torch.Tensor) and value.dim() == 2
            and min(value.shape) <= most_vectors(value.dtype))


class SubgraphPass(CustomGraphPass):
    """Post-grad pass; `decide(task)` returns a Decision (a winner key, or why not).
    `identity()` names everything besides the graph that decides what the pass does (None:
    unknown), for Inductor's FX graph cache."""

    def __init__(self, decide: Callable[[Task], Decision], min_ops: int, reports: list[GraphReport],
                 identity: Callable[[], str | None] = lambda: None, progress=None,
                 confirm: Callable[[fx.Graph, list[tuple[Group, Decision]]], list[Verdict]] | None = None):
        self.decide = decide
        self.confirm = confirm  # the in-context check: for each group won, keep it or not and what was found
        self.min_ops = min_ops
        self.reports = reports
        self.identity = identity
        self.progress = progress  # a progress.SearchProgress, told which subgraph is being decided

    def __call__(self, graph: fx.Graph) -> None:
        report = GraphReport(graph_index=len(self.reports))
        self.reports.append(report)
        try:
            groups = partition(graph)
        except Exception as e:  # a bug of ours must not fail the user's compile: Inductor takes it all
            log.warning("cuda_agent: could not partition graph %d (%s: %s); Inductor compiles it as is",
                        report.graph_index, type(e).__name__, e, exc_info=True)
            return
        groups = [g for g in groups if worth_a_search(g, self.min_ops)]
        if self.progress:
            self.progress.start_graph(report.graph_index, len(groups))
        won: list[tuple[Group, Decision]] = []
        for group in groups:
            if self.progress:
                self.progress.next_subgraph()
            decision = self._decision(group)
            report.decisions.append(decision)
            if decision.winner_key:
                won.append((group, decision))
        verdicts = self._in_context(graph, won, report.graph_index)
        if self.progress:
            self.progress.end_graph()
        for (group, decision), (keep, found) in zip(won, verdicts):
            if not keep:  # a loss measured in context, or a launch-bound winner with no verdict
                decision.reason = f"{found} (alone: {decision.reason})"
                decision.winner_key = None
                continue
            if found:
                decision.reason += f"; in context: {found}"
            decision.inlined = rewrite(graph, group, decision.winner_key, decision.task)
            if decision.inlined:
                decision.reason += "; inlined as ATen ops"
        graph.lint()
        log.info(report.summary())

    def _in_context(self, graph: fx.Graph, won: list[tuple[Group, Decision]], index: int) -> list[Verdict]:
        if not won or self.confirm is None:
            return unchecked(won, "", "no in-context check")
        try:
            return self.confirm(graph, won)
        except Exception as e:  # each winner was verified and won alone: a failed check keeps them
            log.warning("cuda_agent: the in-context check of graph %d failed (%s: %s); its kernels stay", index,
                        type(e).__name__, e, exc_info=True)
            return unchecked(won, "the check failed")

    def _decision(self, group: Group) -> Decision:
        try:
            task = extract_task(group)
        except UnsupportedGroup as e:
            return Decision(None, None, f"not a task: {e}")
        except Exception as e:  # as above: the group stays with Inductor
            log.warning("cuda_agent: could not make a task of a group (%s: %s)", type(e).__name__, e, exc_info=True)
            return Decision(None, None, f"internal error making the task: {type(e).__name__}: {e}")
        try:
            return self.decide(task)
        except Exception as e:
            log.warning("cuda_agent: deciding task %s failed (%s: %s); Inductor keeps it", task.hash[:12],
                        type(e).__name__, e, exc_info=True)
            return Decision(task, None, f"internal error: {type(e).__name__}: {e}")

    def uuid(self):
        # None makes Inductor bypass its FX graph cache for the graph (no lookup, no store).
        identity = self.identity()
        return None if identity is None else f"cuda_agent-pass-{identity}"
