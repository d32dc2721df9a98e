"""A matrix-vector product as the row reduction it is. out[m, n] = sum_k a[m, k] b[k, n], so an
mm or addmm whose left operand has one row (nn.Linear at batch 1: x @ W.t()) or whose right
operand has one column (A @ v), or a few (MAX_VECTORS), is a product broadcast over (m, k, n) and
summed over k. The rows plan then reads the matrix once, with one output per row. Every row
reads the vector (it is served from L1 and L2), and the bias and any epilogue become per-row
values. Where there are several vectors, the rows reading one matrix row are neighbours, and a
thread takes them all at once (codegen's Launch.lanes): the matrix row's vector loaded once, each
vector's, and as many sums.

Products and sums stay in fp32 (the plan rounds only where an output is stored), as cuBLAS
computes half-precision GEMMs, and the sum accumulates in double across each thread's vectors.

On an H200 (2026-11-27, benchmarks/results/gemv_probe-h200-...), with do_bench:
- x @ W.t() in fp32 at 4096 x 4096: the rows kernel took 21.2 us against cuBLAS's 32.9;
- at 14336 x 4096: 58.8 us against 72.4.
"""
from __future__ import annotations

import dataclasses

import torch
import torch.fx as fx

from agent_backend.specs import Task
from agent_backend.task import Subgraph
from skills.pointwise.errors import Unsupported
from skills.pointwise.plan import meta_result
from skills.rewrites.graph import aten, call, copy_graph, plain_product_problem

PRODUCTS = {aten.mm.default, aten.addmm.default}
# Products of a few vectors (a Linear's batch of a few rows), by dtype. x @ W.t() with W 14336 x
# 4096 against cuBLAS, do_bench (benchmarks/skinny_linear.py):
# - rows of x read by threads of their own, each rereading W's row from L2 (an H200, 2026-11-27,
#   skinny_linear-h200-...-thirtyfirst): fp32 2 rows 77.4 us against 92.5, 4 rows 110.8 against
#   97.5; bf16 2 rows 45.9 against 40.7;
# - a thread taking every row of x (an H100, 2026-11-27, skinny_linear-h100-...-thirtysecond):
#   fp32 4 rows 97.4 us against 115.2, 8 rows 131.0 against 148.1; bf16 2 rows 50.9 against 54.2,
#   4 rows 63.0 against 54.0, 8 rows 95.6 against 54.6 (each row of x's elements converted from
#   bf16 for every W row: more instructions than W's read allows).
MAX_VECTORS = {torch.float32: 8}
MAX_HALF_VECTORS = 2  # fp16 / bf16


def most_vectors(dtype: torch.dtype) -> int:
    """The most vectors (rows of the left operand, or columns of the right) a product of `dtype` may have."""
    return MAX_VECTORS.get(dtype, MAX_HALF_VECTORS)


def lower_products(task: Task) -> Task:
    """`task` with each mm/addmm written as a broadcast product summed over k, or `task` itself
    where it has none. Unsupported where one multiplies more than MAX_VECTORS vectors."""
    if task.graph_module is None or not any(n.op == "call_function" and n.target in PRODUCTS
                                            for n in task.graph_module.graph.nodes):
        return task
    graph = copy_graph(task.graph_module)
    products = [n for n in graph.nodes if n.op == "call_function" and n.target in PRODUCTS]
    metas = _metas(graph, task, products[-1])
    for node in products:
        _lower(graph, node, metas)
    return dataclasses.replace(task, graph_module=Subgraph(graph))


def _metas(graph: fx.Graph, task: Task, last: fx.Node) -> dict[fx.Node, torch.Tensor]:
    """Every value up to `last` as a meta tensor, from meta tensors of the task's inputs (not the
    nodes' metadata: a task may be resized, or its graph carry none)."""
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    metas = {p: torch.empty_strided(s.shape, s.stride, dtype=s.torch_dtype, device="meta")
             for p, s in zip(placeholders, task.inputs)}
    for node in graph.nodes:
        if node.op == "call_function":
            metas[node] = meta_result(node, metas)  # Unsupported where an op fails on meta tensors
            if node is last:
                break
    return metas


def _lower(graph: fx.Graph, product: fx.Node, metas: dict[fx.Node, torch.Tensor]) -> None:
    problem = plain_product_problem(product, bias_per_column=False)  # any bias adds per output
    if problem:
        raise Unsupported(problem)
    addmm = product.target is aten.addmm.default
    a, b = product.args[1:3] if addmm else product.args[:2]
    (m, k), n = metas[a].shape, metas[b].shape[1]
    most = most_vectors(metas[product].dtype)
    if min(m, n) > most:
        raise Unsupported(f"{product.name} multiplies a {m} x {k} matrix by a {k} x {n} one: "
                          f"more than {most} vectors on either side in {metas[product].dtype}")
    with graph.inserting_before(product):
        terms = call(graph, aten.mul.Tensor, call(graph, aten.unsqueeze.default, a, 2),
                     call(graph, aten.unsqueeze.default, b, 0))
        total = call(graph, aten.sum.dim_IntList, terms, [1], like=product)
        if addmm:
            total = call(graph, aten.add.Tensor, product.args[0], total, like=product)
    product.replace_all_uses_with(total)
    graph.erase_node(product)
