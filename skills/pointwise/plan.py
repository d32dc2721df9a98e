"""Task -> PointwisePlan: what one fused pointwise kernel computes, typed and laid out.

Every node's dtype and shape come from running its op on meta tensors built from the input
specs, so `node.meta["val"]` is never needed.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch.fx import Graph, Node
from torch.fx.node import map_arg

from agent_backend.partition import bind_arguments
from agent_backend.specs import Task, TensorSpec

from .dtypes import DtypeInfo, dtype_info, operand_info
from .errors import Unsupported
from .layout import broadcast_strides, coalesce, is_dense, memory_order, vector_width
from .ops import CONTINUOUS, CONVERSIONS, OP_RULES, OpArgs, Value


@dataclass(frozen=True)
class Operand:
    spec: TensorSpec
    strides: tuple[int, ...]  # over the plan's coalesced dims; 0 where it broadcasts

    @property
    def info(self) -> DtypeInfo:
        return dtype_info(self.spec.torch_dtype)


@dataclass(frozen=True)
class PointwisePlan:
    sizes: tuple[int, ...]          # coalesced iteration dims, outermost first
    inputs: tuple[Operand, ...]
    outputs: tuple[Operand, ...]
    reads: tuple[int, ...]          # the inputs the computation uses (the rest are never loaded)
    body: tuple[str, ...]           # C statements computing values from inputs x<k>
    results: tuple[str, ...]        # the C value each output y<k> takes
    vector_width: int               # widest vector access every operand allows (1: none)
    wide_index: bool                # 64-bit indices needed

    @property
    def numel(self) -> int:
        return math.prod(self.sizes)


def build_plan(task: Task) -> PointwisePlan:
    """The plan for `task`, or Unsupported with the reason the template cannot take it."""
    placeholders, out_nodes = graph_interface(task)
    iter_shape = _iteration_shape(task.outputs)
    needed = _ancestors(out_nodes)
    values = {p: Value(f"x{k}", s.torch_dtype) for k, (p, s) in enumerate(zip(placeholders, task.inputs))}
    metas = {p: torch.empty_strided(s.shape, s.stride, dtype=s.torch_dtype, device="meta")
             for p, s in zip(placeholders, task.inputs)}
    stored: dict[Node, str] = {}
    computed = [n for n in task.graph_module.graph.nodes if n.op == "call_function" and n in needed]
    body = [_render(node, f"v{k}", values, metas, stored) for k, node in enumerate(computed)]
    _check_outputs([metas[n] for n in out_nodes], task.outputs)

    sizes, inputs, outputs = _operands(task, iter_shape)
    reads = tuple(k for k, p in enumerate(placeholders) if p in needed)
    width = vector_width(sizes, [(inputs[k].strides, inputs[k].spec.torch_dtype.itemsize) for k in reads],
                         [(o.strides, o.spec.torch_dtype.itemsize) for o in outputs])
    # 32-bit indices while every offset, and a grid-stride index overshooting the end by up
    # to a grid's worth of elements, stays below 2**31.
    wide = math.prod(sizes) >= 2**30 or any(s.storage_elements() >= 2**31 for s in task.inputs + task.outputs)
    return PointwisePlan(sizes, inputs, outputs, reads, tuple(body),
                         tuple(stored.get(n, values[n].var) for n in out_nodes), width, wide)


def graph_interface(task: Task) -> tuple[list[Node], list[Node]]:
    """The graph's placeholders and output nodes, checked against the task's signature."""
    if task.graph_module is None:
        raise Unsupported("task has no graph module")
    if not task.inputs or not task.outputs:
        raise Unsupported("task needs tensor inputs and outputs")
    for spec in task.inputs + task.outputs:
        if spec.device != "cuda":
            raise Unsupported(f"tensors must be on CUDA, not {spec.device}")
        operand_info(spec.torch_dtype)  # indices pass here; an op computing with one is refused
    placeholders = [n for n in task.graph_module.graph.nodes if n.op == "placeholder"]
    if len(placeholders) != len(task.inputs):
        raise Unsupported(f"graph has {len(placeholders)} inputs, task {len(task.inputs)}")
    out_nodes = _output_nodes(task.graph_module.graph)
    if len(out_nodes) != len(task.outputs):
        raise Unsupported(f"graph has {len(out_nodes)} outputs, task {len(task.outputs)}")
    return placeholders, out_nodes


def _check_outputs(results: list[torch.Tensor], specs: tuple[TensorSpec, ...]) -> None:
    """What the graph computes is what the task says it returns, in layouts we can write."""
    for k, (meta, spec) in enumerate(zip(results, specs)):
        if tuple(meta.shape) != spec.shape or meta.dtype != spec.torch_dtype:
            raise Unsupported(f"output {k} is {meta.dtype}{list(meta.shape)}, task says {spec.dtype}{list(spec.shape)}")
        if not is_dense(spec.shape, spec.stride):
            raise Unsupported(f"output {k} strides {spec.stride} are not a dense layout")


def _operands(task: Task,
              iter_shape: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[Operand, ...], tuple[Operand, ...]]:
    """Coalesced iteration sizes and every input's and output's strides over them, iterating in
    the first output's memory order so that its writes (and like-laid-out reads) are contiguous."""
    strides = [broadcast_strides(s.shape, s.stride, iter_shape) for s in task.inputs] + [s.stride for s in task.outputs]
    order = memory_order(task.outputs[0].stride)
    sizes, coalesced = coalesce(tuple(iter_shape[d] for d in order), [tuple(st[d] for d in order) for st in strides])
    inputs = tuple(Operand(s, st) for s, st in zip(task.inputs, coalesced))
    outputs = tuple(Operand(s, st) for s, st in zip(task.outputs, coalesced[len(inputs):]))
    return sizes, inputs, outputs


def _output_nodes(graph: Graph) -> list[Node]:
    result = next(n for n in graph.nodes if n.op == "output").args[0]
    nodes = list(result) if isinstance(result, (tuple, list)) else [result]
    if not all(isinstance(n, Node) for n in nodes):
        raise Unsupported("every output must be a tensor computed by the graph")
    return nodes


def _iteration_shape(outputs: tuple[TensorSpec, ...]) -> tuple[int, ...]:
    shapes = {spec.shape for spec in outputs}
    if len(shapes) != 1:
        raise Unsupported(f"outputs differ in shape: {sorted(shapes)}")
    shape = shapes.pop()
    if math.prod(shape) == 0:
        raise Unsupported("outputs are empty")
    return shape


def _ancestors(nodes: list[Node]) -> set[Node]:
    seen: set[Node] = set()
    stack = list(nodes)
    while stack:
        node = stack.pop()
        if node in seen:
            continue
        if node.op not in ("placeholder", "call_function"):
            raise Unsupported(f"node {node.op} {node.target} not supported")
        seen.add(node)
        stack.extend(node.all_input_nodes)
    return seen


def _render(node: Node, var: str, values: dict[Node, Value], metas: dict[Node, torch.Tensor],
            stored: dict[Node, str]) -> str:
    """One C statement computing `node` into `var`; records its Value and meta result. An
    ops.CONTINUOUS op's fp16/bf16 result stays unrounded: a store rounds it once. A rounded
    result's value before rounding goes into `stored`, for a store to round once too (rounding
    to nearest is idempotent: the same bits, where storing `var` would convert it twice)."""
    rule = OP_RULES.get(node.target)
    if rule is None:
        raise Unsupported(f"op {node.target} not supported")
    bound = bind_arguments(node)
    result = meta_result(node, metas)
    if rule.kind == "compare":
        dtype = torch.result_type(*(metas[v] if isinstance(v, Node) else v for v in (bound["self"], bound["other"])))
    else:
        dtype = result.dtype
    if rule.kind == "float" and not dtype.is_floating_point:
        raise Unsupported(f"op {node.target} on {dtype} not supported")
    continuous = node.target in CONTINUOUS or _keeps_precision(node, metas, result)
    args = OpArgs({k: values[v] if isinstance(v, Node) else v for k, v in bound.items()}, dtype,
                  round_operands=rule.kind != "any", continuous=continuous)
    info = dtype_info(result.dtype)
    values[node] = Value(var, result.dtype, rounded=not continuous or info.round == "{}")
    metas[node] = result
    expr = rule.render(args)
    if continuous or info.round == "{}":
        return f"const {info.ctype} {var} = {expr};"
    stored[node] = expr
    return f"const {info.ctype} {var} = {info.round.format(expr)};"


def _keeps_precision(node: Node, metas: dict[Node, torch.Tensor], result: torch.Tensor) -> bool:
    """A conversion to its operand's own float type or a wider one (bf16 -> fp32): an operand
    kept unrounded stays so (Inductor's upcast), where a narrowing one rounds, as the graph asks."""
    if node.target not in CONVERSIONS or not isinstance(node.args[0], Node):
        return False
    source = metas[node.args[0]].dtype
    return source.is_floating_point and (result.dtype == source or result.dtype.itemsize > source.itemsize)


def meta_result(node: Node, metas: dict[Node, torch.Tensor]) -> torch.Tensor:
    args = map_arg(node.args, metas.__getitem__)
    kwargs = dict(map_arg(node.kwargs, metas.__getitem__))
    if "device" in kwargs:  # factories and _to_copy: keep the result on the meta device
        kwargs["device"] = "meta"
    try:
        result = node.target(*args, **kwargs)
    except Exception as e:  # the op rejects these arguments: its message says why
        raise Unsupported(f"op {node.target} fails on these arguments: {str(e).splitlines()[0]}") from e
    if not isinstance(result, torch.Tensor):
        raise Unsupported(f"op {node.target} does not return one tensor")
    return result
