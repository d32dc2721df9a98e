"""What every rewrite rule needs: a private copy of a task's graph to change, small questions
about nodes, and the ModelNew source written from the changed graph."""
from __future__ import annotations

import numbers

import torch
import torch.fx as fx

from agent_backend.partition import RESHAPE_OPS  # noqa: F401 (the rules' one definition)
from agent_backend.task import write_body

aten = torch.ops.aten
prims = torch.ops.prims

# Ops that change only how elements are laid out or addressed (reshape may copy, never computes).
LAYOUT_OPS = {aten.view.default, aten.reshape.default, aten._unsafe_view.default, aten.expand.default,
              aten.permute.default, aten.transpose.int, aten.t.default, aten.unsqueeze.default,
              aten.squeeze.dim, aten.squeeze.dims, aten.clone.default}

HEADER = '''import torch
import torch.nn as nn


class ModelNew(nn.Module):
    """Written by the rewrite rule(s) {rules}: the task's program with less work, in ATen ops."""

    def forward({args}):
'''


def copy_graph(gm) -> fx.Graph:
    """A copy of the task's graph (Task.graph_module.graph) that a rule may change (node meta is
    copied, shapes kept)."""
    graph = fx.Graph()
    graph.output(graph.graph_copy(gm.graph, {}))
    return graph


def shape(node) -> tuple[int, ...] | None:
    val = node.meta.get("val") if isinstance(node, fx.Node) else None
    return tuple(val.shape) if isinstance(val, torch.Tensor) else None


def dtype(node) -> torch.dtype | None:
    val = node.meta.get("val") if isinstance(node, fx.Node) else None
    return val.dtype if isinstance(val, torch.Tensor) else None


def is_scalar(value) -> bool:
    return isinstance(value, numbers.Number) and not isinstance(value, bool)


def only_user(node: fx.Node) -> fx.Node | None:
    users = list(node.users)
    return users[0] if len(users) == 1 else None


def reduced_dims(node: fx.Node) -> tuple[tuple[int, ...], bool] | None:
    """(dims, keepdim) of a sum/mean/amax/amin over explicit dims, dims normalised to >= 0."""
    src_shape = shape(node.args[0])
    if src_shape is None or len(node.args) < 2 or not isinstance(node.args[1], (list, tuple)):
        return None
    dims = tuple(sorted(d % max(len(src_shape), 1) for d in node.args[1]))
    keepdim = bool(node.args[2]) if len(node.args) > 2 else bool(node.kwargs.get("keepdim", False))
    return dims, keepdim


def plain_product_problem(node: fx.Node, *, bias_per_column: bool = True) -> str | None:
    """Why an mm/addmm/bmm is not a plain product A @ B (+ bias): alpha or beta scale its terms,
    or (`bias_per_column`) addmm's bias is not one value per output column. None if it is."""
    if node.kwargs.get("beta", 1) != 1 or node.kwargs.get("alpha", 1) != 1:
        return f"{node.name} scales its terms (alpha/beta)"
    if bias_per_column and node.target is aten.addmm.default and len(shape(node.args[0]) or ()) != 1:
        return f"{node.name}'s bias is not one value per output column"
    return None


def call(graph: fx.Graph, target, *args, like: fx.Node | None = None, **kwargs) -> fx.Node:
    """A new call inserted where the graph's inserting point is; `like`: the node whose value it
    stands for (its shape and dtype meta are kept for rules that run later)."""
    node = graph.call_function(target, args, kwargs)
    if like is not None and "val" in like.meta:
        node.meta["val"] = like.meta["val"]
    return node


def _aliases_input(node: fx.Node) -> bool:
    while node.op == "call_function" and node.target in LAYOUT_OPS - {aten.clone.default}:
        node = node.args[0]
    return node.op == "placeholder"


def _eager_conversions(graph: fx.Graph) -> None:
    """prims.convert_element_type -> aten._to_copy(dtype=): the same conversion, but prims' eager
    path costs ~380 us of host time per call (measured on an H100, torch 2.11), which made a
    rewrite that wins on the GPU launch-bound."""
    for node in graph.nodes:
        if node.op == "call_function" and node.target is prims.convert_element_type.default:
            node.target, node.args, node.kwargs = aten._to_copy.default, (node.args[0],), {"dtype": node.args[1]}


def candidate_source(graph: fx.Graph, rules: list[str]) -> str:
    """ModelNew source computing the graph's outputs from its placeholders, in ATen calls. An
    output that would be (a view of) an input is cloned: outputs must be fresh tensors."""
    graph.eliminate_dead_code()
    _eager_conversions(graph)
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    output = next(n for n in graph.nodes if n.op == "output")
    outputs = list(output.args[0]) if isinstance(output.args[0], (tuple, list)) else [output.args[0]]
    for i, out in enumerate(outputs):
        if _aliases_input(out):
            with graph.inserting_before(output):
                outputs[i] = call(graph, aten.clone.default, out, like=out)
    nodes = [n for n in graph.nodes if n.op == "call_function"]
    names = [p.target for p in placeholders]
    body, _ = write_body(nodes, placeholders, outputs, names, f"{names[0]}.device")
    return (HEADER.format(rules=", ".join(rules), args=", ".join(["self"] + names))
            + "".join(f"        {line}\n" for line in body.splitlines()))
