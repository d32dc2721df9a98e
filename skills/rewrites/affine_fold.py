"""affine_fold: a per-channel affine epilogue of a convolution or a matrix product (inference
BatchNorm: (y - mean) / sqrt(var + eps) * weight + bias, or any chain of adds, subtractions,
multiplications and divisions by per-channel values) is folded into the product's weights and
bias: y * A + B with A = the product of the factors, B = the chain applied to 0, so
conv(x, w) * A + B = conv(x, w * A, bias * A + B). The pass over the output that applied the
affine chain is gone; on a GPU, a ReLU that follows goes into the same cuDNN call
(aten.cudnn_convolution_relu).

The factors are runtime values (running statistics are inputs of the task), so A and B are
computed in the candidate, on C values, in the order the reference applies them; convert_element_type
steps (the fp32 upcast around bf16 BatchNorm) are kept out of the chain, and A, B are computed in
fp32 for fp16/bf16 products and rounded once with the folded weights.
"""
from __future__ import annotations

import torch
import torch.fx as fx

from .graph import aten, call, dtype, is_scalar, only_user, plain_product_problem, prims, shape
from .rule import Rule

AFFINE_OPS = {aten.add.Tensor, aten.sub.Tensor, aten.mul.Tensor, aten.div.Tensor}


def _depends_on(node, target: fx.Node) -> bool:
    stack, seen = [node], set()
    while stack:
        n = stack.pop()
        if n is target:
            return True
        if isinstance(n, fx.Node) and n not in seen:
            seen.add(n)
            stack.extend(n.all_input_nodes)
    return False


def _per_channel(other, out_shape: tuple[int, ...], channel_dim: int) -> bool:
    """A scalar, or a tensor broadcast along every dim of the output but its channel dim."""
    if is_scalar(other):
        return True
    s = shape(other)
    if s is None or len(s) > len(out_shape):
        return False
    aligned = (1,) * (len(out_shape) - len(s)) + s
    return all(size == 1 or (d == channel_dim and size == out_shape[d]) for d, size in enumerate(aligned))


def _affine_chain(product: fx.Node, channel_dim: int):
    """([(op, other, product_first)], last node of the chain), following single users."""
    steps, node, out_shape = [], product, shape(product)
    while True:
        user = only_user(node)
        if user is None or user.op != "call_function":
            break
        if user.target is prims.convert_element_type.default:
            node = user
            continue
        if user.target not in AFFINE_OPS or user.kwargs or len(user.args) != 2 or shape(user) != out_shape:
            break
        first = user.args[0] is node
        other = user.args[1] if first else user.args[0]
        if (not first and user.args[1] is not node) or _depends_on(other, product) \
                or not _per_channel(other, out_shape, channel_dim):
            break
        steps.append((user.target, other, first))
        node = user
    while node is not product and node.target is prims.convert_element_type.default:
        node = node.args[0]  # a trailing upcast is not folded: the chain ends where its last op is
    return steps, node


def _fold(graph: fx.Graph, steps, acc: torch.dtype, channels: int, like: fx.Node):
    """Nodes A and B (shape [channels], dtype acc) with chain(y) = y * A + B; B is the chain
    applied to 0, in the reference's order of operations."""
    def add(x, y):
        if is_scalar(x) and is_scalar(y):
            return x + y
        if is_scalar(x) and x == 0.0:
            return y
        return call(graph, aten.add.Tensor, *((y, x) if is_scalar(x) else (x, y)))

    def sub(x, y):
        if is_scalar(x) and is_scalar(y):
            return x - y
        return add(call(graph, aten.neg.default, y), x) if is_scalar(x) else call(graph, aten.sub.Tensor, x, y)

    def mul(x, y):
        if is_scalar(x) and is_scalar(y):
            return x * y
        if is_scalar(x) and x == 1.0:
            return y
        return call(graph, aten.mul.Tensor, *((y, x) if is_scalar(x) else (x, y)))

    def div(x, y):
        if is_scalar(y):
            return x / y if is_scalar(x) else call(graph, aten.div.Tensor, x, y)
        return call(graph, aten.div.Tensor, x, y) if not is_scalar(x) else mul(call(graph, aten.reciprocal.default, y), x)

    def vec(v):  # a per-channel operand as [C] (or [1]) in the accumulation dtype
        if is_scalar(v):
            return v
        v = call(graph, prims.convert_element_type.default, v, acc) if dtype(v) != acc else v
        return call(graph, aten.reshape.default, v, [-1])

    a, b = 1.0, 0.0
    for target, other, product_first in steps:
        o = vec(other)
        if target is aten.add.Tensor:
            b = add(b, o)
        elif target is aten.sub.Tensor and product_first:
            b = sub(b, o)
        elif target is aten.sub.Tensor:  # other - y
            a, b = mul(a, -1.0), sub(o, b)
        elif target is aten.mul.Tensor:
            a, b = mul(a, o), mul(b, o)
        else:
            a, b = div(a, o), div(b, o)

    def as_vector(v):
        if is_scalar(v):
            return call(graph, aten.full.default, [channels], v, dtype=acc, device=like.meta["val"].device)
        return call(graph, aten.expand.default, v, [channels])

    return as_vector(a), as_vector(b)


def _rewrite(graph: fx.Graph, product: fx.Node, steps, end: fx.Node) -> None:
    is_conv = product.target is aten.convolution.default
    out_dtype = dtype(product)
    acc = torch.float32 if out_dtype in (torch.float16, torch.bfloat16) else out_dtype
    out_shape = shape(product)
    channels = out_shape[1] if is_conv else out_shape[-1]
    relu = only_user(end)
    fuse_relu = (is_conv and relu is not None and relu.target is aten.relu.default
                 and product.meta["val"].device.type == "cuda")
    with graph.inserting_before(end):
        a, b = _fold(graph, steps, acc, channels, product)
        if is_conv:
            x, w, bias, *rest = product.args
            scale_shape = [channels] + [1] * (len(shape(w)) - 1)
        else:
            bias, x, w = product.args[:3] if product.target is aten.addmm.default else (None, *product.args[:2])
            scale_shape = [1, channels]
        w_acc = call(graph, prims.convert_element_type.default, w, acc) if dtype(w) != acc else w
        new_w = call(graph, aten.mul.Tensor, w_acc, call(graph, aten.reshape.default, a, scale_shape))
        new_b = b if bias is None else call(graph, aten.add.Tensor, call(graph, aten.mul.Tensor, bias, a), b)
        if acc != out_dtype:
            new_w = call(graph, prims.convert_element_type.default, new_w, out_dtype)
            new_b = call(graph, prims.convert_element_type.default, new_b, out_dtype)
        if is_conv and fuse_relu:
            stride, padding, dilation, _transposed, _out_padding, groups = rest
            result = call(graph, aten.cudnn_convolution_relu.default, x, new_w, new_b, stride, padding, dilation, groups)
        elif is_conv:
            result = call(graph, aten.convolution.default, x, new_w, new_b, *rest)
        else:
            result = call(graph, aten.addmm.default, new_b, x, new_w)
        if dtype(end) != out_dtype:  # the chain ended in the fp32 upcast: its users expect fp32
            result = call(graph, prims.convert_element_type.default, result, dtype(end))
        result.meta["val"] = (relu if fuse_relu else end).meta["val"]
    (relu if fuse_relu else end).replace_all_uses_with(result)


def apply(graph: fx.Graph) -> str | None:
    reasons = []
    for product in [n for n in graph.nodes if n.op == "call_function"
                    and n.target in (aten.convolution.default, aten.addmm.default, aten.mm.default)
                    and shape(n) is not None]:  # (a product an earlier rule wrote has no shape meta)
        if product.target is aten.convolution.default and product.args[6]:
            reasons.append(f"{product.name} is a transposed convolution")
            continue
        problem = None if product.target is aten.convolution.default else plain_product_problem(product)
        if problem:
            reasons.append(problem)
            continue
        channel_dim = 1 if product.target is aten.convolution.default else len(shape(product)) - 1
        steps, end = _affine_chain(product, channel_dim)
        if not any(not is_scalar(other) for _, other, _ in steps):
            reasons.append(f"no per-channel affine op of {product.name} alone follows it")
            continue
        _rewrite(graph, product, steps, end)
        return None
    return "; ".join(reasons) if reasons else "no convolution or 2-D matrix product"


RULE = Rule("affine_fold", "conv/linear + per-channel affine (inference BatchNorm) -> folded weights and bias "
            "(+ ReLU in the cuDNN call on a GPU)", apply)
