"""A matrix-vector product as the row reduction it is. out[m, n] = sum_k a[m, k] b[k, n], so an
mm or addmm whose left operand has one row (nn.Linear at batch 1: x @ W.t()) or whose right
operand has one column (A @ v), or two (MAX_VECTORS), is a product broadcast over (m, k, n) and
summed over k. The rows plan then reads the matrix once, with one output per row. Every row
reads the vector (it is served from L1 and L2), and the bias and any epilogue become per-row
values.

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
# A product of two vectors (a Linear's batch of 2 rows) is taken too. Each matrix row is then read
# by two of the plan's rows, which the plan puts next to each other, so the second read comes from
# L2. On an H200 (2026-11-27, benchmarks/results/skinny_linear-h200-...), x @ W.t() against cuBLAS
# with W 14336 x 4096:
# - fp32: 2 rows of x 77.4 us against 92.5; 4 rows 110.8 against 97.5;
# - bf16: 2 rows 45.9 against 40.7.
# Time grows with the rows of x, as the rereads come from L2; a kernel taking every vector's
# product from one load of the matrix is what more would need.
MAX_VECTORS = 2


def lower_products(task: Task) -> Task:
    """`task` with each mm/addmm written as a broadcast product summed over k, or `task` itself
    where it has none. Unsupported where one multiplies more than MAX_VECTORS vectors."""
    if task.graph_module is None or not any(n.op == "call_function" and n.target in PRODUCTS
                                            for n in task.graph_module.graph.nodes):
        return task
    graph = copy_graph(task.graph_module)
    products = [n for n in graph.nodes if n.op == "call_function" and n.target in PRODUCTS]
    shapes = _shapes(graph, task, products[-1])
    for node in products:
        _lower(graph, node, shapes)
    return dataclasses.replace(task, graph_module=Subgraph(graph))


def _shapes(graph: fx.Graph, task: Task, last: fx.Node) -> dict[fx.Node, tuple[int, ...]]:
    """The shape of every value up to `last`, on meta tensors of the task's inputs (not the
    nodes' metadata: a task may be resized, or its graph carry none)."""
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    metas = {p: torch.empty_strided(s.shape, s.stride, dtype=s.torch_dtype, device="meta")
             for p, s in zip(placeholders, task.inputs)}
    for node in graph.nodes:
        if node.op == "call_function":
            metas[node] = meta_result(node, metas)  # Unsupported where an op fails on meta tensors
            if node is last:
                break
    return {node: tuple(meta.shape) for node, meta in metas.items()}


def _lower(graph: fx.Graph, product: fx.Node, shapes: dict[fx.Node, tuple[int, ...]]) -> None:
    problem = plain_product_problem(product, bias_per_column=False)  # any bias adds per output
    if problem:
        raise Unsupported(problem)
    addmm = product.target is aten.addmm.default
    a, b = product.args[1:3] if addmm else product.args[:2]
    (m, k), n = shapes[a], shapes[b][1]
    if min(m, n) > MAX_VECTORS:
        raise Unsupported(f"{product.name} multiplies a {m} x {k} matrix by a {k} x {n} one: "
                          f"more than {MAX_VECTORS} vectors on either side")
    with graph.inserting_before(product):
        terms = call(graph, aten.mul.Tensor, call(graph, aten.unsqueeze.default, a, 2),
                     call(graph, aten.unsqueeze.default, b, 0))
        total = call(graph, aten.sum.dim_IntList, terms, [1], like=product)
        if addmm:
            total = call(graph, aten.add.Tensor, product.args[0], total, like=product)
    product.replace_all_uses_with(total)
    graph.erase_node(product)
