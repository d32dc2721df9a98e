"""Task -> SkinnyPlan: a half-precision mm or addmm of a matrix by a few vectors, as the kernel
sees it: the matrix's rows, each contiguous along k, the vectors, and where each output goes.

out[i, j] = sum_k a[i, k] b[k, j] (+ bias[i, j]). The side with at most MAX_VECTORS rows of the
product (a's rows, or b's columns) is the vectors; the other is the matrix, whose every element
is read once and must be contiguous along k. nn.Linear at a few rows of x (x @ W.t()) reads W's
rows (the matrix) and x's rows (the vectors); a matrix times a few columns reads the matrix's
rows and the columns, in whatever layout they come.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.fx as fx

from agent_backend.specs import Task, TensorSpec
from skills.pointwise.errors import Unsupported
from skills.pointwise.plan import meta_result
from skills.rewrites.graph import aten, plain_product_problem

MAX_VECTORS = 16  # two 8-wide tiles of the tensor cores' m16n8k16 product
DTYPES = (torch.bfloat16, torch.float16)
PRODUCTS = (aten.mm.default, aten.addmm.default)
# Views the product's operands may be of the task's inputs: each keeps the input's data pointer.
VIEWS = (aten.permute.default, aten.t.default, aten.transpose.int, aten.view.default,
         aten._unsafe_view.default, aten.reshape.default, aten.expand.default)


@dataclass(frozen=True)
class Operand:
    input: int                  # the task input it reads
    strides: tuple[int, int]    # elements between consecutive (rows, k) or (rows, vectors) of the output


@dataclass(frozen=True)
class SkinnyPlan:
    dtype: torch.dtype
    rows: int                   # the matrix's rows: outputs per vector
    vectors: int                # at most MAX_VECTORS
    k: int
    matrix: Operand             # strides (row, k); k's is 1
    vector: Operand             # strides (vector, k)
    bias: Operand | None        # strides (row, vector) over the output, 0 where it broadcasts
    out_strides: tuple[int, int]  # (row, vector)
    inputs: tuple[TensorSpec, ...]
    output: TensorSpec


def build_plan(task: Task) -> SkinnyPlan:
    """The plan of `task`, or Unsupported with why the kernel cannot take it."""
    graph = task.graph_module.graph
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    products = [n for n in graph.nodes if n.op == "call_function" and n.target in PRODUCTS]
    if len(products) != 1:
        raise Unsupported(f"{len(products)} matrix products, not one")
    (product,) = products
    others = [n for n in graph.nodes if n.op == "call_function" and n is not product and n.target not in VIEWS]
    if others:
        raise Unsupported(f"the task computes more than its product ({others[0].name}: {others[0].target})")
    (output,) = next(n for n in graph.nodes if n.op == "output").args
    if tuple(output) != (product,) or len(task.outputs) != 1:
        raise Unsupported("the task's output is not the product alone")
    problem = plain_product_problem(product, bias_per_column=False)
    if problem:
        raise Unsupported(problem)
    metas = _metas(placeholders, task.inputs, product)
    dtype = metas[product].dtype
    if dtype not in DTYPES:
        raise Unsupported(f"a {dtype} product: tensor cores would compute it in another precision")
    addmm = product.target is aten.addmm.default
    a, b = product.args[1:3] if addmm else product.args[:2]
    (m, k), n = metas[a].shape, metas[b].shape[1]
    if min(m, n) > MAX_VECTORS:
        raise Unsupported(f"{product.name} multiplies a {m} x {k} matrix by a {k} x {n} one: "
                          f"more than {MAX_VECTORS} vectors on either side")
    out = task.outputs[0]
    a_strides, b_strides = metas[a].stride(), metas[b].stride()
    if m <= n:  # a's rows are the vectors, b's columns the matrix's rows: out[vector, row]
        rows, vectors = n, m
        matrix, vector = (b_strides[1], b_strides[0]), a_strides
        operands, out_strides = (b, a), (out.stride[1], out.stride[0])
    else:
        rows, vectors = m, n
        matrix, vector = a_strides, (b_strides[1], b_strides[0])
        operands, out_strides = (a, b), out.stride
    if matrix[1] != 1 and k > 1:
        raise Unsupported(f"the matrix of {product.name} is not contiguous along k (stride {matrix[1]})")
    bias = None
    if addmm:
        broadcast = torch.broadcast_to(metas[product.args[0]], (m, n)).stride()
        bias = _operand(product.args[0], placeholders, metas, broadcast if m > n else broadcast[::-1])
    return SkinnyPlan(dtype, rows, vectors, k, _operand(operands[0], placeholders, metas, matrix),
                      _operand(operands[1], placeholders, metas, vector), bias, tuple(out_strides),
                      tuple(task.inputs), out)


def _metas(placeholders: list[fx.Node], specs, last: fx.Node) -> dict[fx.Node, torch.Tensor]:
    metas = {p: torch.empty_strided(s.shape, s.stride, dtype=s.torch_dtype, device="meta")
             for p, s in zip(placeholders, specs)}
    node = placeholders[-1].next if placeholders else last
    while node is not last.next:
        if node.op == "call_function":
            metas[node] = meta_result(node, metas)
        node = node.next
    return metas


def _operand(node: fx.Node, placeholders: list[fx.Node], metas: dict, strides: tuple[int, int]) -> Operand:
    """The task input `node` is (a view of, at its data pointer), read with `strides`."""
    root = node
    while root.op == "call_function" and root.target in VIEWS:
        root = root.args[0]
    if root.op != "placeholder" or metas[node].storage_offset() != 0:
        raise Unsupported(f"{node.name} is not a view of an input at its start")
    return Operand(placeholders.index(root), (int(strides[0]), int(strides[1])))
