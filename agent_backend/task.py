"""Turn a group of graph nodes into a Task: a standalone KernelBench-style program, the input and
output signature, and a canonical hash of the computation.

The hash is taken over the program's forward body written with canonical names (in0.., v0..),
so it does not change with node names, the group's place in the graph or the process, and does
change when an op, a constant or an attribute changes. Shapes enter the hash only where the
computation spells them out (a view's target shape); the signature is keyed separately.
"""
from __future__ import annotations

import functools
import hashlib
import math
import operator

import torch
import torch.fx as fx

from .partition import Group, classify, column_index, constant_nodes, index_use, is_constant
from .specs import Task, TensorSpec

aten = torch.ops.aten

PROGRAM_HEADER = '''import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

'''

PROGRAM_FOOTER = '''

_INPUT_SPECS = {specs}
_DEVICE = {device!r}


def _random_tensor(shape, stride, dtype, high, special):
    n = 1 + sum((size - 1) * st for size, st in zip(shape, stride)) if all(shape) else 0
    if high is not None:  # indices into a dim of size high
        flat = torch.randint(0, high, (n,), device=_DEVICE, dtype=dtype)
    elif dtype == torch.bool:
        flat = torch.rand(n, device=_DEVICE) > 0.5
    elif not dtype.is_floating_point:  # indices: 0 is in bounds of any non-empty dim
        flat = torch.zeros(n, device=_DEVICE, dtype=dtype)
    else:
        flat = torch.randn(n, device=_DEVICE, dtype=dtype)
    if special:  # values the program compares it with (an ignore_index): a quarter of the elements
        picked = torch.tensor(special, device=_DEVICE, dtype=dtype)[torch.randint(len(special), (n,), device=_DEVICE)]
        flat = torch.where(torch.randint(0, 4, (n,), device=_DEVICE) == 0, picked, flat)
    return flat.as_strided(shape, stride)


def get_inputs():
    return [_random_tensor(*spec) for spec in _INPUT_SPECS]


def get_init_inputs():
    return []
'''


class UnsupportedGroup(Exception):
    """The group cannot become a Task (e.g. a non-tensor crosses its boundary)."""


def _literal(value) -> str:
    """Python source for a constant argument, exact for floats (repr round-trips)."""
    if isinstance(value, float):
        if math.isnan(value):
            return 'float("nan")'
        if math.isinf(value):
            return 'float("inf")' if value > 0 else 'float("-inf")'
        return repr(value)
    if isinstance(value, (bool, int, str, type(None))):
        return repr(value)
    if isinstance(value, torch.dtype):
        return str(value)
    if isinstance(value, (torch.memory_format, torch.layout)):
        return str(value)
    if isinstance(value, (list, tuple)):
        inner = ", ".join(_literal(v) for v in value)
        return f"[{inner}]" if isinstance(value, list) else f"({inner}{',' if len(value) == 1 else ''})"
    raise UnsupportedGroup(f"constant of type {type(value).__name__} cannot be written in a program")


def _op_path(target) -> str:
    if target is operator.getitem:
        return "operator.getitem"
    ns = target.namespace
    return f"torch.ops.{ns}.{target._opname}.{target._overloadname}"


def written_in(group: Group, node: fx.Node) -> bool:
    """Whether constant `node` is computed in the group's task rather than drawn as a random input:
    a full() always (masked_fill's -inf, a safe softmax's zeros); any constant of the graph for a
    fused attention call, whose rules read the mask's value (the iota-built causal masks).
    Elsewhere a template's kernel reads such a tensor as it reads any input."""
    return classify(node).kind == "constant" or (group.kind == "fused_attention" and is_constant(node))


def boundary(group: Group) -> tuple[list[fx.Node], list[fx.Node]]:
    """Inputs in order of first use (constants written in are not inputs); outputs (members used
    outside) in graph order."""
    members = set(group.nodes)
    inputs: list[fx.Node] = []
    for n in group.nodes:
        for a in n.all_input_nodes:
            if a not in members and a not in inputs and not written_in(group, a):
                inputs.append(a)
    outputs = [n for n in group.nodes if any(u not in members for u in n.users)]
    return inputs, outputs


def _constants(group: Group) -> list[fx.Node]:
    """The nodes computing the constants written into the group's task, in graph order."""
    members = set(group.nodes)
    found = {c for n in group.nodes for a in n.all_input_nodes if a not in members and written_in(group, a)
             for c in constant_nodes(a) or (a,)}
    return [n for n in group.nodes[0].graph.nodes if n in found]


def _spec(node: fx.Node, draws: tuple[int | None, tuple[int, ...]] = (None, ())) -> TensorSpec:
    val = node.meta.get("val")
    if not isinstance(val, torch.Tensor):
        raise UnsupportedGroup(f"{node.name} is not a single tensor")
    spec = TensorSpec.of(val)
    return spec if draws == (None, ()) else TensorSpec(spec.shape, spec.stride, spec.dtype, spec.device, *draws)


def _index_draws(node: fx.Node, nodes: list[fx.Node]) -> tuple[int | None, tuple[int, ...]]:
    """For an integer input that `nodes` use only to make a gather's index or a one-hot mask
    (partition.index_only): the size of the dim it indexes (or of the iota it is compared with),
    and the scalars it is compared with (random inputs for the task must lie in bounds, zeros
    would not tell a kernel that gathers the right element from one that reads the first, and
    draws that never equal cross-entropy's ignore_index would not tell one that masks those
    rows). (None, ()) for any other input."""
    val = node.meta.get("val")
    if not isinstance(val, torch.Tensor) or val.dtype.is_floating_point or val.dtype == torch.bool:
        return None, ()
    members = set(nodes)
    sizes, special = set(), set()
    frontier = [node]
    while frontier:
        n = frontier.pop()
        for user in n.users:
            if user not in members:
                continue
            use = index_use(user, n)
            if use == "gather":
                source = user.args[0].meta["val"]
                sizes.add(source.shape[user.args[1] % source.dim()])
            elif use == "compare":
                special.add(user.args[1])
            elif use == "column":  # matched against each place along a row: in bounds of it
                sizes.update(column_index(a) for a in user.args[:2] if a is not n)
            elif use == "pass":
                frontier.append(user)
            else:
                return None, ()
    return (sizes.pop() if len(sizes) == 1 else None), tuple(sorted(special))


def write_body(nodes: list[fx.Node], inputs: list[fx.Node], outputs: list[fx.Node], input_names: list[str],
               device: str) -> tuple[str, list[str]]:
    """Python lines computing `outputs` from `inputs` (named `input_names`) through `nodes` (in
    order), each an ATen call on canonical names v0..; `device` is the expression written for a
    device argument. Also returns the ops called, in order."""
    names = dict(zip(inputs, input_names))
    lines, ops = [], []

    def arg(a):
        if isinstance(a, fx.Node):
            return names[a]
        if isinstance(a, (list, tuple)) and any(isinstance(x, fx.Node) for x in a):
            return "[" + ", ".join(arg(x) for x in a) + "]"
        if isinstance(a, torch.device):
            return device
        return _literal(a)

    for i, n in enumerate(nodes):
        names[n] = f"v{i}"
        if n.target is operator.getitem:
            lines.append(f"v{i} = {arg(n.args[0])}[{_literal(n.args[1])}]")
            continue
        ops.append(str(n.target))
        args = [arg(a) for a in n.args] + [f"{k}={arg(v)}" for k, v in sorted(n.kwargs.items())]
        lines.append(f"v{i} = {_op_path(n.target)}({', '.join(args)})")
    rets = [names[o] for o in outputs]
    lines.append(f"return {rets[0]}" if len(rets) == 1 else f"return ({', '.join(rets)})")
    return "\n".join(lines), ops


class Subgraph:
    """A group as its own graph (`.graph`: placeholders in0.., output a tuple, meta kept), called
    as a module where a test runs it. The GraphModule is made only then: making one writes and
    compiles a forward's Python, 40% of our pass's time on GPT-2's graph, where every template
    reads the graph alone."""

    def __init__(self, graph: fx.Graph):
        self.graph = graph

    @functools.cached_property
    def module(self) -> fx.GraphModule:
        return fx.GraphModule(torch.nn.Module(), self.graph)

    def __call__(self, *inputs):
        return self.module(*inputs)


def _subgraph(nodes: list[fx.Node], inputs: list[fx.Node], outputs: list[fx.Node]) -> Subgraph:
    sub = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    for i, n in enumerate(inputs):
        p = sub.placeholder(f"in{i}")
        p.meta = dict(n.meta)
        env[n] = p
    for n in nodes:
        env[n] = sub.node_copy(n, lambda a: env[a])
    sub.output(tuple(env[o] for o in outputs))
    return Subgraph(sub)


def canonical_hash(body: str) -> str:
    return hashlib.sha256(("cuda_agent.task.v1\n" + body).encode()).hexdigest()[:32]


def extract_task(group: Group) -> Task:
    inputs, outputs = boundary(group)
    if not outputs:
        raise UnsupportedGroup("the group's results are not used")
    return task_of_nodes(_constants(group) + group.nodes, inputs, outputs, group.kind)


def task_of_nodes(nodes: list[fx.Node], inputs: list[fx.Node], outputs: list[fx.Node], kind: str) -> Task:
    """The Task computing `outputs` from `inputs` (in this order) through `nodes` (in graph order,
    scalar constants included)."""
    in_specs = tuple(_spec(n, _index_draws(n, nodes)) for n in inputs)
    out_specs = tuple(_spec(n) for n in outputs)
    devices = {s.device for s in in_specs + out_specs}
    if len(devices) != 1:
        raise UnsupportedGroup(f"the group spans devices {sorted(devices)}")
    body, ops = write_body(nodes, inputs, outputs, [f"in{i}" for i in range(len(inputs))], "torch.device(_DEVICE)")
    signature = ", ".join(["self"] + [f"in{i}" for i in range(len(inputs))])
    specs = "[\n" + "".join(
        f"    ({s.shape!r}, {s.stride!r}, torch.{s.dtype}, {s.high!r}, {s.special!r}),\n" for s in in_specs) + "]"
    program = (
        ("import operator\n" if "operator.getitem" in body else "")
        + PROGRAM_HEADER
        + f"    def forward({signature}):\n"
        + "".join(f"        {line}\n" for line in body.splitlines())
        + PROGRAM_FOOTER.format(specs=specs, device=devices.pop())
    )
    return Task(
        hash=canonical_hash(body),
        program=program,
        inputs=in_specs,
        outputs=out_specs,
        ops=tuple(ops),
        kind=kind,
        graph_module=_subgraph(nodes, inputs, outputs),
    )


def load_program(program: str, name: str = "<task>") -> dict:
    """Execute a task program (our own generated text, never a model's) and return its namespace."""
    namespace: dict = {"__name__": name}
    exec(compile(program, name, "exec"), namespace)
    return namespace
