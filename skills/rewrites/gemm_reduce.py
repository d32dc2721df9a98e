"""gemm_reduce: a matrix product whose output is summed (or averaged) over its last dim is a
matrix-vector product with the summed weight, since sum_n (A B)[., n] = A (sum_n B[:, n]):
a GEMM of m*n*k multiply-adds becomes one pass over B and a GEMV.

Between the product and the reduction there may be reshapes that keep the last dim and
multiplications or divisions by constants (they commute with the sum, and are applied again,
in the same order, to the reduced result). fp16/bf16 operands are summed and multiplied in
fp32 and rounded once at the end, so the rewrite is never less accurate than the reference; there
the GEMV is written as a product and a sum over k, which Inductor fuses into one reduction.
"""
from __future__ import annotations

import torch
import torch.fx as fx

from .graph import RESHAPE_OPS, aten, call, dtype, is_scalar, only_user, plain_product_problem, reduced_dims, shape
from .rule import Rule

MATMULS = {aten.mm.default, aten.addmm.default, aten.bmm.default}
SCALE_OPS = {aten.mul.Tensor, aten.div.Tensor}
REDUCTIONS = {aten.sum.dim_IntList, aten.mean.dim}


def _chain_to_reduction(mm: fx.Node):
    """(reshapes and scale ops between `mm` and its reduction, the reduction), or a reason."""
    chain, node = [], mm
    n = shape(mm)[-1]
    while True:
        user = only_user(node)
        if user is None:
            return f"{node.name} has {len(node.users)} users, not one reduction"
        if user.target in RESHAPE_OPS and shape(user) and shape(user)[-1] == n:
            chain.append(user)
        elif user.target in SCALE_OPS and user.args[0] is node and is_scalar(user.args[1]):
            chain.append(user)
        elif user.target in REDUCTIONS:
            dims = reduced_dims(user)
            if dims is None or dims[0] != (len(shape(node)) - 1,):
                return f"{user.name} does not reduce over the product's last dim alone"
            return chain, user
        else:
            return f"{user.name} ({user.target}) between the product and the reduction is not linear"
        node = user


def _rewrite(graph: fx.Graph, mm: fx.Node, chain: list[fx.Node], reduction: fx.Node) -> str | None:
    problem = plain_product_problem(mm, bias_per_column=False)  # any bias sums over N the same way
    if problem:
        return problem
    a, b = (mm.args[1], mm.args[2]) if mm.target is aten.addmm.default else (mm.args[0], mm.args[1])
    out_dtype = reduction.meta["val"].dtype
    acc = torch.float32 if out_dtype in (torch.float16, torch.bfloat16) else out_dtype
    with graph.inserting_before(reduction):
        b_sum = call(graph, aten.sum.dim_IntList, b, [-1], True, dtype=acc)
        if dtype(a) == acc:
            product = call(graph, aten.bmm.default if mm.target is aten.bmm.default else aten.mm.default, a, b_sum)
        else:
            # a half-precision operand times the fp32 summed weight, summed over k: one reduction
            # Inductor fuses, reading the operand once, not a copy of it in fp32 for an fp32 GEMV
            # (which wrote 32 MB a call and took two more launches for a 2048 x 4096 operand)
            b_row = call(graph, aten.transpose.int, b_sum, -1, -2)
            product = call(graph, aten.sum.dim_IntList, call(graph, aten.mul.Tensor, a, b_row), [-1], True)
        if mm.target is aten.addmm.default:
            bias_sum = call(graph, aten.sum.dim_IntList, mm.args[0], [-1], True, dtype=acc)
            product = call(graph, aten.add.Tensor, product, bias_sum)
        result = call(graph, aten.reshape.default, product, list(shape(reduction)))
        if reduction.target is aten.mean.dim:
            result = call(graph, aten.div.Tensor, result, shape(mm)[-1])
        for op in chain:
            if op.target in SCALE_OPS:
                result = call(graph, op.target, result, op.args[1])
        if acc != out_dtype:
            result = call(graph, torch.ops.prims.convert_element_type.default, result, out_dtype)
    result.meta.update({k: v for k, v in reduction.meta.items() if k == "val"})
    reduction.replace_all_uses_with(result)
    return None


def apply(graph: fx.Graph) -> str | None:
    reasons = []
    for mm in [n for n in graph.nodes if n.op == "call_function" and n.target in MATMULS]:
        found = _chain_to_reduction(mm)
        if isinstance(found, str):
            reasons.append(found)
            continue
        why = _rewrite(graph, mm, *found)
        if why is None:
            return None
        reasons.append(why)
    return "; ".join(reasons) if reasons else "no matrix product"


RULE = Rule("gemm_reduce", "sum/mean over a matrix product's last dim -> GEMV on the summed weight", apply)
