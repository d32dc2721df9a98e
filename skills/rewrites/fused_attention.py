"""Rules for a fused attention call: what a compiled graph holds where torch chose an attention
kernel at trace time (GPT-2's and Llama's attention, `_scaled_dot_product_cudnn_attention` on an
H100), rewritten to a call that does less.

causal_mask: the call's mask is a constant of the graph whose value is exactly the causal
pattern (True or 0 on and below the diagonal, False or -inf above; -65504, torch's -inf for
cuDNN, counts as -inf). transformers builds such a
mask from iota, comparisons and a cumsum in every compiled graph of GPT-2 and Llama and passes it
as a bias. The call becomes `is_causal=True` with no mask: the mask is neither built nor read, and
the kernel skips the blocks above the diagonal. The mask's value is computed here, on the CPU,
from the nodes that build it (the partition writes a constant into every task that uses it);
any other value (a padding mask, a sliding window) leaves the call as it is.

grouped_kv: keys and values repeated across the query heads (Llama's repeat_kv: unsqueeze,
expand, reshape, which the GPU copies) are passed unrepeated with `enable_gqa=True`.

Either way the result is `aten.scaled_dot_product_attention`, and torch picks the kernel for it.
"""
from __future__ import annotations

import functools
import operator
import textwrap

import torch
import torch.fx as fx
from torch._subclasses.fake_tensor import unset_fake_temporarily

from agent_backend.partition import FUSED_ATTENTION_OPS, bind_arguments, constant_nodes, is_random
from agent_backend.task import write_body

from .graph import RESHAPE_OPS, aten, call, shape
from .rule import Rule

SDPA = aten.scaled_dot_product_attention.default
# the mask's name in each op's schema
MASK_ARGS = ("attn_bias", "attn_mask")
# An additive mask's value that counts as -inf: torch hands cuDNN a boolean mask as a bias of 0 and
# -65504 (the float16 limit, as cuDNN's kernels take no -inf), which GPT-2's and Llama's graphs hold.
MASKED = -65504.0
# A constant mask larger than this is not evaluated (batch 8 at sequence 2048 is 2**25 elements).
MAX_MASK_ELEMENTS = 2 ** 26


def _output_uses(node: fx.Node) -> list[fx.Node] | None:
    """The nodes that stand for the call's attention output; None if another output is used."""
    if node.target is SDPA:
        return [node]
    if any(u.target is not operator.getitem or u.args[1] != 0 for u in node.users):
        return None
    return list(node.users)


def _calls(graph: fx.Graph) -> list[fx.Node]:
    return [n for n in graph.nodes if n.op == "call_function" and n.target in FUSED_ATTENTION_OPS | {SDPA}
            and not is_random(n) and _output_uses(n) is not None]


def _replace(graph: fx.Graph, node: fx.Node, args: dict, **changes) -> None:
    """The call as aten.scaled_dot_product_attention with `changes` to its arguments."""
    args = {**args, **changes}
    mask = next((args[name] for name in MASK_ARGS if args.get(name) is not None), None)
    kwargs = {"attn_mask": mask, "is_causal": bool(args.get("is_causal")) or None, "scale": args.get("scale"),
              "enable_gqa": bool(args.get("enable_gqa")) or None}
    kwargs = {k: v for k, v in kwargs.items() if v is not None}  # the rest as their defaults
    uses = _output_uses(node)
    with graph.inserting_before(node):
        new = call(graph, SDPA, args["query"], args["key"], args["value"], like=uses[0], **kwargs)
    for use in uses:
        if use is not new and use is not node:
            use.replace_all_uses_with(new)
            graph.erase_node(use)
    if node.target is SDPA:
        node.replace_all_uses_with(new)
    graph.erase_node(node)


def _mask_problem(mask: fx.Node, query: fx.Node, key: fx.Node) -> str | None:
    """Why the mask node `mask` is not a constant holding the causal pattern over query and key
    positions; None if it is."""
    nodes = constant_nodes(mask)
    if nodes is None:
        return "the mask is computed from an input, not a constant"
    if shape(query) is None or shape(key) is None:  # a call an earlier rule wrote
        return "the attention call's shapes are not known"
    rows, cols = shape(query)[-2], shape(key)[-2]
    if mask.meta["val"].numel() > MAX_MASK_ELEMENTS:
        return f"the constant mask ({mask.meta['val'].numel()} elements) is too large to read while compiling"
    order = {n: i for i, n in enumerate(mask.graph.nodes)}
    body, _ = write_body(sorted(nodes, key=order.get), [], [mask], [], 'torch.device("cpu")')
    return _causal_problem(body, rows, cols)


@functools.lru_cache(maxsize=64)
def _causal_problem(body: str, rows: int, cols: int) -> str | None:
    """_not_causal of the mask that `body` (task.write_body's lines, from nothing) computes on the
    CPU; each of a model's layers asks about the same mask, and so does every rule pass."""
    namespace = {"torch": torch, "operator": operator}
    exec(compile("def build():\n" + textwrap.indent(body, "    "), "<constant mask>", "exec"), namespace)
    with unset_fake_temporarily(), torch.no_grad():
        return _not_causal(namespace["build"](), rows, cols)


def _not_causal(mask: torch.Tensor, rows: int, cols: int) -> str | None:
    """Why `mask` (bool: True takes part; float: added to the scores) is not the causal pattern
    over [rows, cols] in every leading index; None if it is."""
    if mask.dtype == torch.bool:
        keep = mask
    else:
        keep = mask == 0
        drop = mask <= MASKED
        if not bool((keep | drop).all()):
            odd = mask[~(keep | drop)].unique()[:3].tolist()
            return f"the mask adds values other than 0 and -inf (e.g. {', '.join(f'{v:g}' for v in odd)})"
    try:
        keep = keep.expand(*keep.shape[:-2], rows, cols)
    except RuntimeError:
        return f"the mask's shape {tuple(mask.shape)} is not [..., {rows}, {cols}]"
    causal = torch.ones(rows, cols, dtype=torch.bool).tril()
    return None if torch.equal(keep, causal.expand_as(keep)) else "the constant mask is not causal"


def apply_causal_mask(graph: fx.Graph) -> str | None:
    reasons = []
    for node in _calls(graph):
        args = bind_arguments(node)
        mask = next((args[name] for name in MASK_ARGS if args.get(name) is not None), None)
        if not isinstance(mask, fx.Node) or args.get("is_causal"):
            reasons.append("the attention call has no mask")
            continue
        why = _mask_problem(mask, args["query"], args["key"])
        if why:
            reasons.append(why)
            continue
        _replace(graph, node, args, **{name: None for name in MASK_ARGS}, is_causal=True)
        return None
    return "; ".join(dict.fromkeys(reasons)) if reasons else "no fused attention call"


def _unrepeated(node: fx.Node) -> tuple[fx.Node, int] | None:
    """(x, r) where `node` is x [b, h, s, d] with every head repeated r times in a row
    (reshape(expand(unsqueeze(x, 2), [b, h, r, s, d]), [b, h*r, s, d]), a clone between or not)."""
    if node.op != "call_function" or node.target not in RESHAPE_OPS:
        return None
    expand = node.args[0]
    if expand.op == "call_function" and expand.target is aten.clone.default:
        expand = expand.args[0]
    if expand.op != "call_function" or expand.target is not aten.expand.default:
        return None
    unsqueeze = expand.args[0]
    if unsqueeze.op != "call_function" or unsqueeze.target is not aten.unsqueeze.default or unsqueeze.args[1] != 2:
        return None
    source = unsqueeze.args[0]
    if len(shape(source) or ()) != 4:
        return None
    b, h, s, d = shape(source)
    repeats = shape(node)[1] // h
    if shape(expand) != (b, h, repeats, s, d) or shape(node) != (b, h * repeats, s, d):
        return None
    return source, repeats


def apply_grouped_kv(graph: fx.Graph) -> str | None:
    reasons = []
    for node in _calls(graph):
        args = bind_arguments(node)
        key, value = _unrepeated(args["key"]), _unrepeated(args["value"])
        if args.get("enable_gqa") or key is None or value is None or key[1] != value[1] or key[1] < 2:
            reasons.append("keys and values are not repeated across query heads")
            continue
        _replace(graph, node, args, key=key[0], value=value[0], enable_gqa=True)
        return None
    return "; ".join(dict.fromkeys(reasons)) if reasons else "no fused attention call"


CAUSAL_MASK = Rule("causal_mask", "fused attention with a constant causal mask -> is_causal=True, no mask",
                   apply_causal_mask)
GROUPED_KV = Rule("grouped_kv", "fused attention on keys/values repeated across heads -> enable_gqa=True",
                  apply_grouped_kv)
