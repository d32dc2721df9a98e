"""Task -> SkinnyPlan: a half-precision mm or addmm of a matrix by a few vectors, with its
pointwise epilogue, as the kernel sees it: the matrix's rows, each contiguous along k, the
vectors, where each product goes, and the epilogue as a pointwise plan.

out[i, j] = sum_k a[i, k] b[k, j]. The side with at most MAX_VECTORS rows of the product (a's
rows, or b's columns) is the vectors; the other is the matrix, whose every element is read once
and must be contiguous along k. nn.Linear at a few rows of x (x @ W.t()) reads W's rows (the
matrix) and x's rows (the vectors); a matrix times a few columns reads the matrix's rows and the
columns, in whatever layout they come. Everything the task computes from the product (addmm's
bias, an activation, a residual) is planned by the pointwise template over the task's outputs,
with the product as one more input that the kernel never loads: it has the fp32 sum.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
import torch.fx as fx

from agent_backend.specs import Task, TensorSpec, dtype_name
from agent_backend.task import Subgraph
from skills.pointwise.errors import Unsupported
from skills.pointwise.plan import PointwisePlan, metas_until
from skills.pointwise.plan import build_plan as pointwise_plan
from skills.rewrites.graph import aten, call, copy_graph, plain_product_problem

MAX_VECTORS = 16  # two 8-wide tiles of the tensor cores' m16n8k16 product
DTYPES = (torch.bfloat16, torch.float16)
PRODUCTS = (aten.mm.default, aten.addmm.default)
# Views the product's operands may be of the task's inputs: each keeps the input's data pointer.
VIEWS = (aten.permute.default, aten.t.default, aten.transpose.int, aten.view.default,
         aten._unsafe_view.default, aten.reshape.default, aten.expand.default)


@dataclass(frozen=True)
class Operand:
    input: int                  # the task input it reads
    strides: tuple[int, int]    # elements between consecutive (rows or vectors, k)


@dataclass(frozen=True)
class SkinnyPlan:
    dtype: torch.dtype
    rows: int                   # the matrix's rows: outputs per vector
    vectors: int                # at most MAX_VECTORS
    k: int
    matrix: Operand             # strides (row, k); k's is 1
    vector: Operand             # strides (vector, k)
    place: tuple[int, int]      # the product's element (row, vector): its place in the epilogue's order
    epilogue: PointwisePlan     # the task's outputs from its inputs and the product (input `product`)
    product: int                # = len(inputs)
    inputs: tuple[TensorSpec, ...]

    @property
    def outputs(self) -> tuple[TensorSpec, ...]:
        return tuple(op.spec for op in self.epilogue.outputs)


def build_plan(task: Task) -> SkinnyPlan:
    """The plan of `task`, or Unsupported with why the kernel cannot take it."""
    if task.graph_module is None:
        raise Unsupported("task has no graph module")
    graph = task.graph_module.graph
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    products = [n for n in graph.nodes if n.op == "call_function" and n.target in PRODUCTS]
    if len(products) != 1:
        raise Unsupported(f"{len(products)} matrix products, not one")
    (product,) = products
    problem = plain_product_problem(product, bias_per_column=False)
    if problem:
        raise Unsupported(problem)
    metas = metas_until(graph, task.inputs, product)
    dtype = metas[product].dtype
    if dtype not in DTYPES:
        raise Unsupported(f"a {dtype} product: tensor cores would compute it in another precision")
    addmm = product.target is aten.addmm.default
    a, b = product.args[1:3] if addmm else product.args[:2]
    (m, k), n = metas[a].shape, metas[b].shape[1]
    if min(m, n) > MAX_VECTORS:
        raise Unsupported(f"{product.name} multiplies a {m} x {k} matrix by a {k} x {n} one: "
                          f"more than {MAX_VECTORS} vectors on either side")
    if any(s.shape != (m, n) for s in task.outputs):
        raise Unsupported(f"an output is not of the product's shape {(m, n)}")
    epilogue = _epilogue(task, product, TensorSpec((m, n), (n, 1), dtype_name(dtype), "cuda"))
    place = task.outputs[0].stride  # the outputs are dense: an element's offset is its place in their order
    a_strides, b_strides = metas[a].stride(), metas[b].stride()
    if m <= n:  # a's rows are the vectors, b's columns the matrix's rows: out[vector, row]
        rows, vectors = n, m
        matrix, vector = (b_strides[1], b_strides[0]), a_strides
        operands, place = (b, a), place[::-1]
    else:
        rows, vectors = m, n
        matrix, vector = a_strides, (b_strides[1], b_strides[0])
        operands = (a, b)
    if matrix[1] != 1 and k > 1:
        raise Unsupported(f"the matrix of {product.name} is not contiguous along k (stride {matrix[1]})")
    return SkinnyPlan(dtype, rows, vectors, k, _operand(operands[0], placeholders, metas, matrix),
                      _operand(operands[1], placeholders, metas, vector), tuple(place), epilogue, len(placeholders),
                      tuple(task.inputs))


def _epilogue(task: Task, product: fx.Node, spec: TensorSpec) -> PointwisePlan:
    """The pointwise plan of the task with its product an input (the last), addmm's bias added
    to it; Unsupported where that template cannot take what the task computes from the product."""
    graph = copy_graph(task.graph_module)
    node = next(n for n in graph.nodes if n.name == product.name)
    last = [n for n in graph.nodes if n.op == "placeholder"][-1]
    with graph.inserting_after(last):
        value = graph.placeholder("product")
    if node.target is aten.addmm.default:
        with graph.inserting_after(node):
            value = call(graph, aten.add.Tensor, value, node.args[0])
    node.replace_all_uses_with(value)
    graph.erase_node(node)
    graph.eliminate_dead_code()
    # the inputs only the product reads (its matrix and vectors) stand as scalars: the plan never
    # loads them, and its inputs must broadcast to the outputs
    unread = [not p.users for p in graph.nodes if p.op == "placeholder"]
    inputs = tuple(TensorSpec((), (), s.dtype, s.device) if gone else s for s, gone in zip(task.inputs, unread))
    try:
        return pointwise_plan(dataclasses.replace(task, graph_module=Subgraph(graph), inputs=inputs + (spec,)))
    except Unsupported as e:
        raise Unsupported(f"its epilogue: {e}") from e


def _operand(node: fx.Node, placeholders: list[fx.Node], metas: dict, strides: tuple[int, int]) -> Operand:
    """The task input `node` is (a view of, at its data pointer), read with `strides`."""
    root = node
    while root.op == "call_function" and root.target in VIEWS:
        root = root.args[0]
    if root.op != "placeholder" or metas[node].storage_offset() != 0:
        raise Unsupported(f"{node.name} is not a view of an input at its start")
    return Operand(placeholders.index(root), (int(strides[0]), int(strides[1])))
