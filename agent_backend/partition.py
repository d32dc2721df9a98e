"""Split a functional ATen graph into fusable subgraphs.

One pure function, `classify`, says who may claim a node and, if nobody, why not. Groups are
then grown greedily: an anchor (matmul, conv, reduction) with its pointwise prologue and
epilogue, reductions over the same rows fused with the pointwise work between them (softmax,
norms), and chains of the pointwise nodes left over. Every group is checked to be convex (no
path leaves it and comes back), so replacing it with one call can never make a cycle.
"""
from __future__ import annotations

import operator
from dataclasses import dataclass, field

import torch
import torch.fx as fx

from .specs import TASK_DTYPES, dtype_name

aten = torch.ops.aten

MATMUL_OPS = {aten.mm.default, aten.addmm.default, aten.bmm.default, aten.baddbmm.default}
CONV_OPS = {aten.convolution.default}
REDUCTION_OPS = {
    aten.sum.dim_IntList, aten.sum.default, aten.mean.dim, aten.mean.default, aten.amax.default,
    aten.amin.default, aten.var_mean.correction, aten.var.correction, aten.prod.dim_int,
}
SOFTMAX_OPS = {aten._softmax.default, aten._log_softmax.default}
NORM_OPS = {aten.native_layer_norm.default, aten.native_group_norm.default}
VIEW_OPS = {
    aten.view.default, aten.reshape.default, aten.permute.default, aten.t.default,
    aten.transpose.int, aten.expand.default, aten.unsqueeze.default, aten.squeeze.dim,
    aten.squeeze.dims,
}
ANCHOR_KINDS = ("matmul", "conv", "reduction", "softmax", "norm")
# Groups larger than this become tasks too big for any template or model answer.
MAX_GROUP_NODES = 48


@dataclass(frozen=True)
class Claim:
    kind: str | None  # "pointwise", "view", an anchor kind, or None when no group may hold it
    reason: str = ""  # why not, when kind is None


def _tensor_vals(val) -> list | None:
    """The tensors a node produces, or None if it produces something else."""
    if isinstance(val, torch.Tensor):
        return [val]
    if isinstance(val, (tuple, list)) and val and all(isinstance(v, torch.Tensor) for v in val):
        return list(val)
    return None


def _arg_nodes(node: fx.Node) -> list[fx.Node]:
    return [a for a in node.all_input_nodes]


def classify(node: fx.Node) -> Claim:
    """Who may claim `node`, and if nobody, why not. Pure: reads the node and its inputs only."""
    if node.op != "call_function":
        return Claim(None, f"not an op ({node.op})")
    if node.target is operator.getitem:
        parent = node.args[0]
        inner = classify(parent) if isinstance(parent, fx.Node) else Claim(None, "getitem of a non-node")
        return Claim("getitem" if inner.kind else None, inner.reason)
    target = node.target
    if not isinstance(target, torch._ops.OpOverload):
        return Claim(None, f"{target} is not an ATen op")
    name = str(target)
    tags = set(target.tags)
    if torch.Tag.nondeterministic_seeded in tags:
        return Claim(None, f"{name} is random")
    if any(isinstance(a, torch.device) for a in list(node.args) + list(node.kwargs.values())):
        return Claim(None, f"{name} takes a device argument")
    outs = _tensor_vals(node.meta.get("val"))
    if outs is None:
        return Claim(None, f"{name} has no tensor output metadata")
    for t in outs + [v for a in _arg_nodes(node) for v in (_tensor_vals(a.meta.get("val")) or [])]:
        if dtype_name(t.dtype) not in TASK_DTYPES:
            return Claim(None, f"{name} touches a {dtype_name(t.dtype)} tensor")
        if any(not isinstance(s, int) for s in t.shape):
            return Claim(None, f"{name} has a dynamic shape")
    if target in MATMUL_OPS:
        return Claim("matmul")
    if target in CONV_OPS:
        return Claim("conv")
    if target in REDUCTION_OPS:
        return Claim("reduction")
    if target in SOFTMAX_OPS:
        return Claim("softmax")
    if target in NORM_OPS:
        return Claim("norm")
    if target in VIEW_OPS:
        return Claim("view")
    if torch.Tag.pointwise in tags:
        if not _arg_nodes(node):
            return Claim(None, f"{name} has no tensor input")
        return Claim("pointwise")
    return Claim(None, f"{name} is not a pointwise, view or anchor op")


@dataclass
class Group:
    nodes: list[fx.Node] = field(default_factory=list)  # in graph order
    kind: str = "pointwise"

    def op_count(self) -> int:
        return sum(1 for n in self.nodes if n.target is not operator.getitem)


class _Graph:
    """Topological positions and a convexity check for one graph."""

    def __init__(self, graph: fx.Graph):
        self.pos = {n: i for i, n in enumerate(graph.nodes)}

    def is_convex(self, members: set[fx.Node]) -> bool:
        """True if no path leaves `members` and re-enters it (a cycle after fusion)."""
        last = max(self.pos[n] for n in members)
        seen: set[fx.Node] = set()
        stack = [u for n in members for u in n.users if u not in members]
        while stack:
            n = stack.pop()
            if n in seen or self.pos[n] > last:
                continue
            seen.add(n)
            for u in n.users:
                if u in members:
                    return False
                stack.append(u)
        return True


def _reduced_rows(node: fx.Node) -> tuple | None:
    """(input shape, reduced dims) of a reduction, to fuse only reductions over the same rows."""
    src = node.args[0]
    if not isinstance(src, fx.Node) or not isinstance(src.meta.get("val"), torch.Tensor):
        return None
    shape = tuple(src.meta["val"].shape)
    dims = node.args[1] if len(node.args) > 1 else None
    if isinstance(dims, (list, tuple)):
        dims = tuple(sorted(d % len(shape) for d in dims)) if shape else tuple(dims)
    elif isinstance(dims, int):
        dims = (dims % max(len(shape), 1),)
    else:
        dims = None
    return shape, dims


def partition(graph: fx.Graph) -> list[Group]:
    """Fusable groups of `graph`, in graph order. Nodes nobody claims stay with Inductor."""
    g = _Graph(graph)
    claims = {n: classify(n) for n in graph.nodes}
    owner: dict[fx.Node, Group] = {}
    groups: list[Group] = []

    def try_add(group: Group, members: set, node: fx.Node) -> bool:
        if node in owner or node in members or len(members) >= MAX_GROUP_NODES:
            return False
        if not g.is_convex(members | {node}):
            return False
        members.add(node)
        return True

    for node in graph.nodes:
        kind = claims[node].kind
        if kind not in ANCHOR_KINDS or node in owner:
            continue
        group, members = Group(kind=kind), {node}
        rows = _reduced_rows(node) if kind == "reduction" else None
        grown = True
        while grown:  # epilogue: consumers that are pointwise, getitems, or same-row reductions
            grown = False
            for m in sorted(members, key=g.pos.get):
                for u in m.users:
                    ck = claims[u].kind
                    fusable = ck in ("pointwise", "getitem") or (
                        ck == "reduction" and rows is not None and _reduced_rows(u) == rows)
                    if fusable and try_add(group, members, u):
                        grown = True
        grown = True
        while grown:  # prologue: pointwise/view producers used only inside the group
            grown = False
            for m in sorted(members, key=g.pos.get):
                for p in m.all_input_nodes:
                    if claims[p].kind in ("pointwise", "view") and all(u in members for u in p.users):
                        if try_add(group, members, p):
                            grown = True
        group.nodes = sorted(members, key=g.pos.get)
        for n in group.nodes:
            owner[n] = group
        groups.append(group)

    for node in graph.nodes:  # pointwise chains among what is left
        if claims[node].kind != "pointwise" or node in owner:
            continue
        group, members = Group(kind="pointwise"), {node}
        frontier = [node]
        while frontier:
            n = frontier.pop()
            for nb in list(n.users) + n.all_input_nodes:
                if claims[nb].kind == "pointwise" and try_add(group, members, nb):
                    frontier.append(nb)
        group.nodes = sorted(members, key=g.pos.get)
        for n in group.nodes:
            owner[n] = group
        groups.append(group)

    return sorted(groups, key=lambda gr: g.pos[gr.nodes[0]])


def unclaimed(graph: fx.Graph) -> dict[str, str]:
    """Node name -> why no group may hold it (for `cuda-agent explain`)."""
    return {n.name: c.reason for n in graph.nodes if (c := classify(n)).kind is None and n.op == "call_function"}
