"""attention: attention written by hand (batched matmul, an optional constant scale, an optional
mask, softmax over the last dim, batched matmul) becomes one fused attention call,
aten.scaled_dot_product_attention, which never writes the score matrix to memory.

The mask is kept exactly as the program computes it: `where(cond, -inf, scores)` becomes a
boolean mask (True where a score takes part), `scores + mask` an additive one; no mask is
assumed causal, since a mask that arrives as an input may hold any values.

torch's own math path of scaled_dot_product_attention (what a compiled graph holds where no
fused kernel was chosen at trace time, as for BERT's padding mask on the GPU) is this pattern
too, with three twists: q and k are each scaled by sqrt(scale) before the product, half-precision
inputs are cast up to float32 and the result back down, and the softmax is a "safe" one that
gives 0, not NaN, for rows whose scores are all -inf. The rule folds the scales into the call's
scale, calls it on the half-precision inputs (the fused kernels accumulate in float32 all the
same; the verifier's float64 check judges the rounding) and keeps the safe softmax's zeros.
"""
from __future__ import annotations

import math

import torch
import torch.fx as fx

from .graph import RESHAPE_OPS, aten, call, dtype, is_scalar, only_user, prims, reduced_dims, shape
from .rule import Rule

PASS_THROUGH = RESHAPE_OPS | {aten.expand.default, prims.convert_element_type.default}
# What lies between a bmm operand and the 4-D tensor it was made from, changing no value.
COPIES = RESHAPE_OPS | {aten.clone.default, aten.expand.default}
HALF = (torch.bfloat16, torch.float16)


def _skip(node: fx.Node, ops) -> fx.Node:
    """Follow single users through `ops`; the last node reached."""
    while (user := only_user(node)) is not None and user.target in ops:
        node = user
    return node


def _is_neg_inf(node) -> bool:
    return (isinstance(node, fx.Node) and node.target is aten.full.default and node.args[1] == -math.inf) or \
        node == -math.inf


def _softmax(x: fx.Node):
    """(the softmax's output node, whether it is torch's safe softmax) if x feeds exactly
    amax(x,[-1],True) -> sub -> exp -> sum -> div, the safe one also x == -inf -> a where()
    that zeros the rows where every score is -inf; else None."""
    users = list(x.users)
    amax = next((u for u in users if u.target is aten.amax.default), None)
    sub = next((u for u in users if u.target is aten.sub.Tensor), None)
    eq = next((u for u in users if u.target is aten.eq.Scalar and u.args[1] == -math.inf), None)
    if len(users) != 2 + (eq is not None) or amax is None or sub is None or sub.args != (x, amax):
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
    if eq is None:
        return div, False
    guard = _safe_guard(eq, div, len(shape(x)))
    return (guard, True) if guard is not None else None


def _safe_guard(eq: fx.Node, div: fx.Node, rank: int) -> fx.Node | None:
    """where(not any(not eq, -1, True), 0, div): the safe softmax's zeros for rows all -inf."""
    not_eq = only_user(eq)
    anyone = only_user(not_eq) if not_eq is not None and not_eq.target is aten.logical_not.default else None
    if anyone is None or anyone.target is not aten.any.dim or anyone.args[1] not in (-1, rank - 1) or \
            not (len(anyone.args) > 2 and anyone.args[2]):
        return None
    dead = only_user(anyone)
    where = only_user(div)
    if dead is None or dead.target is not aten.logical_not.default or where is None or \
            where.target is not aten.where.self or where.args[0] is not dead or where.args[2] is not div:
        return None
    zeros = where.args[1]
    is_zero = zeros == 0 or (isinstance(zeros, fx.Node) and zeros.target is aten.full.default and zeros.args[1] == 0)
    return where if is_zero else None


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
    found = _softmax(node)
    if found is None:
        return "no softmax over the last dim of the scores"
    soft, safe = found
    end = _skip(soft, PASS_THROUGH)
    second = only_user(end)
    if second is None or second.target is not aten.bmm.default or second.args[0] is not end:
        return "the softmax does not feed a second batched matmul"
    return scale, mask_kind, mask, second, node, safe


def _as_4d(graph: fx.Graph, operand: fx.Node, shape4: list[int]) -> fx.Node:
    """bmm operand `operand` as a 4-D tensor of shape `shape4`: the one it is a copy or view of
    (torch's matmul flattens [b, h, s, d] to [b*h, s, d] through expand, clone and reshape), else
    a reshape of it."""
    node = operand
    while node.op == "call_function" and node.target in COPIES and shape(node) != tuple(shape4):
        if node.target is aten.expand.default and shape(node.args[0]) != shape(node):
            break  # a real broadcast (k/v heads shared), not a copy
        node = node.args[0]
    else:
        while node.op == "call_function" and node.target in COPIES and shape(node.args[0]) == tuple(shape4):
            node = node.args[0]  # the expand to its own shape and the clone above it change nothing
        if shape(node) == tuple(shape4):
            return node
    return call(graph, aten.reshape.default, operand, shape4)


def _cast_up_from(node: fx.Node) -> tuple[fx.Node, float, list[fx.Node]] | None:
    """(half-precision source, scale, layout ops) if `node` is `source` cast up to float32, laid
    out by permutes and multiplied by constants; the layout ops innermost first."""
    factor, layout = 1.0, []
    while node.op == "call_function":
        if node.target in (aten.permute.default, aten.transpose.int):
            layout.append(node)
        elif node.target in (aten.mul.Tensor, aten.mul.Scalar) and is_scalar(node.args[1]):
            factor *= node.args[1]
        elif node.target is prims.convert_element_type.default and dtype(node) == torch.float32 and \
                dtype(node.args[0]) in HALF:
            return node.args[0], factor, layout[::-1]
        else:
            return None
        node = node.args[0]
    return None


def _in_half(graph: fx.Graph, q4, k4t, v4, second: fx.Node):
    """(q, k^T, v in half precision, the scale they carried, the cast down the result goes
    through) where all three are cast up from one half dtype and the result is cast back to
    it; else None."""
    found = [_cast_up_from(n) for n in (q4, k4t, v4)]
    down = only_user(_skip(second, RESHAPE_OPS))
    if any(f is None for f in found) or found[2][1] != 1.0 or down is None or \
            down.target is not prims.convert_element_type.default:
        return None
    half = {dtype(f[0]) for f in found}
    if len(half) != 1 or down.args[1] not in half:
        return None
    operands = []
    for source, _, layout in found:
        for op in layout:
            source = call(graph, op.target, source, *op.args[1:])
        operands.append(source)
    return (*operands, found[0][1] * found[1][1], down)


def _rewrite(graph: fx.Graph, first: fx.Node, scale, mask_kind, mask, second: fx.Node, scores: fx.Node,
             safe: bool) -> None:
    q, k_t = first.args
    v = second.args[1]
    batch, seq_q, head_dim = shape(q)
    seq_k = shape(k_t)[2]
    scores_shape = shape(scores)  # [.., seq_q, seq_k]: the shape the mask broadcasts to
    lead = list(scores_shape[:-2]) if len(scores_shape) > 3 else [1, batch]
    with graph.inserting_before(second):
        q4 = _as_4d(graph, q, lead + [seq_q, head_dim])
        k4t = _as_4d(graph, k_t, lead + [head_dim, seq_k])
        v4 = _as_4d(graph, v, lead + [seq_k, shape(v)[2]])
        half = _in_half(graph, q4, k4t, v4, second)
        work_dtype = dtype(q)
        if half is not None:
            q4, k4t, v4, carried, down = half
            scale, work_dtype = carried * (1.0 if scale is None else scale), down.args[1]
        k4 = call(graph, aten.transpose.int, k4t, 2, 3)
        kwargs = {"scale": 1.0 if scale is None else float(scale)}
        attn_mask = None
        if mask_kind is not None:
            attn_mask = mask
            if mask_kind == "drop":
                attn_mask = call(graph, aten.logical_not.default, mask)
            elif dtype(mask) != work_dtype:
                attn_mask = call(graph, prims.convert_element_type.default, mask, work_dtype)
            if len(scores_shape) == 3:  # masks broadcast against [batch, q, k]; the call sees [1, batch, q, k]
                attn_mask = call(graph, aten.unsqueeze.default, attn_mask, 0)
            kwargs["attn_mask"] = attn_mask
        out = call(graph, aten.scaled_dot_product_attention.default, q4, k4, v4, **kwargs)
        if safe and attn_mask is not None:
            # the safe softmax's rows with no score: zeros, whatever the fused kernel makes of them
            dead = call(graph, aten.eq.Scalar, attn_mask, -math.inf) if mask_kind == "add" else \
                call(graph, aten.logical_not.default, attn_mask)
            out = call(graph, aten.masked_fill.Scalar, out, call(graph, aten.all.dim, dead, -1, True), 0.0)
        replaced = second if half is None else down
        result = call(graph, aten.reshape.default, out, list(shape(replaced)), like=replaced)
    replaced.replace_all_uses_with(result)


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
