"""trivial_reductions: a sum, mean, amax or amin over dims of size 1 only computes nothing; it
becomes a reshape (the same values, exactly), so what remains around it can fuse or fold."""
from __future__ import annotations

import torch.fx as fx

from .graph import aten, call, reduced_dims, shape
from .rule import Rule

REDUCTIONS = {aten.sum.dim_IntList, aten.mean.dim, aten.amax.default, aten.amin.default}


def apply(graph: fx.Graph) -> str | None:
    rewrote = False
    for node in [n for n in graph.nodes if n.op == "call_function" and n.target in REDUCTIONS]:
        dims, src = reduced_dims(node), shape(node.args[0])
        if dims is None or src is None or not dims[0] or any(src[d] != 1 for d in dims[0]):
            continue
        if "dtype" in node.kwargs and node.kwargs["dtype"] != node.args[0].meta["val"].dtype:
            continue  # a reduction that also converts: leave it
        with graph.inserting_before(node):
            node.replace_all_uses_with(call(graph, aten.reshape.default, node.args[0], list(shape(node)), like=node))
        rewrote = True
    return None if rewrote else "no reduction over size-1 dims only"


RULE = Rule("trivial_reductions", "sum/mean/amax/amin over size-1 dims -> reshape", apply)
