"""Task -> RowPlan: reductions over the same rows, with their pointwise prologue and epilogue,
as passes over each row; or a scan (cumsum) along each row, with its prologue and epilogue.

A row is the set of elements one reduction result summarises: the reduced dims D of the shape S
the reductions read. Values that vary within a row are *element* values (computed per element,
in fp32); the others are *per-row* values (computed once per row: reduction results and what is
built from them, per-row inputs, constants). A reduction whose input needs another's result
(softmax's sum needs the max) runs one pass later: pass k combines the reductions of level k,
then computes the per-row values they make ready. The epilogue pass computes element outputs.

Rounding follows Inductor, not eager: values stay fp32 between ops, through the graph's
conversions to fp16/bf16 too (Inductor computes them in their compute type, fp32, while
emulate_precision_casts is off), and are rounded only where an output is stored. Reductions
accumulate in fp32; var is two-pass (the mean, then the sum of squared deviations from it).

A scan is an element value: the running sum of its source along the row, up to and including the
element. Its plan has no passes: one sweep computes the source (the scan's Pass), sums it in order
and computes the element outputs from the sums (the epilogue, which reads the scan's value).
"""
from __future__ import annotations

import math
import operator
from dataclasses import dataclass, replace

import torch
from torch.fx import Node

from agent_backend.partition import index_only
from agent_backend.specs import Task, TensorSpec
from skills.pointwise import dtypes
from skills.pointwise.dtypes import cast, dtype_info, literal, operand_info
from skills.pointwise.errors import Unsupported
from skills.pointwise.layout import coalesce, is_dense, vector_width
from skills.pointwise.ops import OP_RULES, OpArgs, Value
from agent_backend.partition import IOTA, bind_arguments, is_reshape
from skills.pointwise.plan import graph_interface, meta_result

from .gemv import lower_products
from .placement import Axes, Placement, meta_shape, reduced_axes, refine, runs, space_dims

aten = torch.ops.aten

# reduction op -> what it computes
REDUCTIONS = {
    aten.sum.dim_IntList: "sum", aten.sum.default: "sum", aten.mean.dim: "mean", aten.mean.default: "mean",
    aten.amax.default: "max", aten.amin.default: "min", aten.var.correction: "var",
    aten.var_mean.correction: "var_mean",
}
SCANS = {aten.cumsum.default}  # running sums along one dim, in order
VIEWS = {
    aten.view.default, aten.reshape.default, aten._unsafe_view.default, aten.squeeze.dim, aten.squeeze.dims,
    aten.squeeze.default, aten.unsqueeze.default, aten.expand.default, aten.permute.default, aten.t.default,
    aten.transpose.int, aten.as_strided.default,
}
# Views that keep row-major order (a reshape; as_strided only where it is one): a node the
# reductions read through these alone may refine the iteration space (placement.refine).
RESHAPES = VIEWS - {aten.expand.default, aten.permute.default, aten.t.default, aten.transpose.int}
COMPUTE_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.bool)
INDEX_DTYPES = tuple(dtypes.INDEX_DTYPES)  # inputs that make a gather's index, and nothing else
# The value each partial reduction starts from (sums accumulate in double: codegen.ACCUMULATOR).
IDENTITY = {"sum": "0.0", "online": "0.0", "max": "(-__uint_as_float(0x7f800000u))",
            "min": "__uint_as_float(0x7f800000u)"}
# The exp that flushes subnormal results ("{}": its argument), for terms read only by a row's sum.
FTZ_EXP = "pw_exp_fast_ftz({})"

# Element ops worth keeping on chip rather than computing again in a later sweep: each costs a
# special-function instruction (16 a clock an SM on Hopper, an eighth of the fp32 rate). On an
# H200 (2026-11-26), softmax over 4096 x 8192 in bf16 ran 1.15x faster keeping its exp.
COSTLY = {aten.exp.default, aten.exp2.default, aten.expm1.default, aten.log.default, aten.log1p.default,
          aten.log2.default, aten.tanh.default, aten.sigmoid.default, aten.erf.default, aten.sin.default,
          aten.cos.default}


def _fast_sum_term(args: OpArgs) -> bool:
    """Whether an exp(y - max(y)) summed over the row takes FTZ_EXP: in fp32, or rounded to
    fp16/bf16 (never fp64)."""
    return args.fast or args.dtype == torch.float32


def _iota_range(iota: Node) -> tuple[int, int]:
    """An iota's start and step (prims.iota's defaults where the graph leaves them out)."""
    bound = bind_arguments(iota)
    return bound.get("start", 0), bound.get("step", 1)


@dataclass(frozen=True)
class Access:
    """One way the kernel reads an input: its pointer, seen through the task's views of it,
    with strides over the plan's coalesced outer (which row) and inner (within a row) dims."""
    input: int
    outer: tuple[int, ...]
    inner: tuple[int, ...]
    per_row: bool  # the same value for a whole row: read once per row


@dataclass(frozen=True)
class Output:
    spec: TensorSpec
    outer: tuple[int, ...]
    inner: tuple[int, ...]
    value: str     # the C value stored (compute type)
    per_row: bool  # one value per row, written once


@dataclass(frozen=True)
class Partial:
    """One accumulation combined across the threads of a row.

    An "online" partial is a sum of exp(source - m) where m is the row's max of source: the
    max partial `scale` of the same pass. Each thread sums the terms relative to its running
    max and rescales the sum when the max grows (`term`: the exp's C form, "{}" its argument),
    so logsumexp and cross-entropy read each row once instead of holding it for a second pass.

    Where a later sweep reads the sum's exp itself (softmax's output), `kept` names that value
    (C variable, its exp's C form, the row's max as a per-row variable): a thread holding its
    part of the row may keep each term in that form against its own max, and the later sweep
    take it times exp(that max - the row's max) (Pass.rescaled) rather than compute the exp
    again."""
    acc: str       # C accumulator
    combine: str   # "sum", "max", "min" or "online"
    source: str    # C value accumulated per element, after the pass's statements
    scale: str = ""  # an online sum's max accumulator
    term: str = ""   # an online sum's exp, "{}" for its argument
    kept: tuple[str, str, str] = ()  # an online sum's exp read by a later sweep: (variable, C form, max)


@dataclass(frozen=True)
class Pass:
    """One sweep over a row: per element, read `reads` (access indices), run `body`, accumulate
    `partials`; then, once per row, run `after` (per-row values the partials made ready).

    Where the row's elements are held in registers, a costly element value (an exp) computed by
    one sweep and needed by a later one is kept there too: the sweep that first computes it
    keeps each `keeps` value (C type, variable) per element, and a later sweep runs `reusing`
    (its reads and body, taking kept values as computed) instead of `reads` and `body`.
    `rescaled` is the same for the exps of online sums (Partial.kept) where their terms were kept."""
    reads: tuple[int, ...]
    body: tuple[str, ...]
    partials: tuple[Partial, ...] = ()
    after: tuple[str, ...] = ()
    keeps: tuple[tuple[str, str], ...] = ()
    reusing: Reuse | None = None
    rescaled: Reuse | None = None


@dataclass(frozen=True)
class Reuse:
    """A sweep's work where earlier sweeps kept values on chip: read `reads`, take the kept
    `takes` (C type, variable) as computed, run `body`."""
    reads: tuple[int, ...]
    takes: tuple[tuple[str, str], ...]
    body: tuple[str, ...]


@dataclass(frozen=True)
class Scan:
    """A running sum along each row: per element, `work` computes `source`; `value` (the C
    variable the epilogue reads) is the sum of `source` over the row up to and including it."""
    work: Pass
    source: str
    value: str


@dataclass(frozen=True)
class RowPlan:
    outer: tuple[int, ...]          # coalesced sizes of the row index, outermost first
    inner: tuple[int, ...]          # coalesced sizes within a row, outermost first
    inputs: tuple[TensorSpec, ...]  # the kernel's input pointers (all task inputs)
    accesses: tuple[Access, ...]    # access k's value is the C variable a<k>
    outputs: tuple[Output, ...]
    prelude: tuple[str, ...]        # per-row values that need no reduction
    passes: tuple[Pass, ...]        # reduction passes, in order
    epilogue: Pass                  # element outputs (no partials)
    stored: tuple[int, ...]         # accesses read by more than one pass: held on chip
    vector_width: int               # elements per access along the innermost dim (1: none)
    along_rows: bool                # threads of a row run along it (its elements are contiguous), else
                                    # across rows (consecutive rows are contiguous: "outer" kernels)
    wide_index: bool                # 64-bit offsets needed (rows past the last included: needs_wide_index)
    scan: Scan | None = None        # a running sum along the rows (then there are no passes)

    @property
    def rows(self) -> int:
        return math.prod(self.outer)

    @property
    def row_length(self) -> int:
        return math.prod(self.inner)

    @property
    def sweeps(self) -> tuple[Pass, ...]:
        return self.passes + (self.epilogue,)

    @property
    def online(self) -> bool:
        """Whether a pass takes a sum of exp online (Partial)."""
        return any(p.combine == "online" for ps in self.passes for p in ps.partials)

    @property
    def kept_words(self) -> int:
        """32-bit registers an element's kept values take (Pass.keeps)."""
        return sum(2 if ctype == "double" else 1 for p in self.sweeps for ctype, _ in p.keeps)


def build_plan(task: Task, online: bool = False) -> RowPlan:
    """The plan for `task`, or Unsupported with the reason the template cannot take it; with
    `online`, each sum of exp(y - max(y)) is taken online (Partial) beside its max. A matrix-vector
    product is planned as its sum over k (gemv.lower_products)."""
    task = lower_products(task)
    placeholders, out_nodes = graph_interface(task)
    for spec in task.inputs + task.outputs:
        if spec.torch_dtype not in COMPUTE_DTYPES + INDEX_DTYPES:
            raise Unsupported(f"dtype {spec.torch_dtype} not supported")
    for spec in task.outputs:
        if spec.torch_dtype in INDEX_DTYPES:
            raise Unsupported(f"an output of dtype {spec.torch_dtype} not supported")
    for p, spec in zip(placeholders, task.inputs):
        if spec.torch_dtype in INDEX_DTYPES and not index_only(p):
            raise Unsupported(f"integer input {p.name} is used as other than to make a gather's index")
    return _Builder(task, placeholders, out_nodes, online).build()


class _Builder:
    def __init__(self, task: Task, placeholders: list[Node], out_nodes: list[Node], online: bool):
        self.task = task
        self.online = online
        self.out_nodes = out_nodes
        self.nodes = [n for n in task.graph_module.graph.nodes if n.op in ("placeholder", "call_function")]
        self.metas: dict[Node, object] = {p: torch.empty_strided(s.shape, s.stride, dtype=s.torch_dtype, device="meta")
                                          for p, s in zip(placeholders, task.inputs)}
        # input nodes (placeholders and views of them) -> the input they read
        self.sources: dict[Node, int] = {p: k for k, p in enumerate(placeholders)}
        self.reductions: list[Node] = []
        self.gathers: list[Node] = []  # one element of each row, by a per-row index
        self.iotas: list[Node] = []  # each element's place along its row (a one-hot mask's column index)
        self.scans: list[Node] = []

    # -- the graph -----------------------------------------------------------------------
    def build(self) -> RowPlan:
        self._evaluate()
        read_shape, read_dims = self._rows()
        space, read_axes, placed_inputs = self._space(read_shape)
        dims = frozenset(space_dims(tuple(read_axes[d] for d in read_dims)))
        placement = self._place(space, (read_shape, read_axes), read_dims, placed_inputs)
        per_row = {n: not any(d in dims for d in space_dims(placement.axes[n])) for n in placement.axes}
        used_inputs = [n for n in self.nodes if n in self.sources and any(u not in self.sources for u in n.users)]
        if not used_inputs:
            raise Unsupported("the task reads no input")
        outer, inner, strides, primary = self._layout(space, dims, placement, per_row, used_inputs)
        if (self.gathers or self.iotas) and len(inner) != 1:  # both take the element's place in its row
            raise Unsupported(f"a gather or iota over rows of {len(inner)} dims not supported")
        along = _along_rows(strides[used_inputs.index(primary)])
        for iota in self.iotas:  # the place of the element along the row, as the kernel counts it
            if placement.axes[iota] != (tuple(sorted(dims)),) or not along or self.scans:
                raise Unsupported(f"{iota.name} does not run along the rows the reductions reduce")
        if self.scans and (len(inner) != 1 or not along):
            raise Unsupported("a scan along rows that are not one dim of consecutive elements not supported")
        # one access per distinct read: GroupNorm reads x as itself and through the view the
        # reductions read, the same elements in the same order
        unique: list[Access] = []
        access_of = {}
        for n, (o, i) in zip(used_inputs, strides):
            access = Access(self.sources[n], o, i, per_row[n])
            if access not in unique:
                unique.append(access)
            access_of[n] = unique.index(access)
        accesses = tuple(unique)
        program = _Program(self, placement, per_row, access_of, accesses, space, dims)
        outputs = tuple(Output(spec, o, i, program.var(node), per_row[node]) for spec, node, (o, i) in zip(
            self.task.outputs, self.out_nodes, strides[len(used_inputs):]))
        passes, prelude, epilogue = program.passes(self.out_nodes)
        reads = [set(p.reads) for p in passes] + [set(epilogue.reads)]
        stored = tuple(k for k in range(len(accesses)) if sum(k in r for r in reads) > 1)
        width = self._vector_width(inner, accesses, outputs) if along else 1
        # twice the index space: a grid may form offsets of rows past the last (row_ok false)
        wide = needs_wide_index(2 * math.prod(space), self.task.inputs + self.task.outputs)
        return RowPlan(outer, inner, self.task.inputs, accesses, outputs, prelude, passes, epilogue, stored,
                       width, along, wide, program.scan(self.scans))

    def _layout(self, space, dims, placement: Placement, per_row: dict[Node, bool], used_inputs: list[Node]):
        """Coalesced outer and inner sizes; (outer, inner) strides of each used input, then of each
        output; the input node whose memory order set the order of the dims."""
        # The largest input read per element (any input, for rows of one element) sets the dim
        # order: consecutive rows, and the elements of a row, then run along its memory.
        primary = max([n for n in used_inputs if not per_row[n]] or used_inputs,
                      key=lambda n: self.task.inputs[self.sources[n]].storage_elements())
        primary_strides = self._strides(primary, placement.axes[primary], space)
        outer_dims = sorted((d for d in range(len(space)) if d not in dims), key=lambda d: (-primary_strides[d], d))
        inner_dims = sorted((d for d in range(len(space)) if d in dims), key=lambda d: (-primary_strides[d], d))
        strides = [self._strides(n, placement.axes[n], space) for n in used_inputs]
        strides += [self._output_strides(k, node, placement.axes[node], space, dims, per_row[node])
                    for k, node in enumerate(self.out_nodes)]
        outer, outer_strides = coalesce(tuple(space[d] for d in outer_dims),
                                        [tuple(st[d] for d in outer_dims) for st in strides])
        if outer == (1,):  # one row: it starts at each operand's first element
            outer_strides = [(0,) for _ in outer_strides]
        inner, inner_strides = coalesce(tuple(space[d] for d in inner_dims),
                                        [tuple(st[d] for d in inner_dims) for st in strides])
        return outer, inner, list(zip(outer_strides, inner_strides)), primary

    def _evaluate(self) -> None:
        """Meta value of every node; views of inputs are recorded as input nodes."""
        for node in self.nodes:
            if node.op == "placeholder":
                continue
            if node.target is operator.getitem:
                self.metas[node] = self.metas[node.args[0]][node.args[1]]
            elif node.target in REDUCTIONS:
                self.reductions.append(node)
                self.metas[node] = _call_on_meta(node, self.metas)
            elif node.target is aten.gather.default:
                self.gathers.append(node)
                self.metas[node] = _call_on_meta(node, self.metas)
            elif node.target in SCANS:
                if self.metas[node.args[0]].dim() == 0:
                    raise Unsupported(f"{node.name} scans a 0-d tensor")
                self.scans.append(node)
                self.metas[node] = _call_on_meta(node, self.metas)
            elif node.target in VIEWS:
                self.metas[node] = _call_on_meta(node, self.metas)
                source = node.args[0]
                if node.target is aten.as_strided.default and not is_reshape(self.metas[source], self.metas[node]):
                    raise Unsupported(f"{node.name} is an as_strided that is no reshape")
                if source in self.sources:
                    if not self.metas[node]._is_view():
                        raise Unsupported(f"{node.name} copies input {self.sources[source]} (no view has its shape)")
                    self.sources[node] = self.sources[source]
            elif node.target in OP_RULES or node.target is IOTA:
                self.metas[node] = meta_result(node, self.metas)
                if node.target is IOTA:
                    self.iotas.append(node)
            else:
                raise Unsupported(f"op {node.target} not supported")
            for value in _tensors(self.metas[node]):
                if value.dtype not in COMPUTE_DTYPES and not (value.dtype in INDEX_DTYPES and index_only(node)):
                    raise Unsupported(f"{node.name} is {value.dtype}, not supported")
        if not self.reductions and not self.scans:
            raise Unsupported("no reduction or scan")
        if self.scans and (self.reductions or len(self.scans) > 1):
            raise Unsupported("a scan with reductions or another scan not supported")

    def _rows(self) -> tuple[tuple[int, ...], frozenset[int]]:
        """The shape every reduction (or the scan) reads and the dims they reduce (it runs along),
        which must be the same."""
        found = {(tuple(self.metas[r.args[0]].shape), _reduced_dims(r, self.metas))
                 for r in self.reductions + self.scans}
        if len(found) != 1:
            raise Unsupported(f"reductions over different rows: {sorted((list(s), sorted(d)) for s, d in found)}")
        space, dims = found.pop()
        if math.prod(space) == 0:
            raise Unsupported("the reduced tensor is empty")
        for g in self.gathers:
            source, dim, index = g.args[:3]
            one = tuple(1 if d in dims else n for d, n in enumerate(space))
            if (tuple(self.metas[source].shape) != space or dims != {dim % len(space)}
                    or tuple(self.metas[index].shape) != one):
                raise Unsupported(f"{g.name} does not take one element of each row the reductions reduce")
        return space, dims

    def _space(self, read_shape: tuple[int, ...]) -> tuple[tuple[int, ...], Axes, dict[Node, Axes]]:
        """The iteration space, the runs of it the reduced shape's dims span, and the axes of the
        nodes that refined it: the reduced shape itself unless the reductions read a node through
        reshapes that split its dims further (GroupNorm's (N, G, C/G, H*W) of x)."""
        trivial = (read_shape, runs(read_shape, read_shape), {})
        sources = {}  # what the reductions read through reshapes: an input, or a value (bf16 x cast up)
        for r in self.reductions + self.scans:
            node = r.args[0]
            while node.op == "call_function" and node.target in RESHAPES:
                node = node.args[0]
            if node is not r.args[0]:
                sources[node] = meta_shape(self.metas[node])
        non_unit = lambda shape: [n for n in shape if n != 1]  # noqa: E731
        if all(non_unit(shape) == non_unit(read_shape) for shape in sources.values()):
            return trivial
        space = refine(read_shape, list(sources.values()))
        if space is None:
            return trivial  # the placement says what it cannot place
        return space, runs(space, read_shape), {p: runs(space, shape) for p, shape in sources.items()}

    def _place(self, space: tuple[int, ...], read: tuple[tuple[int, ...], Axes], read_dims: frozenset[int],
               placed_inputs: dict[Node, Axes]) -> Placement:
        shapes = {n: meta_shape(v) for n, v in self.metas.items() if isinstance(v, torch.Tensor)}
        placement = Placement(space, read, shapes)
        for node, axes in placed_inputs.items():
            placement.fix(node, axes)
        for r in self.reductions:
            placement.fix(r.args[0], read[1])
            keep = bool(bind_arguments(r).get("keepdim", False))
            result = reduced_axes(read[1], tuple(sorted(read_dims)), keep)
            for n in [r] + [u for u in r.users if u.target is operator.getitem]:
                if n in shapes:
                    placement.fix(n, result)
        for g in self.gathers:  # a per-row result, as a reduction that keeps its dim
            for n in (g, g.args[2]):
                placement.fix(n, reduced_axes(read[1], tuple(sorted(read_dims)), True))
        for scan in self.scans:  # an element value of the shape it reads
            for n in (scan.args[0], scan):
                placement.fix(n, read[1])
        changed = True
        while changed:
            changed = False
            for node in self.nodes:
                if (node.op == "placeholder" or node.target is operator.getitem or node.target in REDUCTIONS
                        or node.target in SCANS or node.target is aten.gather.default):
                    continue
                if node in self.sources:  # a view of an input: placed by its users, like an input
                    continue
                if node.target is aten.expand.default:  # broadcasts its value, as an op would
                    changed |= placement.propagate_broadcast(node, [node.args[0]])
                elif node.target in VIEWS:
                    changed |= placement.propagate_view(node, node.args[0])
                else:
                    changed |= placement.propagate_broadcast(node, list(node.all_input_nodes))
        unplaced = [n.name for n in self.nodes if n in shapes and n not in placement.axes
                    and (n not in self.sources or any(u not in self.sources for u in n.users))]
        if unplaced:
            raise Unsupported(f"cannot place {', '.join(unplaced)} on the rows")
        return placement

    def _strides(self, node: Node, axes, space: tuple[int, ...]) -> tuple[int, ...]:
        """Strides of an input node's elements over the dims of `space` (0 where it repeats)."""
        return _over_space(axes, self.metas[node].stride(), space)

    def _output_strides(self, k: int, node: Node, axes, space, dims, per_row: bool) -> tuple[int, ...]:
        spec, meta = self.task.outputs[k], self.metas[node]
        if not isinstance(meta, torch.Tensor) or tuple(meta.shape) != spec.shape or meta.dtype != spec.torch_dtype:
            raise Unsupported(f"output {k} is not the {spec.dtype}{list(spec.shape)} the task says")
        if node in self.sources:
            raise Unsupported(f"output {k} is an input seen through a view")
        if not is_dense(spec.shape, spec.stride):
            raise Unsupported(f"output {k} strides {spec.stride} are not a dense layout")
        covers = {d for d in range(len(space)) if space[d] != 1 and (per_row is False or d not in dims)}
        if set(space_dims(axes)) != covers:
            raise Unsupported(f"output {k} varies along part of the {'rows' if per_row else 'row elements'} only")
        return _over_space(axes, spec.stride, space)

    def _vector_width(self, inner, accesses, outputs) -> int:
        # vector_width's sizes get a leading 2 so that it never allows a scalar tail: every
        # vector lies inside one row.
        def operand(outer, inner_strides, spec):
            return tuple(outer) + tuple(inner_strides), spec.torch_dtype.itemsize
        element_in = [operand(a.outer, a.inner, self.task.inputs[a.input]) for a in accesses if not a.per_row]
        element_out = [operand(o.outer, o.inner, o.spec) for o in outputs if not o.per_row]
        if not element_in:
            return 1
        return vector_width((2,) + tuple(inner), [((0,) + st, size) for st, size in element_in],
                            [((0,) + st, size) for st, size in element_out])


class _Program:
    """The C statements of a plan: every node rendered once, sorted into the pass it runs in."""

    def __init__(self, builder: _Builder, placement: Placement, per_row: dict[Node, bool], access_of: dict[Node, int],
                 accesses: tuple[Access, ...], space: tuple[int, ...], dims: frozenset[int]):
        self.b = builder
        self.per_row = per_row
        self.access_of = access_of
        self.accesses = accesses
        self.row_length = math.prod(space[d] for d in dims)
        self.values: dict[Node, Value] = {}
        self.statements: dict[Node, list[str]] = {}  # node -> C lines computing it
        self.ready: dict[Node, int] = {}  # the pass after which a per-row value exists (-1: before any)
        self.partials: dict[int, list[tuple[Node, Partial]]] = {}  # level -> (source, partial) of that pass
        self.accumulators: dict[Node, str] = {}  # a max or min reduction -> its partial's accumulator
        self.finals: dict[int, list[str]] = {}  # level -> per-row lines finishing its reductions
        self.mean_of: dict[Node, Value] = {}  # var_mean -> its mean
        self.reciprocals: dict[tuple[str, bool], tuple[str, int, str]] = {}  # (divisor, fast) -> (var, level, line)
        # exp(y - max(y)) in fp32 -> its C form ("{}": its argument) and max(y)'s per-row variable
        self.exp_forms: dict[Node, tuple[str, str]] = {}
        self.online_exps: dict[str, Node] = {}  # an online partial's accumulator -> the exp it sums
        # a node rendered from others than its graph inputs (a tanh GELU's from its x alone): what
        # _needed walks instead, so the chain it replaced is not computed for it
        self.reads_of: dict[Node, list[Node]] = {}
        # A bf16 program computes in fp32 (softmax, cross-entropy); where every output is fp16/bf16
        # the fast exp and division (few fp32 ulps: Triton's tl.exp and `/`) are hidden by that rounding
        # and keep an exp-heavy row from being bound by the accurate expf's instructions.
        self.low_precision_outputs = all(s.torch_dtype in (torch.float16, torch.bfloat16)
                                         for s in builder.task.outputs)
        for node in builder.nodes:  # every placed node, and var_mean (a pair of tensors)
            if node in placement.axes or node.target is aten.var_mean.correction:
                self._render(node)

    def var(self, node: Node) -> str:
        return self.values[node].var

    def _render(self, node: Node) -> None:
        b = self.b
        meta = b.metas[node]
        if node in self.access_of:
            self.values[node] = Value(f"a{self.access_of[node]}", meta.dtype)
            self.statements[node] = []
            self.ready[node] = -1
            return
        if node in b.sources:  # a view of an input read only through other views
            return
        if node.target is operator.getitem:
            parent = node.args[0]
            self.values[node] = self.values[parent] if node.args[1] == 0 else self.mean_of[parent]
            self.statements[node], self.ready[node] = [], self.ready[parent]
            return
        if node.target in REDUCTIONS:
            self._render_reduction(node)
            return
        if node.target is aten.gather.default:
            self._render_gather(node)
            return
        if node.target is IOTA:  # the element's place in its row: j0 + v in the kernel's sweeps
            self.values[node] = Value(f"v{len(self.values)}", meta.dtype)
            start, step = (literal(k, "long long") for k in _iota_range(node))
            self.statements[node] = [f"const long long {self.var(node)} = {start} + {step} * (long long)(j0 + v);"]
            self.ready[node] = -1
            return
        if node.target in SCANS:  # the kernel's scan computes it (codegen), unless rows have one element
            if self.values[node.args[0]].dtype not in (torch.float32, torch.float16, torch.bfloat16):
                raise Unsupported(f"scan of a {self.values[node.args[0]].dtype} value not supported")
            var = f"v{len(self.values)}"
            self.values[node] = Value(var, meta.dtype)
            self.statements[node] = [f"const float {var} = {self._scan_source(node)};"] if self.per_row[node] else []
            self.ready[node] = self.ready[node.args[0]]
            return
        if node.target in VIEWS:
            self.values[node] = self.values[node.args[0]]
            self.statements[node], self.ready[node] = [], self.ready[node.args[0]]
            return
        rule = OP_RULES[node.target]
        bound = bind_arguments(node)
        if rule.kind == "compare":
            dtype = torch.result_type(*(b.metas[v] if isinstance(v, Node) else v for v in (bound["self"], bound["other"])))
        else:
            dtype = meta.dtype
        if rule.kind == "float" and not dtype.is_floating_point:
            raise Unsupported(f"op {node.target} on {dtype} not supported")
        args = OpArgs({k: self.values[v] if isinstance(v, Node) else v for k, v in bound.items()}, dtype,
                      round_operands=rule.kind != "any", fast_fp32=self.low_precision_outputs)
        info = operand_info(meta.dtype)  # an index made by a where (cross-entropy's masked target)
        expr = (self._gelu_tanh(node, args) or self._one_plus_tanh(node, args) or self._summed_exp(node, args)
                or self._exp_below_max(node, args) or rule.render(args))
        if self._by_reciprocal(node, bound, args):
            other = bound["other"]
            expr = f"({args['self']} * {self._reciprocal(args['other'], self.ready[other], args.fast)})"
        var = f"v{len(self.values)}"
        self.values[node] = Value(var, meta.dtype)
        self.statements[node] = [f"const {info.ctype} {var} = {expr};"]
        self.ready[node] = max((self.ready[a] for a in node.all_input_nodes), default=-1)
        found = _exp_less_max(node)
        if found and not found[2] and dtype == torch.float32 and expr.count(args["self"]) == 1:
            self.exp_forms[node] = expr.replace(args["self"], "{}"), self.var(found[1])

    def _gelu_tanh(self, node: Node, args: OpArgs) -> str | None:
        """0.5 x (1 + tanh(c (x + k x^3))), a decomposed tanh GELU, where every result is rounded
        to fp16/bf16, as x / (1 + exp(-2 c (x + k x^3))), the exp's argument x (a + b x^2) with
        a = -2 c log2(e), b = a k (ops.pw_gelu_tanh_fast): seven instructions where the chain with
        the fast 1 + tanh took thirteen (a LayerNorm + GELU over 8192 x 4096 bf16, held in
        registers, counted 35.2 an element, benchmarks/sass_mix.py; on an H100 that problem ran at
        96% of a copy with this form, 92% before: benchmarks/results, 2026-12-07)."""
        found = _gelu_tanh_parts(node) if args.fast else None
        if found is None:
            return None
        x, c, k = found
        self.reads_of[node] = [x]
        a = -2.0 * c * math.log2(math.e)
        v = self.values[x]
        return (f"pw_gelu_tanh_fast({cast(v.var, dtype_info(v.dtype).ctype, 'float')}, {literal(a, 'float')}, "
                f"{literal(a * k, 'float')})")

    def _one_plus_tanh(self, node: Node, args: OpArgs) -> str | None:
        """1 + tanh(z), where every result is rounded to fp16/bf16, as the fast 2 sigmoid(2 z)
        (ops.pw_one_plus_tanh_fast): the tanh GELU of a decomposed graph spent a quarter of
        LayerNorm + GELU's time in tanhf (an H200, 8192 x 4096 bf16: 64 us, 47 us without it)."""
        tanh = _tanh_plus_one(node) if args.fast else None
        if tanh is None:
            return None
        z = self.values[tanh.args[0]]
        return f"pw_one_plus_tanh_fast({cast(z.var, dtype_info(z.dtype).ctype, 'float')})"

    def _summed_exp(self, node: Node, args: OpArgs) -> str | None:
        """exp(y - max(y)) in fp32 (or rounded to fp16/bf16) read only by sums over the row, in
        the fast form that flushes subnormal results (ops.pw_exp_fast_ftz): such a term is below
        2^-126 beside the max's own exp(0) = 1, and the sum of terms each within a few fp32 ulps
        is within a few ulps (Inductor's fp32 exp is libdevice's accurate one; the verifier's
        float64 check bounds ours). The max may be logsumexp's, with its infinities as a
        constant (where(|m| == inf, 0, m): there every term is 0, or the sum inf, either way)."""
        if not _fast_sum_term(args) or not all(REDUCTIONS.get(u.target) == "sum" for u in node.users):
            return None
        return FTZ_EXP.format(args["self"]) if _exp_less_max(node) else None

    def _exp_below_max(self, node: Node, args: OpArgs) -> str | None:
        """exp(y - max(y)), every result rounded to fp16/bf16, read beyond the row's sums
        (softmax's output): its argument is at most 0, so it takes ops.pw_exp_fast_nonpositive,
        which keeps subnormal results without the fast form's subnormal handling. Not behind
        logsumexp's guard, whose constant may stand below y."""
        found = _exp_less_max(node) if args.fast else None
        return f"pw_exp_fast_nonpositive({args['self']})" if found and not found[2] else None

    def _online_sum(self, node: Node) -> bool:
        """Renders `node` as an online partial (Partial) where it is a sum of exp(y - max(y)) in
        fp32: the sum joins the max's pass (an exp that is also an output is computed again from
        the row's max where it is needed). Its final value is what the graph computes where the
        max is not finite: NaN (inf - inf), or, where logsumexp's guard replaced the max by a
        finite constant, 0 (every y is -inf) or inf. Its terms feed the sum alone: they flush
        subnormals, as _summed_exp's do."""
        exp = node.args[0]
        found = _exp_less_max(exp) if self.b.online and isinstance(exp, Node) else None
        if not found or REDUCTIONS[node.target] != "sum":
            return False
        y, amax, guarded = found
        if self.b.metas[exp].dtype != torch.float32 or self.values[y].dtype != torch.float32 or self.per_row[y]:
            return False
        level, scale = self.ready[amax], self.accumulators[amax]
        n = len(self.values)
        self._partial(level, y, Partial(f"acc{n}", "online", self.values[y].var, scale, FTZ_EXP))
        self.online_exps[f"acc{n}"] = exp
        final = "rows_online_sum_guarded" if guarded else "rows_online_sum"
        self.finals.setdefault(level, []).append(f"const float v{n} = {final}(acc{n}, {scale});")
        self.values[node] = Value(f"v{n}", torch.float32)
        self.statements[node] = []
        self.ready[node] = level
        return True

    def _by_reciprocal(self, node: Node, bound: dict, args: OpArgs) -> bool:
        """Whether `node` divides each element by a row's value through that value's reciprocal:
        where the result is rounded to fp16/bf16, or, in fp32, where the divisor is a softmax's
        sum (whose reciprocal is a normal number)."""
        other = bound.get("other")
        return (node.target is aten.div.Tensor and bound.get("rounding_mode") is None and isinstance(other, Node)
                and self.per_row[other] and not self.per_row[node]
                and (args.fast or args.dtype == torch.float32 and _sum_of_exp_below_max(other)))

    def _reciprocal(self, divisor: str, level: int, fast: bool) -> str:
        """The variable holding 1 / `divisor` (a per-row value ready after pass `level`), once a
        row: an element divided by a row's value (softmax's sum) is multiplied by it instead,
        one special-function instruction a row rather than one an element: the fast division's
        where every result is rounded to fp16/bf16 (a few fp32 ulps), else the correctly rounded
        one, within about an ulp of the quotient once multiplied (on an H200, 2026-11-27, a
        persistent fp32 softmax over 1024 rows of 393216 went from 986 to 911 us so)."""
        key = (divisor, fast)
        if key not in self.reciprocals:
            var = f"rcp{len(self.reciprocals)}"
            value = f"pw_div_fast(1.0f, {divisor})" if fast else f"(1.0f / {divisor})"
            self.reciprocals[key] = (var, level, f"const float {var} = {value};")
        return self.reciprocals[key][0]

    def _render_reduction(self, node: Node) -> None:
        kind = REDUCTIONS[node.target]
        source = node.args[0]
        level = self.ready[source] + 1
        if self.values[source].dtype not in (torch.float32, torch.float16, torch.bfloat16):
            raise Unsupported(f"reduction of a {self.values[source].dtype} value not supported")
        if self._online_sum(node) or self._one_hot_sum(node, kind):
            return
        src = self.values[source].var
        n = len(self.values)
        var = f"v{n}"
        if kind in ("sum", "mean", "max", "min"):
            combine = {"sum": "sum", "mean": "sum", "max": "max", "min": "min"}[kind]
            self._partial(level, source, Partial(f"acc{n}", combine, src))
            self.accumulators[node] = f"acc{n}"
            final = {"sum": f"(float)acc{n}", "mean": f"(float)(acc{n} / {self._n})"}.get(kind, f"acc{n}")
            self.finals.setdefault(level, []).append(f"const float {var} = {final};")
            self.ready[node] = level
        else:  # var, var_mean: the mean in one pass, the squared deviations from it in the next
            correction = bind_arguments(node).get("correction")
            divisor = max(0, self.row_length - (1 if correction is None else correction))
            self._partial(level, source, Partial(f"acc{n}", "sum", src))
            self.finals.setdefault(level, []).append(f"const float mean{n} = (float)(acc{n} / {self._n});")
            deviation = f"((({src}) - mean{n}) * (({src}) - mean{n}))"
            self._partial(level + 1, source, Partial(f"acc{n}_m2", "sum", deviation))
            self.finals.setdefault(level + 1, []).append(
                f"const float {var} = (float)(acc{n}_m2 / {literal(divisor, 'double')});")
            self.ready[node] = level + 1
            self.mean_of[node] = Value(f"mean{n}", torch.float32)
        dtype = _tensors(self.b.metas[node])[0].dtype
        self.values[node] = Value(var, dtype)
        self.statements[node] = []

    def _one_hot_sum(self, node: Node, kind: str) -> bool:
        """Renders a sum (or mean) over the row of an fp32 value made from per-row values and one
        eq of a per-row integer k with the row's iota (a one-hot: cross-entropy's backward sums
        its target's) once a row, with no pass over the row: the value where the eq holds times
        the places it holds at (1 where k is in the row, else 0), plus the value elsewhere times
        the rest. Exact where the terms elsewhere are 0, as a one-hot's are; else a product where
        eager sums equal terms. The pass it replaces read nothing and took 5% of the backward's
        time at 4096 x 32000 bf16 (141.2 against 134.6 us on an H200, 2026-11-27:
        benchmarks/ce_backward_one_hot.py)."""
        source = node.args[0]
        needed = self._needed([source])
        compares = [n for n in needed if n.target is aten.eq.Tensor]
        iotas = [n for n in needed if n.target is IOTA]
        if (kind not in ("sum", "mean") or self.values[source].dtype != torch.float32 or len(compares) != 1
                or len(iotas) != 1 or any(n in self.access_of for n in needed)):
            return False
        (compare,), (iota,) = compares, iotas
        column = {n for n in needed if self.values.get(n) is self.values[iota]}  # the iota and its views
        (k,) = [a for a in compare.args[:2] if a not in column] or [None]
        while k is not None and k.target in VIEWS and not self.per_row[k]:  # the per-row value it broadcasts
            k = k.args[0]
        start, step = _iota_range(iota)
        if (k is None or not self.per_row.get(k, False) or step != 1
                or any(a in column for n in needed - column - {compare} for a in n.all_input_nodes)):
            return False
        _, _, body = self._work(needed - column - {compare}, [])
        n, src, length = len(self.values), self.var(source), self.row_length
        lines = [f"float hot{n}, cold{n};"]
        for name, holds in ((f"hot{n}", "true"), (f"cold{n}", "false")):
            lines += ["{", f"  const bool {self.var(compare)} = {holds};", *("  " + line for line in body),
                      f"  {name} = {src};", "}"]
        k_var = self.var(k)
        lines += [f"const long long hits{n} = ({k_var} >= {start}LL && {k_var} < {start + length}LL) ? 1 : 0;",
                  f"const double total{n} = (hits{n} ? (double)hot{n} : 0.0)"
                  f" + (hits{n} < {length} ? (double)cold{n} * (double)({length} - hits{n}) : 0.0);",
                  f"const float v{n} = (float)(total{n}{'' if kind == 'sum' else f' / {self._n}'});"]
        self.values[node] = Value(f"v{n}", torch.float32)
        self.statements[node] = lines
        self.ready[node] = max((self.ready[a] for m in needed for a in m.all_input_nodes
                                if self.per_row.get(a, True) and a in self.ready), default=-1)
        return True

    def _render_gather(self, node: Node) -> None:
        """The element of each row at its index: once the source is ready, every thread of the
        row loads the elements the source is computed from at that place (one address a warp,
        from L2 when the row was just read) and computes it, as the source's pass computes it
        for every element. Out of the row, NaN (torch would raise)."""
        source, index = node.args[0], self.values[node.args[2]]
        if self.values[source].dtype not in (torch.float32, torch.float16, torch.bfloat16):
            raise Unsupported(f"gather of a {self.values[source].dtype} value not supported")
        if any(n.target is IOTA for n in self._needed([source])):  # its place here is `at`, not j0 + v
            raise Unsupported(f"{node.name} gathers a value made from a column index")
        reads, body = self._element_work([source])
        n = len(self.values)
        nan = literal(float("nan"), "float")
        lines = [f"float v{n} = {nan};", "{",
                 f"  const idx_t at = (idx_t)({index.var});",
                 f"  if (row_ok && at >= 0 && at < {self.row_length}) {{"]
        for k in reads:
            access = self.accesses[k]
            info = dtype_info(self.b.task.inputs[access.input].torch_dtype)
            load = info.load.format(f"in{access.input}[a{k}_base + at * {access.inner[0]}]")
            lines.append(f"    const {info.ctype} a{k} = {load};")
        lines += ["    " + line for line in body] + [f"    v{n} = {self.values[source].var};", "  }", "}"]
        self.values[node] = Value(f"v{n}", self.b.metas[node].dtype)
        self.statements[node] = lines
        self.ready[node] = self.ready[source]

    @property
    def _n(self) -> str:
        """The row length as a C double."""
        return literal(self.row_length, "double")

    def _partial(self, level: int, source: Node, partial: Partial) -> None:
        self.partials.setdefault(level, []).append((source, partial))

    def scan(self, scans: list[Node]) -> Scan | None:
        """The plan's scan (at most one; none where rows have one element: there it is its source)."""
        if not scans or self.per_row[scans[0]]:
            return None
        node = scans[0]
        return Scan(Pass(*self._element_work([node.args[0]])), self._scan_source(node), self.var(node))

    def _scan_source(self, node: Node) -> str:
        """What a scan sums per element: its source, rounded where the scan's dtype asks
        (cumsum(x, dtype=torch.bfloat16) of fp32 x sums x rounded to bf16)."""
        source, dtype = self.values[node.args[0]], self.values[node].dtype
        return source.var if source.dtype == dtype else dtype_info(dtype).round.format(source.var)

    def passes(self, out_nodes: list[Node]) -> tuple[tuple[Pass, ...], tuple[str, ...], Pass]:
        levels = max(self.partials, default=-1) + 1
        row_lines: dict[int, list[str]] = {}
        for node in self.b.nodes:
            if node in self.statements and self.per_row.get(node, True) and node not in self.access_of:
                row_lines.setdefault(self.ready[node], []).extend(self.statements[node])
        for _, level, line in self.reciprocals.values():  # after the divisor, computed at that level
            row_lines.setdefault(level, []).append(line)
        prelude = tuple(row_lines.get(-1, []))
        sweeps = [[n for n, _ in self.partials.get(level, [])] for level in range(levels)]
        sweeps.append([n for n in out_nodes if not self.per_row[n]])  # the epilogue
        whole = [self._needed(roots) for roots in sweeps]  # each sweep's nodes, nothing kept
        kept_at = self._kept(sweeps, whole)
        terms = {} if kept_at else self._kept_terms(whole)
        works = []
        for i, roots in enumerate(sweeps):
            reads, _, body = self._work(whole[i], [])
            keeps = tuple(self._typed(n) for n, at in kept_at.items() if at == i)
            works.append((reads, body, keeps, self._reuse(roots, kept_at, i), self._reuse(roots, terms, i)))
        passes = tuple(Pass(reads, body, tuple(p for _, p in self.partials.get(level, [])),
                            tuple(self.finals.get(level, []) + row_lines.get(level, [])), keeps, reuse, rescaled)
                       for level, (reads, body, keeps, reuse, rescaled) in enumerate(works[:-1]))
        reads, body, keeps, reuse, rescaled = works[-1]
        return passes, prelude, Pass(reads, body, keeps=keeps, reusing=reuse, rescaled=rescaled)

    def _reuse(self, roots: list[Node], kept: dict[Node, int], i: int) -> Reuse | None:
        """Sweep i's work computing `roots` where earlier sweeps kept values (`kept`: each with the
        sweep that keeps it), or None where it takes none of them."""
        earlier = {n for n, at in kept.items() if at < i}
        needed = self._needed(roots, earlier)
        takes = [n for n in self.b.nodes if n in earlier and n in needed]
        return Reuse(*self._work(needed - earlier, takes)) if takes else None

    def _kept_terms(self, whole: list[set[Node]]) -> dict[Node, int]:
        """The exps of online sums (softmax's exp(y - max(y))) a later sweep reads, each with its
        sum's pass, where every element that pass reads a later sweep reads too (so it is held on
        chip, and a thread may take its max first: codegen). Marks each sum's partial `kept`."""
        reads = [set(self._work(nodes, [])[0]) for nodes in whole]
        terms = {}
        for level, partials in self.partials.items():
            later = set().union(*reads[level + 1:])
            for i, (source, p) in enumerate(partials):
                exp = self.online_exps.get(p.acc)
                if (exp in self.exp_forms and any(exp in nodes for nodes in whole[level + 1:])
                        and reads[level] <= later):
                    terms[exp] = level
                    partials[i] = (source, replace(p, kept=(self.var(exp), *self.exp_forms[exp])))
        return terms

    def _kept(self, sweeps: list[list[Node]], needed: list[set[Node]]) -> dict[Node, int]:
        """The costly element values (COSTLY) a later sweep needs, each with the sweep that first
        computes them; not those later sweeps reach only through another kept value. `needed`:
        each sweep's nodes where nothing is kept."""
        first = {n: next(i for i, nodes in enumerate(needed) if n in nodes)
                 for n in self.b.nodes if any(n in nodes for nodes in needed)}
        kept = {n: at for n, at in first.items()
                if n.target in COSTLY and any(n in later for later in needed[at + 1:])}
        used: set[Node] = set()
        for i, roots in enumerate(sweeps):
            earlier = {n for n, at in kept.items() if at < i}
            used |= earlier & self._needed(roots, earlier)
        return {n: at for n, at in kept.items() if n in used}

    def _typed(self, node: Node) -> tuple[str, str]:
        return dtype_info(self.values[node].dtype).ctype, self.var(node)

    def _element_work(self, roots: list[Node]) -> tuple[tuple[int, ...], tuple[str, ...]]:
        """The element accesses read and the element statements run to compute `roots`."""
        reads, _, body = self._work(self._needed(roots), [])
        return reads, body

    def _needed(self, roots: list[Node], stop: set[Node] = frozenset()) -> set[Node]:
        """The element nodes computing `roots` takes, not looking past the nodes of `stop`."""
        needed: set[Node] = set()
        stack = list(roots)
        while stack:
            n = stack.pop()
            if n in needed or self.per_row.get(n, True) or n not in self.statements:
                continue
            needed.add(n)
            if (n not in stop and n.target is not operator.getitem and n.target not in REDUCTIONS
                    and n.target not in SCANS and n not in self.access_of):
                stack.extend(self.reads_of.get(n, n.all_input_nodes))
        return needed

    def _work(self, needed: set[Node], takes: list[Node]) -> tuple[tuple[int, ...], tuple, tuple[str, ...]]:
        """(accesses read, kept values taken, statements run) for the element nodes `needed`."""
        ordered = [n for n in self.b.nodes if n in needed]
        reads = tuple(sorted(self.access_of[n] for n in ordered if n in self.access_of))
        return reads, tuple(map(self._typed, takes)), tuple(line for n in ordered for line in self.statements[n])


def needs_wide_index(elements: int, specs) -> bool:
    """Whether offsets up to `elements`, or into the storage of any of `specs`, need 64 bits."""
    return elements >= 2**31 or any(s.storage_elements() >= 2**31 for s in specs)


def _binary(node, target) -> tuple | None:
    """The two operands of `node` where it is `target` (an add's alpha 1), else None."""
    if not isinstance(node, Node) or node.target is not target or len(node.args) != 2:
        return None
    return tuple(node.args) if bind_arguments(node).get("alpha") in (None, 1) else None


def _times_constant(node) -> tuple[Node, float] | None:
    """(x, c) where `node` is x * c or c * x, c a Python number."""
    operands = _binary(node, aten.mul.Tensor)
    if operands is None:
        return None
    x, c = operands if isinstance(operands[0], Node) else operands[::-1]
    return (x, float(c)) if isinstance(x, Node) and type(c) in (int, float) else None


def _gelu_tanh_parts(node: Node) -> tuple[Node, float, float] | None:
    """(x, c, k) where `node` is 0.5 x (1 + tanh(c (x + k x^3))) as torch decomposes a tanh GELU
    (x^3 as (x x) x) or as Hugging Face's gelu_new writes it (x^3 as pow(x, 3.0)); each op's
    operands in either order."""
    operands = _binary(node, aten.mul.Tensor)
    for half, one_plus in (operands, operands[::-1]) if operands else ():
        scaled, tanh = _times_constant(half), _tanh_plus_one(one_plus)
        if scaled is None or scaled[1] != 0.5 or tanh is None:
            continue
        x = scaled[0]
        inner = _times_constant(tanh.args[0])  # c (x + k x^3)
        summed = _binary(inner[0], aten.add.Tensor) if inner else None  # x + k x^3
        cubed = _times_constant(_other_than(summed, x)) if summed else None  # k x^3
        if cubed is not None and _is_cube(cubed[0], x):
            return x, inner[1], cubed[1]
    return None


def _tanh_plus_one(node) -> Node | None:
    """The tanh where `node` is tanh(z) + 1 or 1 + tanh(z)."""
    operands = _binary(node, aten.add.Tensor)
    return next((t for t, one in (operands, operands[::-1]) if isinstance(t, Node) and t.target is aten.tanh.default
                 and type(one) in (int, float) and one == 1), None) if operands else None


def _other_than(pair: tuple, x: Node):
    """The operand of `pair` beside `x`, where one of them is `x`."""
    return pair[1] if pair[0] is x else pair[0] if pair[1] is x else None


def _is_cube(node, x: Node) -> bool:
    """Whether `node` is (x x) x, x (x x) or pow(x, 3)."""
    if isinstance(node, Node) and node.target is aten.pow.Tensor_Scalar:
        return node.args[0] is x and type(node.args[1]) in (int, float) and node.args[1] == 3
    operands = _binary(node, aten.mul.Tensor)
    return operands is not None and _binary(_other_than(operands, x), aten.mul.Tensor) == (x, x)


def _exp_less_max(node: Node) -> tuple[Node, Node, bool] | None:
    """(y, amax(y), guarded) where `node` is exp(y - m), m being amax(y) seen through views, or
    (guarded) logsumexp's where(|m| == inf, c, m) of a finite constant c."""
    if node.target is not aten.exp.default:
        return None
    sub = node.args[0]
    if not isinstance(sub, Node) or sub.target is not aten.sub.Tensor or bind_arguments(sub).get("alpha", 1) != 1:
        return None
    y, c = sub.args[0], _through_views(sub.args[1])
    guarded = (isinstance(c, Node) and c.target is aten.where.self and _tests_infinite(c.args[0], c.args[2])
               and _finite_constant(c.args[1]))
    if guarded:
        c = c.args[2]
    if not (isinstance(c, Node) and c.target is aten.amax.default and c.args[0] is y):
        return None
    return y, c, guarded


def _sum_of_exp_below_max(node: Node) -> bool:
    """`node` is a sum of exp(y - amax(y)) over the row (softmax's denominator, seen through
    views): at least 1 (the max's own term) and at most the row's length, or NaN, so its
    reciprocal is a normal number and x * (1 / sum) is within about an ulp of the quotient."""
    node = _through_views(node)
    if not isinstance(node, Node) or REDUCTIONS.get(node.target) != "sum" or not isinstance(node.args[0], Node):
        return False
    found = _exp_less_max(node.args[0])
    return found is not None and not found[2]


def _through_views(value):
    """`value`, or what the views it is (a chain of them) are of."""
    while isinstance(value, Node) and value.target in VIEWS:
        value = value.args[0]
    return value


def _finite_constant(value) -> bool:
    """`value` is a finite number, or a full() of one."""
    if isinstance(value, Node) and value.target is aten.full.default:
        value = value.args[1]
    return isinstance(value, (int, float)) and math.isfinite(value)


def _tests_infinite(cond, value) -> bool:
    """`cond` is abs(value) == inf (logsumexp's test of its max)."""
    return (isinstance(cond, Node) and cond.target is aten.eq.Scalar and cond.args[1] == math.inf
            and isinstance(cond.args[0], Node) and cond.args[0].target is aten.abs.default
            and cond.args[0].args[0] is value)


def _along_rows(strides: tuple[tuple[int, ...], tuple[int, ...]]) -> bool:
    """Threads run along the rows (the primary input's (outer, inner) `strides`): its elements
    are contiguous, or its consecutive rows are not."""
    outer, inner = strides
    return inner[-1] == 1 or outer[-1] != 1


def _over_space(axes: Axes, strides, space: tuple[int, ...]) -> tuple[int, ...]:
    """Strides over the dims of `space` of a tensor of `strides` placed at `axes` (0 where it
    repeats): a dim spanning a run of space dims steps through them row-major."""
    out = [0] * len(space)
    for run, stride in zip(axes, strides):
        for d in reversed(run or ()):
            out[d] = stride
            stride *= space[d]
    return tuple(out)


def _call_on_meta(node: Node, metas: dict) -> object:
    args = [metas[a] if isinstance(a, Node) else a for a in node.args]
    kwargs = {k: metas[v] if isinstance(v, Node) else v for k, v in node.kwargs.items()}
    try:
        return node.target(*args, **kwargs)
    except Exception as e:
        raise Unsupported(f"op {node.target} fails on these arguments: {str(e).splitlines()[0]}") from e


def _reduced_dims(node: Node, metas: dict) -> frozenset[int]:
    rank = metas[node.args[0]].dim()
    dims = bind_arguments(node).get("dim")
    if isinstance(dims, int):  # a scan's one dim
        return frozenset({dims % rank})
    if not dims:  # None or []: every dim
        return frozenset(range(rank))
    return frozenset(d % rank for d in dims)


def _tensors(value) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [v for v in value if isinstance(v, torch.Tensor)]
    return []
