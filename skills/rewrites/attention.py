"""attention: attention written by hand (batched matmul, an optional constant scale, an optional
mask, softmax over the last dim, batched matmul) becomes one fused attention call,
aten.scaled_dot_product_attention, which never writes the score matrix to memory.

The mask is kept exactly as the program computes it: `where(cond, -inf, scores)` becomes a
boolean mask (True where a score takes part), `scores + mask` an additive one; no mask is
assumed causal, since a mask that arrives as an input may hold any values.
"""
from __future__ import annotations

import math

import torch.fx as fx

from .graph import RESHAPE_OPS, aten, call, dtype, is_scalar, only_user, prims, reduced_dims, shape
from .rule import Rule

PASS_THROUGH = RESHAPE_OPS | {aten.expand.default, prims.convert_element_type.default}


def _skip(node: fx.Node, ops) -> fx.Node:
    """Follow single users through `ops`; the last node reached."""
    while (user := only_user(node)) is not None and user.target in ops:
        node = user
    return node


def _is_neg_inf(node) -> bool:
    return (isinstance(node, fx.Node) and node.target is aten.full.default and node.args[1] == -math.inf) or \
        node == -math.inf


def _softmax(x: fx.Node):
    """(the softmax's output node) if x feeds exactly amax(x,[-1],True) -> sub -> exp -> sum -> div."""
    users = list(x.users)
    amax = next((u for u in users if u.target is aten.amax.default), None)
    sub = next((u for u in users if u.target is aten.sub.Tensor), None)
    if len(users) != 2 or amax is None or sub is None or sub.args != (x, amax):
        return None
    if reduced_dims(amax) != ((len(shape(x)) - 1,), True):
        return None
    exp = only_user(sub)
    if exp is None or exp.target is not aten.exp.default:
        return None
    total = next((u for u in exp.users if u.target is aten.sum.dim_IntList), None)
    div = next((u for u in exp.users if u.target is aten.div.Tensor), None)
    if len(exp.users) != 2 or total is None or div is None or div.args != (exp, total):
        return None
    if reduced_dims(total) != ((len(shape(x)) - 1,), True):
        return None
    return div


def _match(first: fx.Node):
    """(scale, mask kind, mask node, second bmm) of the pattern starting at bmm `first`, or why not."""
    node = _skip(first, RESHAPE_OPS)
    scale = None
    user = only_user(node)
    if user is not None and user.target in (aten.mul.Tensor, aten.div.Tensor) and is_scalar(user.args[1]):
        scale = user.args[1] if user.target is aten.mul.Tensor else 1.0 / user.args[1]
        node = user
    mask_kind, mask = None, None
    user = only_user(node)
    if user is not None and user.target is aten.where.self:
        cond, when_true, when_false = user.args
        if when_false is node and _is_neg_inf(when_true):
            mask_kind, mask = "drop", cond
        elif when_true is node and _is_neg_inf(when_false):
            mask_kind, mask = "keep", cond
        else:
            return "the where() around the scores does not fill with -inf"
        node = user
    elif user is not None and user.target is aten.add.Tensor and isinstance(user.args[1], fx.Node):
        mask_kind, mask, node = "add", user.args[1], user
    node = _skip(node, {prims.convert_element_type.default})
    soft = _softmax(node)
    if soft is None:
        return "no softmax over the last dim of the scores"
    end = _skip(soft, PASS_THROUGH)
    second = only_user(end)
    if second is None or second.target is not aten.bmm.default or second.args[0] is not end:
        return "the softmax does not feed a second batched matmul"
    return scale, mask_kind, mask, second, node


def _rewrite(graph: fx.Graph, first: fx.Node, scale, mask_kind, mask, second: fx.Node, scores: fx.Node) -> None:
    q, k_t = first.args
    v = second.args[1]
    batch, seq_q, head_dim = shape(q)
    seq_k = shape(k_t)[2]
    scores_shape = shape(scores)  # [.., seq_q, seq_k]: the shape the mask broadcasts to
    lead = list(scores_shape[:-2]) if len(scores_shape) > 3 else [1, batch]
    with graph.inserting_before(second):
        q4 = call(graph, aten.reshape.default, q, lead + [seq_q, head_dim])
        k4 = call(graph, aten.reshape.default, call(graph, aten.transpose.int, k_t, 1, 2), lead + [seq_k, head_dim])
        v4 = call(graph, aten.reshape.default, v, lead + [seq_k, shape(v)[2]])
        kwargs = {"scale": 1.0 if scale is None else float(scale)}
        if mask_kind is not None:
            attn_mask = mask
            if mask_kind == "drop":
                attn_mask = call(graph, aten.logical_not.default, mask)
            elif dtype(mask) != dtype(q):
                attn_mask = call(graph, prims.convert_element_type.default, mask, dtype(q))
            if len(scores_shape) == 3:  # masks broadcast against [batch, q, k]; the call sees [1, batch, q, k]
                attn_mask = call(graph, aten.unsqueeze.default, attn_mask, 0)
            kwargs["attn_mask"] = attn_mask
        out = call(graph, aten.scaled_dot_product_attention.default, q4, k4, v4, **kwargs)
        result = call(graph, aten.reshape.default, out, list(shape(second)), like=second)
    second.replace_all_uses_with(result)


def apply(graph: fx.Graph) -> str | None:
    reasons = []
    for first in [n for n in graph.nodes if n.op == "call_function" and n.target is aten.bmm.default]:
        found = _match(first)
        if isinstance(found, str):
            reasons.append(found)
            continue
        _rewrite(graph, first, *found)
        return None
    return "; ".join(dict.fromkeys(reasons)) if reasons else "no batched matmul"


RULE = Rule("attention", "bmm -> scale -> mask -> softmax -> bmm -> scaled_dot_product_attention", apply)
