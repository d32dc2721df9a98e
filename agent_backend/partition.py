"""Split a functional ATen graph into fusable subgraphs.

One pure function, `classify`, says who may claim a node and, if nobody, why not. Groups are
then grown greedily. First the patterns where a rewrite can remove work claim their nodes whole:
attention written by hand (batched matmul, scale, mask, softmax, batched matmul), a fused
attention call with the views before it, and a matmul whose output is summed or averaged. Then
an anchor (matmul, conv, reduction, a scan: cumsum) takes its pointwise prologue and epilogue (a
reduction also the views its epilogue goes on through), reductions over the same rows fuse with
the pointwise work between them (softmax, norms), a reduction group holding a gather or reading
a one-hot mask takes the integer ops that make its index and masks (cross-entropy's
target != -100, and its backward's one-hot eq(target, iota)), and chains of the
pointwise nodes left over form groups. Every group is checked to be convex (no path leaves it
and comes back), so replacing it with one call can never make a cycle. Constants (nodes computed from no input, such
as the causal masks transformers builds from iota) belong to no group; a task computes those its
rules read (task.written_in), and takes the others as inputs.
"""
from __future__ import annotations

import operator
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.fx as fx

from .specs import TASK_DTYPES, dtype_name

aten = torch.ops.aten

MATMUL_OPS = {aten.mm.default, aten.addmm.default, aten.bmm.default, aten.baddbmm.default}
CONV_OPS = {aten.convolution.default}
REDUCTION_OPS = {
    aten.sum.dim_IntList, aten.sum.default, aten.mean.dim, aten.mean.default, aten.amax.default,
    aten.amin.default, aten.var_mean.correction, aten.var.correction, aten.prod.dim_int,
    aten.any.dim,  # torch's safe softmax (sdpa's math path) asks whether a row holds any score
}
SOFTMAX_OPS = {aten._softmax.default, aten._log_softmax.default}
NORM_OPS = {aten.native_layer_norm.default, aten.native_group_norm.default}
SCAN_OPS = {aten.cumsum.default}  # a running sum along one dim: an anchor whose kernel is the rows family's
VIEW_OPS = {
    aten.view.default, aten.reshape.default, aten.permute.default, aten.t.default,
    aten.transpose.int, aten.expand.default, aten.unsqueeze.default, aten.squeeze.dim,
    aten.squeeze.dims,
}
# The fused attention kernels a graph holds where torch chose one at trace time (GPT-2's and
# Llama's causal attention): grouped with the views before them, for a rewrite of their arguments.
FUSED_ATTENTION_OPS = {
    aten._scaled_dot_product_cudnn_attention.default, aten._scaled_dot_product_flash_attention.default,
    aten._scaled_dot_product_efficient_attention.default, aten._scaled_dot_product_flash_attention_for_cpu.default,
}
ANCHOR_KINDS = ("matmul", "conv", "reduction", "softmax", "norm", "scan")
# Integer ops a task may hold where they prepare a gather's index (cross-entropy's target: a row
# whose target is the ignore_index is masked, and where(target != -100, target, 0) picks its
# element): a compare of an integer tensor with an integer scalar (a bool result), and where and
# views whose integer results go on only to gathers' indices (index_only).
INDEX_COMPARE_OPS = {aten.ne.Scalar, aten.eq.Scalar}
INDEX_PASS_OPS = {aten.where.self, aten.unsqueeze.default, aten.squeeze.dim, aten.view.default, aten.reshape.default,
                  aten.expand.default}
# A compare of an integer value with a column index (iota along the row): cross-entropy's backward
# makes its one-hot target mask so, eq(expand(target), iota(classes)).
COLUMN_COMPARE_OPS = {aten.eq.Tensor, aten.ne.Tensor}
IOTA = torch.ops.prims.iota.default
COLUMN_INDEX_OPS = {IOTA} | VIEW_OPS
# Reductions a matmul's output may flow into, for a rewrite to fold into a matrix-vector product.
RESHAPE_OPS = {aten.view.default, aten.reshape.default, aten._unsafe_view.default}
LINEAR_REDUCTION_OPS = {aten.sum.dim_IntList, aten.sum.default, aten.mean.dim, aten.mean.default}
# Groups larger than this become tasks too big for any template or model answer.
MAX_GROUP_NODES = 48
# A constant computed by more nodes than this is left an input: every task using it repeats them.
MAX_CONSTANT_NODES = 64


@dataclass(frozen=True)
class Claim:
    kind: str | None  # "pointwise", "view", an anchor kind, or None when no group may hold it
    reason: str = ""  # why not, when kind is None


def _tensor_vals(val) -> list | None:
    """The tensors a node produces, or None if it produces something else."""
    if isinstance(val, torch.Tensor):
        return [val]
    if isinstance(val, (tuple, list)) and val and all(isinstance(v, torch.Tensor) for v in val):
        return list(val)
    return None


def _arg_nodes(node: fx.Node) -> list[fx.Node]:
    return [a for a in node.all_input_nodes]


def _is_float_or_bool(val) -> bool:
    return isinstance(val, torch.Tensor) and dtype_name(val.dtype) in TASK_DTYPES


def bind_arguments(node: fx.Node) -> dict:
    """The node's arguments by schema name, defaults filled in."""
    bound = {}
    for k, arg in enumerate(node.target._schema.arguments):
        if k < len(node.args):
            bound[arg.name] = node.args[k]
        elif arg.name in node.kwargs:
            bound[arg.name] = node.kwargs[arg.name]
        elif arg.has_default_value():
            bound[arg.name] = arg.default_value
    return bound


def is_reshape(source: torch.Tensor, view: torch.Tensor) -> bool:
    """`view` (an as_strided of `source`) reads its contiguous source in order, from its start, in
    a contiguous layout: a reshape. Shared with the rows plan, which checks its own meta values."""
    return (source.is_contiguous() and view.is_contiguous() and view.numel() == source.numel()
            and view.storage_offset() == source.storage_offset())


def is_reshape_as_strided(node: fx.Node) -> bool:
    """An as_strided that is a reshape (Inductor's GroupNorm decomposition writes its per-channel
    scale so)."""
    source, out = node.args[0], node.meta.get("val")
    val = source.meta.get("val") if isinstance(source, fx.Node) else None
    return isinstance(val, torch.Tensor) and isinstance(out, torch.Tensor) and is_reshape(val, out)


def is_random(node: fx.Node) -> bool:
    """Tagged random and not an attention op with dropout_p == 0 (they carry the tag for
    dropout, as GPT-2's and BERT's inference graphs call them)."""
    target = node.target
    if not (isinstance(target, torch._ops.OpOverload) and torch.Tag.nondeterministic_seeded in target.tags):
        return False
    return bind_arguments(node).get("dropout_p", 1) != 0


def constant_nodes(node: fx.Node) -> list[fx.Node] | None:
    """The nodes that compute `node` from nothing (itself included, in no order) if it is a
    constant of the graph: a full(), or a deterministic ATen op of static shape whose inputs are
    all constants, as the iota-built causal masks of transformers' models are; else None."""
    found: set[fx.Node] = set()
    stack = [node]
    while stack:
        n = stack.pop()
        if n in found:
            continue
        target = n.target
        if n.op != "call_function" or len(found) >= MAX_CONSTANT_NODES:
            return None
        if target is operator.getitem:
            stack.append(n.args[0])
        elif not isinstance(target, torch._ops.OpOverload) or target._schema.is_mutable or is_random(n) or \
                "empty" in target._opname:  # uninitialised memory is no constant
            return None
        vals = _tensor_vals(n.meta.get("val"))
        if vals is None or any(not isinstance(s, int) for v in vals for s in v.shape):
            return None
        found.add(n)
        stack.extend(n.all_input_nodes)
    return list(found)


def is_constant(node: fx.Node) -> bool:
    """A constant (constant_nodes): written into every task that uses it, never a task input (a
    task's random input could hold any values where the graph's holds one)."""
    return constant_nodes(node) is not None


def _fused_attention(node: fx.Node) -> Claim:
    """An inference graph's fused attention call: no dropout, and only its output used (a training
    graph keeps its log-sum-exp for the backward, which a rewrite would have to keep too)."""
    name = str(node.target)
    if is_random(node):
        return Claim(None, f"{name} draws dropout")
    if any(u.target is not operator.getitem or u.args[1] != 0 for u in node.users):
        return Claim(None, f"{name}'s log-sum-exp is used (a training graph)")
    for a in node.args[:3]:
        val = a.meta.get("val") if isinstance(a, fx.Node) else None
        if not _is_float_or_bool(val) or any(not isinstance(s, int) for s in val.shape):
            return Claim(None, f"{name}'s inputs are not float tensors of static shape")
    return Claim("fused_attention")


def _is_integer(val) -> bool:
    return isinstance(val, torch.Tensor) and not (val.dtype.is_floating_point or val.dtype.is_complex
                                                  or val.dtype == torch.bool)


def column_index(node: fx.Node) -> int | None:
    """The length of the iota that constant `node` is, seen through views (a column index: each
    element's place along one dim), else None."""
    nodes = constant_nodes(node)
    iotas = [n for n in nodes or () if n.target is IOTA]
    if len(iotas) != 1 or not all(n.target in COLUMN_INDEX_OPS for n in nodes):
        return None
    return iotas[0].args[0] if isinstance(iotas[0].args[0], int) else None


def index_use(user: fx.Node, node: fx.Node) -> str | None:
    """How `user` uses the integer value `node` in making a gather's index or a one-hot mask:
    "gather" (its index argument), "compare" (with an integer scalar, INDEX_COMPARE_OPS: a bool
    mask), "column" (with a column index, COLUMN_COMPARE_OPS, either side), "pass" (a where
    branch or a view, INDEX_PASS_OPS, with an integer result, used so in turn); else None."""
    if user.target is aten.gather.default and user.args[2] is node and user.args[0] is not node:
        return "gather"
    if user.target in INDEX_COMPARE_OPS and user.args[0] is node and _is_integer_scalar(user.args[1]):
        return "compare"
    if user.target in COLUMN_COMPARE_OPS and node in user.args[:2] and _compares_with_a_column(user):
        return "column"
    if (user.target in INDEX_PASS_OPS and _is_integer(user.meta.get("val"))
            and not (user.target is aten.where.self and user.args[0] is node)):  # never the condition
        return "pass"
    return None


def index_only(node: fx.Node, depth: int = 0) -> bool:
    """Every use of `node`'s integer value prepares a gather's index or is one (index_use), a few
    steps on."""
    if not node.users or depth > 4:
        return False
    return all((use := index_use(u, node)) in ("gather", "compare", "column")
               or (use == "pass" and index_only(u, depth + 1)) for u in node.users)


def _compares_with_a_column(node: fx.Node) -> bool:
    """An integer compare of two tensors, one of them a column index."""
    a, b = node.args[:2]
    return (isinstance(a, fx.Node) and isinstance(b, fx.Node) and _is_integer(a.meta.get("val"))
            and _is_integer(b.meta.get("val")) and (column_index(a) is not None or column_index(b) is not None))


def _is_integer_scalar(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _index_op(node: fx.Node) -> Claim | None:
    """Claim("index") for an op on integer tensors that prepares a gather's index or a mask on the
    row (INDEX_COMPARE_OPS, COLUMN_COMPARE_OPS, INDEX_PASS_OPS; static shapes), else None. Only a
    reduction group holding a gather, or reading a one-hot mask (_Partitioner.one_hot), takes one in."""
    vals = [a.meta.get("val") for a in node.all_input_nodes] + [node.meta.get("val")]
    if not any(_is_integer(v) for v in vals) or not all(isinstance(v, torch.Tensor) for v in vals):
        return None
    if any(not isinstance(s, int) for v in vals for s in v.shape):
        return None
    if node.target in INDEX_COMPARE_OPS:
        source = node.args[0]
        ok = isinstance(source, fx.Node) and _is_integer(source.meta.get("val")) and _is_integer_scalar(node.args[1])
        return Claim("index") if ok else None
    if node.target in COLUMN_COMPARE_OPS:
        return Claim("index") if _compares_with_a_column(node) else None
    if node.target in INDEX_PASS_OPS and _is_integer(vals[-1]) and index_only(node):
        if node.target is aten.where.self and vals[0].dtype != torch.bool:
            return None
        return Claim("index")
    return None


def _gather(node: fx.Node) -> Claim:
    """A gather of float values by an integer index from outside: the epilogue of a reduction over
    the gathered dim may take it (cross-entropy picks each row's target from its log-softmax)."""
    source, index = node.args[0], node.args[2]
    vals = [a.meta.get("val") if isinstance(a, fx.Node) else None for a in (source, index)] + [node.meta.get("val")]
    if not all(isinstance(v, torch.Tensor) for v in vals):
        return Claim(None, "aten.gather.default has no tensor metadata")
    if not _is_float_or_bool(vals[0]) or vals[1].dtype not in (torch.int64, torch.int32):
        return Claim(None, "aten.gather.default takes a float source and an int32/int64 index here only")
    if any(not isinstance(s, int) for v in vals for s in v.shape):
        return Claim(None, "aten.gather.default has a dynamic shape")
    return Claim("gather")


def classify(node: fx.Node) -> Claim:
    """Who may claim `node`, and if nobody, why not. Pure: reads the node, its inputs and (for a
    fused attention call) which of its outputs are used."""
    if node.op != "call_function":
        return Claim(None, f"not an op ({node.op})")
    if node.target is operator.getitem:
        parent = node.args[0]
        inner = classify(parent) if isinstance(parent, fx.Node) else Claim(None, "getitem of a non-node")
        return Claim("getitem" if inner.kind else None, inner.reason)
    target = node.target
    if not isinstance(target, torch._ops.OpOverload):
        return Claim(None, f"{target} is not an ATen op")
    name = str(target)
    tags = set(target.tags)
    if target in FUSED_ATTENTION_OPS:
        return _fused_attention(node)
    if target is aten.gather.default:
        return _gather(node)
    if torch.Tag.nondeterministic_seeded in tags:
        return Claim(None, f"{name} is random")
    if target is aten.full.default and _is_float_or_bool(node.meta.get("val")) and all(
            isinstance(s, int) for s in node.args[0]):
        # A constant (masked_fill's -inf, the zeros of a safe softmax's masked rows): written into
        # the task, never a random input (a task's input of zeros could be any values).
        return Claim("constant")
    if any(isinstance(a, torch.device) for a in list(node.args) + list(node.kwargs.values())):
        return Claim(None, f"{name} takes a device argument")
    outs = _tensor_vals(node.meta.get("val"))
    if outs is None:
        return Claim(None, f"{name} has no tensor output metadata")
    index = _index_op(node)
    if index is not None:
        return index
    for t in outs + [v for a in _arg_nodes(node) for v in (_tensor_vals(a.meta.get("val")) or [])]:
        if dtype_name(t.dtype) not in TASK_DTYPES:
            return Claim(None, f"{name} touches a {dtype_name(t.dtype)} tensor")
        if any(not isinstance(s, int) for s in t.shape):
            return Claim(None, f"{name} has a dynamic shape")
    if target in MATMUL_OPS:
        return Claim("matmul")
    if target in CONV_OPS:
        return Claim("conv")
    if target in REDUCTION_OPS:
        return Claim("reduction")
    if target in SOFTMAX_OPS:
        return Claim("softmax")
    if target in NORM_OPS:
        return Claim("norm")
    if target in SCAN_OPS:
        return Claim("scan")
    if target in VIEW_OPS or (target is aten.as_strided.default and is_reshape_as_strided(node)):
        return Claim("view")
    if torch.Tag.pointwise in tags:
        if not _arg_nodes(node):
            return Claim(None, f"{name} has no tensor input")
        return Claim("pointwise")
    return Claim(None, f"{name} is not a pointwise, view or anchor op")


@dataclass
class Group:
    nodes: list[fx.Node] = field(default_factory=list)  # in graph order
    kind: str = "pointwise"

    def op_count(self) -> int:
        return sum(1 for n in self.nodes if n.target is not operator.getitem)


class _Graph:
    """Topological positions and a convexity check for one graph."""

    def __init__(self, graph: fx.Graph):
        self.pos = {n: i for i, n in enumerate(graph.nodes)}

    def is_convex(self, members: set[fx.Node]) -> bool:
        """True if no path leaves `members` and re-enters it (a cycle after fusion)."""
        last = max(self.pos[n] for n in members)
        seen: set[fx.Node] = set()
        stack = [u for n in members for u in n.users if u not in members]
        while stack:
            n = stack.pop()
            if n in seen or self.pos[n] > last:
                continue
            seen.add(n)
            for u in n.users:
                if u in members:
                    return False
                stack.append(u)
        return True


def _reduced_rows(node: fx.Node) -> tuple | None:
    """(input shape, reduced dims) of a reduction, to fuse only reductions over the same rows."""
    src = node.args[0]
    if not isinstance(src, fx.Node) or not isinstance(src.meta.get("val"), torch.Tensor):
        return None
    shape = tuple(src.meta["val"].shape)
    dims = node.args[1] if len(node.args) > 1 else None
    if isinstance(dims, (list, tuple)):
        dims = tuple(sorted(d % len(shape) for d in dims)) if shape else tuple(dims)
    elif isinstance(dims, int):
        dims = (dims % max(len(shape), 1),)
    else:
        dims = None
    return shape, dims


def _is_trivial_reduction(node: fx.Node) -> bool:
    """A reduction over dims of size 1 only: pointwise work in disguise, fusable anywhere."""
    rows = _reduced_rows(node)
    if rows is None or rows[1] is None:
        return False
    shape, dims = rows
    return bool(dims) and all(shape[d] == 1 for d in dims)


def _gathers_one_per_row(node: fx.Node, rows: tuple) -> bool:
    """A gather of one element from each of the rows a reduction reduces (`rows`: its input shape
    and reduced dims): it takes a place in the reduction's group as one more per-row result."""
    shape, dims = rows
    source, dim, index = node.args[:3]
    if tuple(source.meta["val"].shape) != shape or not shape or dims != (dim % len(shape),):
        return False
    return tuple(index.meta["val"].shape) == tuple(1 if d == dims[0] else n for d, n in enumerate(shape))


def _widens_into_a_reduction(node: fx.Node) -> bool:
    """A conversion to a wider type that a reduction or scan reads (a bf16 product's logits cast up
    for a softmax or a cross-entropy, a bf16 convolution's output cast up for a GroupNorm): left to
    the reduction's prologue. In a matmul's or convolution's epilogue it would make the reduction read
    the widened copy, written in full between the two (an H100 ran linear + cross-entropy 0.68x
    Inductor so, with our kernel 1.05x faster alone; on an H200, conv + GroupNorm + SiLU in bf16 wrote
    the conv's output as fp32 for our GroupNorm to read, and ran 0.965x with a kernel 1.28x alone)."""
    if node.target is not torch.ops.prims.convert_element_type.default:
        return False
    source, out = node.args[0].meta.get("val"), node.meta.get("val")
    widens = (isinstance(source, torch.Tensor) and isinstance(out, torch.Tensor)
              and out.dtype.itemsize > source.dtype.itemsize)
    return widens and any(u.target in REDUCTION_OPS | SOFTMAX_OPS | NORM_OPS | SCAN_OPS for u in _through_views(node))


def _through_views(node: fx.Node) -> list[fx.Node]:
    """The users of `node`, and of the views of it (GroupNorm's statistics read x reshaped)."""
    users = []
    for u in node.users:
        users += _through_views(u) if u.target in VIEW_OPS else [u]
    return users


def _reduces_last_dim(node: fx.Node) -> bool:
    rows = _reduced_rows(node)
    return rows is not None and rows[1] == (len(rows[0]) - 1,)


class _Partitioner:
    """The state of one partition(): claims, owners, groups, and how a group grows."""

    def __init__(self, graph: fx.Graph):
        self.graph = graph
        self.g = _Graph(graph)
        # a constant is no group's: each task that uses it computes it (task.py)
        self.claims = {n: Claim("constant") if is_constant(n) else classify(n) for n in graph.nodes}
        self.owner: dict[fx.Node, Group] = {}
        self.groups: list[Group] = []

    def kind(self, node: fx.Node) -> str | None:
        return self.claims[node].kind

    def try_add(self, members: set, node: fx.Node) -> bool:
        if node in self.owner or node in members or len(members) >= MAX_GROUP_NODES:
            return False
        if not self.g.is_convex(members | {node}):
            return False
        members.add(node)
        return True

    def grow(self, members: set, fusable: Callable[[fx.Node], bool],
             prologue: Callable[[fx.Node], bool] | None = None) -> None:
        """Epilogue (consumers `fusable` accepts), then prologue (producers `prologue` accepts,
        by default pointwise, view and constant ones, used only inside the group)."""
        prologue = prologue or (lambda p: self.kind(p) in ("pointwise", "view", "constant"))
        grown = True
        while grown:
            grown = False
            for m in sorted(members, key=self.g.pos.get):
                for u in m.users:
                    if fusable(u) and self.try_add(members, u):
                        grown = True
        grown = True
        while grown:
            grown = False
            for m in sorted(members, key=self.g.pos.get):
                for p in m.all_input_nodes:
                    if prologue(p) and all(u in members for u in p.users):
                        if self.try_add(members, p):
                            grown = True

    def pointwise_epilogue(self, node: fx.Node) -> bool:
        return self.kind(node) in ("pointwise", "getitem") or (
            self.kind(node) == "reduction" and _is_trivial_reduction(node))

    def reshaped_epilogue(self, node: fx.Node) -> bool:
        """A reshape whose result goes on to pointwise work, as in a Linear on 3-D input (addmm,
        view, gelu): the pointwise work is the product's epilogue all the same."""
        return node.target in RESHAPE_OPS and any(self.kind(u) == "pointwise" for u in node.users)

    def add_group(self, kind: str, members: set) -> None:
        group = Group(nodes=sorted(members, key=self.g.pos.get), kind=kind)
        for n in group.nodes:
            self.owner[n] = group
        self.groups.append(group)

    def forward_region(self, start: fx.Node, passable: Callable[[fx.Node], bool], end: Callable[[fx.Node], bool]):
        """The nodes reached from `start` through `passable` consumers, and the one consumer that
        `end` accepts where the region closes; None unless every path closes at that one node and
        nothing in between is used outside the region."""
        region, ends, frontier = {start}, set(), [start]
        while frontier:
            for u in frontier.pop().users:
                if u in region or u in ends:
                    continue
                if end(u):
                    ends.add(u)
                elif passable(u) and len(region) < MAX_GROUP_NODES and u not in self.owner:
                    region.add(u)
                    frontier.append(u)
                else:
                    return None
        if len(ends) != 1:
            return None
        return region, ends.pop()

    def attention(self, bmm: fx.Node) -> None:
        """bmm -> scale, mask, softmax over the last dim -> bmm, claimed whole (kind "attention")."""
        found = self.forward_region(
            bmm,
            passable=lambda n: self.kind(n) in ("pointwise", "view", "getitem") or (
                self.kind(n) == "reduction" and _reduces_last_dim(n)),
            end=lambda n: n.target is aten.bmm.default and n not in self.owner)
        if found is None:
            return
        region, second = found
        reductions = {n.target for n in region if self.kind(n) == "reduction"}
        if aten.amax.default not in reductions or aten.sum.dim_IntList not in reductions:
            return  # no softmax between the two products
        if second.args[0] not in region or second.args[1] in region:
            return
        members = region | {second}
        if not self.g.is_convex(members):
            return
        # and the views and casts after it: the rewrite computes in the precision the result is cast to
        self.grow(members, lambda n: self.kind(n) == "view" or n.target is torch.ops.prims.convert_element_type.default)
        self.add_group("attention", members)

    def fused_attention(self, node: fx.Node) -> None:
        """A fused attention call with its output and the views that lay out its operands (Llama's
        keys and values repeated across heads), for the rules of skills/rewrites/fused_attention."""
        members = {node}
        self.grow(members, lambda u: self.kind(u) == "getitem",
                  prologue=lambda p: self.kind(p) == "view" or p.target is aten.clone.default)
        self.add_group("fused_attention", members)

    def matmul_reduction(self, mm: fx.Node) -> None:
        """A matmul whose output flows through views and pointwise ops into a sum or mean,
        claimed with what follows (kind "matmul"), for the rewrite to a matrix-vector product."""
        found = self.forward_region(
            mm,
            passable=lambda n: self.kind(n) in ("pointwise", "view"),
            end=lambda n: n.target in LINEAR_REDUCTION_OPS and not _is_trivial_reduction(n))
        if found is None:
            return
        members = found[0] | {found[1]}
        if not self.g.is_convex(members):
            return
        self.grow(members, self.pointwise_epilogue)
        self.add_group("matmul", members)

    def anchor(self, node: fx.Node, kind: str) -> None:
        rows = _reduced_rows(node) if kind == "reduction" else None
        members = {node}
        def same_rows(u: fx.Node) -> bool:  # the reduction's row work: more reductions, views, a gather
            return ((self.kind(u) == "reduction" and _reduced_rows(u) == rows) or self.view_to_pointwise(u)
                    or (self.kind(u) == "gather" and _gathers_one_per_row(u, rows)))
        def epilogue(u: fx.Node) -> bool:
            if kind == "matmul":
                return (self.pointwise_epilogue(u) and not _widens_into_a_reduction(u)) or self.reshaped_epilogue(u)
            if kind == "conv":
                return self.pointwise_epilogue(u) and not _widens_into_a_reduction(u)
            return self.pointwise_epilogue(u) or (rows is not None and same_rows(u))
        self.grow(members, epilogue)
        if rows is not None and any(self.kind(m) == "gather" or self.one_hot(p)
                                    for m in members for p in m.all_input_nodes):  # an index's making, masks on it
            index_work = lambda p: self.kind(p) in ("pointwise", "view", "constant", "index")  # noqa: E731
            self.grow(members, lambda u: False, prologue=index_work)
            # a compare used outside too (a loss's mean counts the rows it keeps): made here and written out,
            # so no kernel before the group makes it
            for p in {p for m in members for p in m.all_input_nodes if p.target in INDEX_COMPARE_OPS}:
                if self.kind(p) == "index":
                    self.try_add(members, p)
        self.add_group(kind, members)

    def one_hot(self, node: fx.Node) -> bool:
        """A compare with a column index (its integer operand drawn in bounds of the row: a mask of
        token ids compared with a scalar alone would be drawn as zeros and that scalar)."""
        return self.kind(node) == "index" and node.target in COLUMN_COMPARE_OPS

    def view_to_pointwise(self, node: fx.Node) -> bool:
        """A view whose users are all pointwise, or views that lead on to pointwise work: in a
        reduction's epilogue it leads on to them (logsumexp squeezes its max before adding it to
        the log of the sum; GroupNorm reshapes its per-group scale to one per channel)."""
        return self.kind(node) == "view" and bool(node.users) and all(
            self.kind(u) == "pointwise" or self.view_to_pointwise(u) for u in node.users)

    def pointwise_chain(self, node: fx.Node) -> None:
        members, frontier = {node}, [node]
        while frontier:
            n = frontier.pop()
            for nb in list(n.users) + n.all_input_nodes:
                if self.kind(nb) == "pointwise" and self.try_add(members, nb):
                    frontier.append(nb)
        self.add_group("pointwise", members)

    def run(self) -> list[Group]:
        for node in self.graph.nodes:
            if node not in self.owner and node.target is aten.bmm.default and self.kind(node) == "matmul":
                self.attention(node)
        for node in self.graph.nodes:
            if node not in self.owner and self.kind(node) == "fused_attention":
                self.fused_attention(node)
        for node in self.graph.nodes:
            if node not in self.owner and self.kind(node) == "matmul":
                self.matmul_reduction(node)
        for node in self.graph.nodes:
            if node not in self.owner and self.kind(node) in ANCHOR_KINDS:
                self.anchor(node, self.kind(node))
        for node in self.graph.nodes:  # pointwise chains among what is left
            if node not in self.owner and self.kind(node) == "pointwise":
                self.pointwise_chain(node)
        return sorted(self.groups, key=lambda gr: self.g.pos[gr.nodes[0]])


def partition(graph: fx.Graph) -> list[Group]:
    """Fusable groups of `graph`, in graph order. Nodes nobody claims stay with Inductor."""
    return _Partitioner(graph).run()


def unclaimed(graph: fx.Graph) -> dict[str, str]:
    """Node name -> why no group may hold it (for `cuda-agent explain`)."""
    return {n.name: c.reason for n in graph.nodes if (c := classify(n)).kind is None and n.op == "call_function"}
