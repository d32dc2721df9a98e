"""gemm_epilogue: a matrix product followed by ReLU, tanh-GELU or a constant scale becomes one
cuBLASLt call with that epilogue (aten._addmm_activation, or addmm's alpha and beta), so the
product is written once instead of written, read back and written again by a pointwise kernel.

Which function the epilogue computes is found by evaluating it, not by matching how it is
written: the pointwise ops between the product and some node are run in float64 on a probe of
values, and compared with relu, tanh-GELU and y -> c*y. So GPT-2's hand-written
`0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x**3)))`, F.gelu(approximate="tanh") and
their bf16 forms (upcast, compute, round) are all recognised. The epilogue then runs on the fp32
accumulator before the single rounding: never less accurate than the reference.
"""
from __future__ import annotations

import math

import torch
import torch.fx as fx

from agent_backend.env.float64 import Float64Mode
from agent_backend.partition import classify

from .graph import RESHAPE_OPS, aten, call, dtype, plain_product_problem, shape
from .rule import Rule

PRODUCTS = {aten.mm.default, aten.addmm.default}
PROBE = torch.cat([torch.tensor([1.0, 0.0, -0.0, 1e-6, -1e-6, 30.0, -30.0], dtype=torch.float64),
                   torch.linspace(-12.0, 12.0, 4801, dtype=torch.float64)])  # PROBE[0] = 1: f(1) is a scale
_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
ACTIVATIONS = {
    "relu": lambda y: torch.relu(y),
    "gelu_tanh": lambda y: 0.5 * y * (1.0 + torch.tanh(_SQRT_2_OVER_PI * (y + 0.044715 * y ** 3))),
}
MATCH_TOLERANCE = 1e-9  # float64 evaluations of the same function written two ways


def _epilogue_nodes(mm: fx.Node) -> list[fx.Node]:
    """The pointwise, reshape and constant nodes after `mm` that depend on nothing but `mm` and
    scalar constants, in graph order: each a function of the product alone."""
    inside: set[fx.Node] = {mm}
    found = []
    node = mm.next
    while node.op != "output":
        kind = classify(node).kind
        args = node.all_input_nodes
        elementwise = kind == "pointwise" or (kind == "view" and node.target in RESHAPE_OPS)
        if elementwise and args and all(a in inside or classify(a).kind == "constant" for a in args) \
                and any(a in inside for a in args):
            inside.add(node)
            found.append(node)
        node = node.next
    return found


def _function_of_product(mm: fx.Node, end: fx.Node, nodes: list[fx.Node]):
    """f with end = f(product), evaluated in float64 on PROBE (reshapes skipped: elementwise)."""
    values: dict[fx.Node, object] = {mm: PROBE}

    def value(a):
        if isinstance(a, fx.Node):
            if a not in values:  # a scalar constant
                values[a] = a.target(*a.args, **{**a.kwargs, "device": "cpu"})
            return values[a]
        return a

    with Float64Mode():
        for node in nodes:
            if node.target in RESHAPE_OPS:
                values[node] = values[node.args[0]]
            else:
                values[node] = node.target(*[value(a) for a in node.args],
                                           **{k: value(v) for k, v in node.kwargs.items()})
            if node is end:
                return values[node]
    raise AssertionError("end is not among the epilogue's nodes")


def _recognise(f: torch.Tensor) -> tuple[str, float] | None:
    """("relu"|"gelu_tanh", 1.0) or ("scale", c) for f = PROBE's image, or None."""
    if f.shape != PROBE.shape:
        return None
    scale = 1.0 + float(f.abs().max())
    for name, act in ACTIVATIONS.items():
        if float((f - act(PROBE)).abs().max()) <= MATCH_TOLERANCE * scale:
            return name, 1.0
    c = float(f[0])
    if c != 1.0 and float((f - c * PROBE).abs().max()) <= MATCH_TOLERANCE * scale:
        return "scale", c
    return None


def _self_contained(mm: fx.Node, end: fx.Node, nodes: list[fx.Node]) -> bool:
    """No value between `mm` and `end` is used by anything but the nodes leading to `end`."""
    needed, stack = set(), [end]
    while stack:
        n = stack.pop()
        if n in needed or n is mm:
            continue
        needed.add(n)
        stack.extend(a for a in n.all_input_nodes if a is mm or a in nodes)
    return all(u in needed for n in needed | {mm} if n is not end for u in n.users)


def _rewrite(graph: fx.Graph, mm: fx.Node, end: fx.Node, function: tuple[str, float]) -> None:
    name, c = function
    if mm.target is aten.addmm.default:
        bias, a, b = mm.args[:3]
    else:
        a, b = mm.args[:2]
        bias = None
    out_shape = list(shape(mm))
    with graph.inserting_before(end):
        if name == "scale":
            if bias is None:  # beta = 0: cuBLAS reads nothing from the (empty) bias
                bias = call(graph, aten.zeros.default, [1], dtype=mm.meta["val"].dtype, device=mm.meta["val"].device)
            product = call(graph, aten.addmm.default, bias, a, b, beta=c if mm.target is aten.addmm.default else 0.0,
                           alpha=c)
        else:
            if bias is None:
                bias = call(graph, aten.zeros.default, [out_shape[-1]], dtype=mm.meta["val"].dtype,
                            device=mm.meta["val"].device)
            product = call(graph, aten._addmm_activation.default, bias, a, b, use_gelu=name == "gelu_tanh")
        product.meta["val"] = mm.meta["val"]
        result = call(graph, aten.reshape.default, product, list(shape(end)), like=end)
    end.replace_all_uses_with(result)


def apply(graph: fx.Graph) -> str | None:
    reasons = []
    for mm in [n for n in graph.nodes if n.op == "call_function" and n.target in PRODUCTS]:
        problem = plain_product_problem(mm)
        if problem:
            reasons.append(problem)
            continue
        nodes = _epilogue_nodes(mm)
        # The furthest node that is still relu, tanh-GELU or a scale of the product wins.
        for end in reversed(nodes):
            if end.target in RESHAPE_OPS or dtype(end) != dtype(mm) or not _self_contained(mm, end, nodes):
                continue  # (an epilogue that ends in another dtype would round where the reference does not)
            function = _recognise(_function_of_product(mm, end, nodes))
            if function is not None:
                _rewrite(graph, mm, end, function)
                return None
        reasons.append(f"no relu, tanh-GELU or constant scale of {mm.name} alone follows it"
                       if nodes else f"no pointwise op of {mm.name} alone follows it")
    return "; ".join(reasons) if reasons else "no 2-D matrix product (mm/addmm)"


RULE = Rule("gemm_epilogue", "mm/addmm + relu | tanh-GELU | constant scale -> one cuBLASLt call with that epilogue",
            apply)
