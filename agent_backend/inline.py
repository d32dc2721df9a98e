"""Rewrite winners go into the graph as the ATen ops they are, not as a call of our op.

A rewrite (skills/rewrites) is a program of ATen ops that computes a subgraph with less work.
Run through run_winner it costs a Python call and one eager dispatch per op on every call (BERT's
attention rewrite: 3.6x faster on the GPU, 0.68x counting its host time, and its graph 0.56x
Inductor's speed with four of them, H100). Handed to Inductor in place of the subgraph, its ops
are fused and launched like the rest of the graph.

Only what was verified is inlined: the winner's graph is made again by our own rules from the
subgraph, and used only where the source written from it is the verified winner's source, byte
for byte; anything else runs through run_winner as before.
"""
from __future__ import annotations

import contextlib

import torch
import torch.fx as fx
from torch._guards import detect_fake_mode
from torch._inductor.decomposition import select_decomp_table
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.fx.experimental.proxy_tensor import make_fx

from skills import rewrites

from . import runtime
from .partition import Group
from .specs import Task
from .task import boundary

ALL_ATTENTION = [backend for name, backend in SDPBackend.__members__.items() if name != "ERROR"]


def aten_graph(key: str, task: Task) -> fx.Graph | None:
    """The ATen graph of the winner registered under `key` for `task`, if it is a rewrite whose
    rules, applied to the task's graph again, write exactly its verified source; else None."""
    winner = runtime.registered(key)
    return None if winner is None else rewritten_as(task, winner.origin, winner.source)


def rewritten_as(task: Task, origin: str, source: str) -> fx.Graph | None:
    """The graph the rewrite rules `origin` names write for `task` now, if its source is `source`
    byte for byte (a rewrite winner of an older revision of the rules may differ); else None."""
    rebuilt = rewrites.rebuild(task, origin)  # None where origin names no rewrite
    return rebuilt[0] if rebuilt is not None and rebuilt[1] == source else None


def splice(graph: fx.Graph, group: Group, sub: fx.Graph) -> None:
    """Replace the group's nodes with `sub`'s (its placeholders are the group's inputs in order,
    its output the group's outputs), in the ops Inductor lowers after autograd (_post_grad)."""
    inputs, outputs = boundary(group)
    members = set(group.nodes)
    traced = _post_grad(sub, [n.meta["val"] for n in inputs])
    placeholders = [n for n in traced.nodes if n.op == "placeholder"]
    env: dict[fx.Node, fx.Node] = dict(zip(placeholders, inputs))
    after = group.nodes[-1].next  # not a member: the group's last node in graph order comes before it
    with graph.inserting_before(after):
        for node in traced.nodes:
            if node.op == "call_function":
                env[node] = graph.node_copy(node, lambda a: env[a])
    result = next(n for n in traced.nodes if n.op == "output").args[0]
    results = list(result) if isinstance(result, (tuple, list)) else [result]
    for out, new in zip(outputs, results):
        out.replace_all_uses_with(env[new], delete_user_cb=lambda user: user not in members)
    for n in reversed(group.nodes):
        graph.erase_node(n)


def _post_grad(sub: fx.Graph, values: list) -> fx.Graph:
    """`sub` traced on the graph's own fake values through Inductor's decompositions, as
    AOTAutograd traces a user's program: transpose becomes permute, masked_fill where, and
    scaled_dot_product_attention the fused kernel torch picks for these tensors now; every node
    gets the fake value Inductor's later passes read. Every attention backend is allowed, as it
    was where the candidate was verified (a worker), whatever the compiling code restricts."""
    module = fx.GraphModule(torch.nn.Module(), sub)
    with detect_fake_mode(values) or contextlib.nullcontext(), sdpa_kernel(ALL_ATTENTION):
        return make_fx(module, decomposition_table=select_decomp_table())(*values).graph
