"""RowPlan -> Candidates: a handful of launch shapes worth trying, each as a ModelNew program."""
from __future__ import annotations

import dataclasses
import math
import string

from agent_backend.specs import Candidate
from skills.pointwise.errors import Unsupported

from . import codegen as this_codegen
from .codegen import (TYPICAL_SM_COUNT, WARP, Launch, blocks_per_sm, buffer_bytes, can_persist, can_prefetch,
                      grid_blocks, is_vector_access, keeps_values, lanes, lanes_fit, lanes_fit_along,
                      register_budget, shared_bytes, streamed_access, vectors_per_thread)
from .plan import RowPlan

REGISTER_WORDS = 32        # 32-bit registers a thread may spend on its part of the on-chip rows
MAX_LANES = 8              # rows a thread takes along them at once (Launch.lanes): its sums and loads grow so
SHARED_BYTES = 200 * 1024  # dynamic shared memory a block may spend on them (227 KB on sm_90)
MAX_CLUSTER = 8            # the portable thread-block cluster size
# A split row's blocks: 256 threads each, at most four an SM (half its threads), so that the
# cooperative grid is resident at up to 64 registers a thread.
SPLIT_THREADS, SPLIT_BLOCKS = 256, 4 * TYPICAL_SM_COUNT
# A split row is also held in registers at up to this many words a thread (fewer blocks a row,
# more loads in flight a thread): on an H200 (2026-11-26, twenty-second session), softmax over
# 16 x 393216 bf16, online, ran 17.0 us at 48 words (256 threads x 16 blocks a row, or 128 x 32),
# 19.7 us at 24 (256 x 32), 21.1 us from 24 KB of shared memory a block (256 x 32, the shape
# offered until then); Inductor 52.9 us, a copy 10.9 us. In fp32, 25.1 us at 96 words (128 x 32,
# online) and 25.4 us (256 x 32, each exp kept too), 27.0 us from 96 KB of shared memory (256 x 16).
SPLIT_REGISTER_WORDS = 96  # ... and within codegen.register_budget for the resident grid
MAX_BLOCK = 1024
# The most elements of its row a thread of a persistent cluster holds (_persistent_clusters):
# bf16 ones widen to fp32 as they are reduced, and at 192 a thread the kernel spilled.
PERSISTENT_ELEMENTS = 96
# A row held on chip at least this long is also offered prefetched (one block an SM): on an H200,
# GroupNorm over 512 rows of 64 KB ran 1.16x faster so; softmax's rows of 16 KB fill an SM with
# several blocks already, whose loads overlap one another's work.
PREFETCH_ROW_BYTES = 32 * 1024
# ... and only where there are at most this many rows an SM. On an H200 (2026-11-26, twenty-first
# session) GroupNorm's 512 rows (4 an SM) ran 9-16% faster prefetched; with 4096 rows of 32-64 KB
# (cross-entropy, logsumexp), where several waves of blocks overlap one another's loads anyway,
# every prefetched shape lost, at 1 to 8 blocks an SM.
PREFETCH_ROWS_PER_SM = 8
# A split column sum's block: a warp of consecutive rows (contiguous accesses) by this many
# threads along them (256 threads, four blocks an SM, as a split row's).
SPLIT_COLUMN_THREADS = 8
# Where a thread takes several consecutive rows (a 16-byte vector across them): 8 threads across
# (128 bytes of each row's elements) by 32 along, and 32 across by 8 along; 256 threads a block.
# On an H100 (2026-11-25) the second ran 2-10x slower while every thread of every block folded all
# of its rows' slots of the workspace (split 32-64) after grid.sync(); only the storing thread does now.
LANE_ROWS, LANE_BLOCK = (8, 32), 256
# A scan's threads a row: each warp's total is read by every thread of the row once a tile, so
# more warps cost more (on an H100, cumsum of 8192 x 4096: 128-256 threads 98-100% of the copy
# rate in bf16 and fp32, 32-64 threads 90-96%, 512 88-95%, 1024 47-76%).
SCAN_MAX_THREADS = 256
SCAN_VECTORS_PER_THREAD = (8, 4, 2)
# A kernel that writes only a value or two a row is also offered its first two shapes that give
# every SM a block with the rows loaded past L1 (Launch.no_l1). On an H200 (2026-11-27, twenty-sixth
# session; benchmarks/results/no_l1_probe-h200-...): logsumexp of 4096 x 8192 bf16 22.6 us against
# 25.5 (a copy of as many bytes 21.2), fp32 39.0 against 42.5 (Inductor 43.6); a column sum of 16384
# x 4096 bf16 50.1 against 55.3; MSE 42.9 against 44.7; cross-entropy's rows within 1% in bf16, 3%
# slower in fp32 online. Where each element's result is stored too (softmax, the norms), 1-4%
# slower.
NO_L1_SHAPES = 2


def _pow2_at_least(n: int) -> int:
    return 1 << max(0, math.ceil(math.log2(max(n, 1))))


def _words(plan: RowPlan, launch: Launch) -> float:
    """Registers a thread holds its part of the stored rows in, with the values kept of them."""
    per_vector = sum(buffer_bytes(plan, k, launch.width) for k in plan.stored) / 4
    if keeps_values(plan, launch):
        per_vector += plan.kept_words * launch.width
    return vectors_per_thread(plan, launch) * per_vector


def _rows_per_block(plan: RowPlan, threads: int) -> int:
    """Up to 128 threads a block (at least a warp), fewer rows a block while that leaves
    blocks for every SM."""
    if threads >= 128:
        return 1
    rows, least = 128 // threads, max(1, 32 // threads)
    while rows > least and -(-plan.rows // rows) < TYPICAL_SM_COUNT:
        rows //= 2
    return rows


def launch_configs(plan: RowPlan) -> list[Launch]:
    """The launch shapes to try for `plan` (at most 6, and NO_L1_SHAPES of them again loading
    past L1 where that may pay), or Unsupported if none fits."""
    configs = _scan_rows(plan) if plan.scan else _along_rows(plan) if plan.along_rows else _across_rows(plan)
    configs = _sharing_lanes(plan, configs) + configs
    unique = list(dict.fromkeys(configs))[:6]
    if not unique:
        raise Unsupported(f"rows of {plan.row_length} elements do not fit on chip "
                          f"(even across a cluster of {MAX_CLUSTER} blocks)")
    if not _may_skip_l1(plan):
        return unique
    # the first shapes that give every SM a block (one block over a whole loss is never the one),
    # not prefetching ones (their rows come by cp.async)
    twinned = [c for c in unique if grid_blocks(plan, c) >= TYPICAL_SM_COUNT and not c.prefetch][:NO_L1_SHAPES]
    return [t for c in unique for t in ((c, dataclasses.replace(c, no_l1=True)) if c in twinned else (c,))]


def _sharing_lanes(plan: RowPlan, configs: list[Launch]) -> list[Launch]:
    """Along rows, `configs` (whole rows a block) with each thread taking all of a run of up to
    MAX_LANES rows that read one vector alike (a matrix-vector product's rows for each vector, W's
    row read once for all of them: lanes_fit_along), where the plan has such runs."""
    lanes = plan.outer[-1] if plan.along_rows and plan.outer else 1
    if not 1 < lanes <= MAX_LANES or not lanes_fit_along(plan, lanes):
        return []
    return [dataclasses.replace(c, lanes=lanes) for c in configs
            if c.blocks_per_row == 1 and not (c.prefetch or c.persistent)]


def _may_skip_l1(plan: RowPlan) -> bool:
    """Whether loading the rows without L1 (Launch.no_l1) is worth a candidate: the kernel writes
    only a value or two a row (so it is bound by its loads) and reads some input no other row does."""
    return (not plan.scan and plan.row_length > 1 and all(o.per_row for o in plan.outputs)
            and any(streamed_access(plan, k) for k in range(len(plan.accesses))))


def _one_block_a_row_shapes(plan: RowPlan) -> list[Launch]:
    """Each power of two of threads a row, up to one a vector (or 1024), at the plan's width."""
    vectors = plan.row_length // plan.vector_width
    counts = [1 << k for k in range(11) if 1 << k <= min(MAX_BLOCK, _pow2_at_least(vectors))]
    return [Launch(t, _rows_per_block(plan, t), plan.vector_width) for t in counts]


def _fewest_threads(plan: RowPlan, shapes: list[Launch], per_thread: int) -> Launch:
    """The first of `shapes` giving each thread at most `per_thread` vectors, else the last."""
    return next(c for c in shapes if vectors_per_thread(plan, c) <= per_thread or c is shapes[-1])


def _scan_rows(plan: RowPlan) -> list[Launch]:
    """A scan streams each row within one block (no cluster, split or shared-memory shapes): the
    fewest threads, up to SCAN_MAX_THREADS, giving each at most 8, 4 and 2 vectors."""
    shapes = [c for c in _one_block_a_row_shapes(plan) if c.threads <= SCAN_MAX_THREADS]
    return [_fewest_threads(plan, shapes, per_thread) for per_thread in SCAN_VECTORS_PER_THREAD]


def _along_rows(plan: RowPlan) -> list[Launch]:
    width = plan.vector_width
    vectors = plan.row_length // width
    shapes = _one_block_a_row_shapes(plan)
    if not plan.stored:  # one sweep, nothing held: the fewest threads with at most 8 or 2 vectors each
        configs = [_fewest_threads(plan, shapes, per_thread) for per_thread in (8, 2)]
        if configs[0].threads == MAX_BLOCK and plan.rows >= TYPICAL_SM_COUNT:
            # rows so long that 8 vectors a thread take the largest block, and a block for every
            # SM: also a half, a quarter and an eighth of its threads, a longer stream each (on an
            # H200, fp32 cross-entropy's online rows of 32000: 128 threads 137.9 us, 256 144.3 us,
            # 512 164.6 us, 1024 263.5 us; benchmarks/results/rows_plans-h200-...-twentyfirst.txt)
            configs += [c for c in shapes if c.threads in (MAX_BLOCK // 2, MAX_BLOCK // 4, MAX_BLOCK // 8)][::-1]
        configs += _split_rows(plan)
        cluster = 1
        while (cluster < MAX_CLUSTER and plan.rows * cluster * 2 <= TYPICAL_SM_COUNT
               and vectors >= MAX_BLOCK * cluster * 2 * 4):
            cluster *= 2
        if cluster > 1:
            configs.append(Launch(MAX_BLOCK, 1, width, "registers", cluster))
        if cluster >= 4:  # on an H100, 16 x 393216: these 1.04-1.07x Inductor, the largest cluster 1.00-1.02x
            configs += [Launch(MAX_BLOCK, 1, width, "registers", cluster // 2),
                        Launch(MAX_BLOCK // 2, 1, width, "registers", cluster)]
        return configs
    # the fewest threads whose part of the row fits in registers, and twice and four times as many
    configs = [c for c in shapes if _words(plan, c) <= REGISTER_WORDS][:3]
    held = configs[:1]  # the shapes also offered prefetched
    if configs and configs[0].threads >= 512:
        # and half those threads, twice the registers: two rows an SM where one block's rows would
        # fill it (on an H100, cross-entropy over 32000 classes, bf16: 1.17x Inductor, 32 words 1.06x)
        held += [c for c in shapes if c.threads == configs[0].threads // 2 and _words(plan, c) <= 2 * REGISTER_WORDS]
        configs += held[1:]
        # and that row over a cluster of two blocks of half as many threads again: where even that
        # block fills an SM's registers, two half rows an SM load while the other reduces (on an
        # H200, fp32 cross-entropy over 32000 classes: 158 us, t512 196 us, Inductor's 200 us)
        pair = Launch(configs[0].threads // 4, 1, width, "registers", 2)
        configs += [pair] if _words(plan, pair) <= 2 * REGISTER_WORDS else []
    configs += _prefetching(plan, held)
    if vectors >= 2 * MAX_BLOCK:  # long rows: a block each, in shared memory, or a cluster each
        whole = Launch(MAX_BLOCK, 1, width, "shared")
        if shared_bytes(plan, whole) <= SHARED_BYTES:
            configs.append(whole)
        split = _split_rows(plan)
        # where few rows split over a cooperative grid, no cluster: on an H200 (2026-11-26), softmax
        # over 16 x 393216, every cluster shape ran 0.87-1.18x Inductor in three searches, the
        # split ones 1.27-1.81x (benchmarks/results/suite-h200-...-twentysecond-long-rows*)
        if not split:
            for storage, fits in (("registers", lambda c: _words(plan, c) <= REGISTER_WORDS),
                                  ("shared", lambda c: shared_bytes(plan, c) <= SHARED_BYTES)):
                cluster = 2
                while cluster <= MAX_CLUSTER:
                    c = Launch(MAX_BLOCK, 1, width, storage, cluster)
                    if fits(c) and (plan.rows * cluster <= 2 * TYPICAL_SM_COUNT or not configs):
                        configs.append(c)
                        break
                    cluster *= 2
        configs += split
        if not held:  # no block holds a row in registers: a cluster must (softmax of 8192 fp32 needs none)
            configs += _persistent_clusters(plan)
    return configs


def _persistent_clusters(plan: RowPlan) -> list[Launch]:
    """Rows too long for a block and too many for a cluster each at once (KernelBench's softmax
    over 4096 x 393216): a row over a cluster of MAX_CLUSTER blocks held in registers, the
    clusters persistent (Launch.persistent).
    Offered at the fewest threads holding at most PERSISTENT_ELEMENTS a thread, within the
    register budget of a thread of one block an SM: more elements a thread spill, fewer leave
    fewer loads in flight.
    On an H200 (2026-11-27, benchmarks/results/persistent_probe-h200-...) a hand-written kernel
    of this structure ran at 85% of a copy's rate in bf16 (1.80x Inductor; 512 threads) and 88%
    in fp32 (1.40x). Over 1024 x 393216 the generated bf16 one ran 469 us at 512 threads, 573
    at 256 (spilled) and 632 at 1024; the fp32 one, with the sum's reciprocal, 907 us at 512,
    1017 at 256 and 1066 at 1024 (spilled; 955 dividing instead); over 4096 rows fp32 took
    3525 us at 512 threads and 4145 at 1024 (persistent_gap-h200-...-twentyninth.txt). With the
    row barrier releasing shared memory only (codegen.CLUSTER_SYNC_FUNCTION), 1024 rows at 512
    threads took bf16 443 us and fp32 887, 86% of a copy each, ahead of the hand-written kernels
    that stage rows in shared memory by bulk copies (bf16 447; persistent_gap-h200-...-thirtieth)."""
    if plan.rows * MAX_CLUSTER <= TYPICAL_SM_COUNT:
        return []
    shapes = [Launch(t, 1, plan.vector_width, "registers", MAX_CLUSTER, persistent=True)
              for t in (MAX_BLOCK // 4, MAX_BLOCK // 2, MAX_BLOCK)]
    return [c for c in shapes if can_persist(plan, c) and vectors_per_thread(plan, c) * c.width <= PERSISTENT_ELEMENTS
            and _words(plan, c) <= register_budget(c, 1)][:1]


def _prefetching(plan: RowPlan, held: list[Launch]) -> list[Launch]:
    """Register shapes `held` (the first, and the one of half its threads and twice the registers)
    as one block an SM looping over the rows, prefetching the next (Launch.prefetch), where its
    rows are long enough that an SM holds one or two at once (PREFETCH_ROW_BYTES) and more rows
    than SMs make it loop, but few enough a SM that one-row blocks come in few waves
    (PREFETCH_ROWS_PER_SM). On an H200, fp32 GroupNorm's 512 rows of 128 KB ran 39.7 us prefetched
    at 512 threads (64 words a thread), 44.2 us at 1024, 43.5 us not prefetched."""
    if not TYPICAL_SM_COUNT < plan.rows <= PREFETCH_ROWS_PER_SM * TYPICAL_SM_COUNT:
        return []
    shapes = [dataclasses.replace(c, prefetch=True) for c in held]
    # shared_bytes: the next row's copy, the row as the block holds it
    return [c for c in shapes if can_prefetch(plan, c) and PREFETCH_ROW_BYTES <= shared_bytes(plan, c) <= SHARED_BYTES]


def _split_rows(plan: RowPlan) -> list[Launch]:
    """Few long rows (a sum or softmax of 16 x 393216, a loss over a whole tensor), each split
    over enough blocks of a cooperative grid to fill every SM, at least 4 vectors a thread: a
    sweep at that split and half of it; rows held on chip at that split, in registers where
    they fit in half the words (four blocks an SM), else in shared memory, 25 KB a block; where
    neither fits (fp32), in shared memory at half the split, two blocks an SM of up to 100 KB
    (on an H200, softmax of 16 x 393216 fp32: 1.41x Inductor, the cluster kernel 0.99x; four
    blocks of 48 KB ran no faster, 25.7-26.7 us against 26.8 us)."""
    width = plan.vector_width
    vectors = plan.row_length // width
    split = 1
    while plan.rows * split * 2 <= SPLIT_BLOCKS and vectors >= SPLIT_THREADS * split * 2 * 4:
        split *= 2
    if split < 4:
        return []
    if not plan.stored:
        return [Launch(SPLIT_THREADS, 1, width, split=split), Launch(SPLIT_THREADS, 1, width, split=split // 2)]
    held = [Launch(SPLIT_THREADS, 1, width, storage, split=s) for storage, s in
            (("registers", split), ("shared", split), ("shared", split // 2))]
    fits = [_words(plan, held[0]) <= REGISTER_WORDS // 2, shared_bytes(plan, held[1]) <= SHARED_BYTES // 8,
            shared_bytes(plan, held[2]) <= SHARED_BYTES // 2]
    return ([next(c for c, ok in zip(held, fits) if ok)] if any(fits) else []) + _wide_register_splits(plan, split)


def _wide_register_splits(plan: RowPlan, split: int) -> list[Launch]:
    """A split row held in registers at the fewest blocks a row that still fill every SM, and the
    same slices at half the threads over twice the blocks, where they fit (_fits_registers)."""
    width = plan.vector_width
    while (split > 1 and plan.rows * (split // 2) >= TYPICAL_SM_COUNT
           and _fits_registers(plan, Launch(SPLIT_THREADS, 1, width, split=split // 2))):
        split //= 2
    shapes = [Launch(SPLIT_THREADS, 1, width, split=split), Launch(SPLIT_THREADS // 2, 1, width, split=2 * split)]
    return [c for c in shapes if grid_blocks(plan, c) <= SPLIT_BLOCKS and _fits_registers(plan, c)]


def _fits_registers(plan: RowPlan, launch: Launch) -> bool:
    """Whether a split launch's slice fits in SPLIT_REGISTER_WORDS a thread and in the register
    budget of a thread of a resident grid."""
    return _words(plan, launch) <= min(SPLIT_REGISTER_WORDS, register_budget(launch, blocks_per_sm(plan, launch)))


def _across_rows(plan: RowPlan) -> list[Launch]:
    """Threads along consecutive rows (a warp's accesses are then contiguous), a few threads
    along each row: as many as give each thread about 32, 8 or 2 elements (at most 32)."""
    configs = []
    for per_thread in (32, 8, 2):
        threads = min(32, _pow2_at_least(-(-plan.row_length // per_thread)))
        rows = max(32, 256 // threads)
        while rows > 32 and -(-plan.rows // rows) < TYPICAL_SM_COUNT:
            rows //= 2
        c = Launch(threads, rows)
        if _words(plan, c) <= REGISTER_WORDS:
            configs.append(c)
    width = _lanes_width(plan)
    if width > 1:  # a vector across rows each access, each row's elements read 128 bytes at a time
        return [c for rows in LANE_ROWS for c in _split_columns(plan, LANE_BLOCK // rows, rows, width)] + configs
    return configs + [c for c in _split_columns(plan, SPLIT_COLUMN_THREADS, WARP, 1) if c.split > 1]


def _lanes_width(plan: RowPlan) -> int:
    """The most consecutive rows a thread may take at once, reading 16 bytes of each input a step."""
    widest = max((plan.inputs[a.input].torch_dtype.itemsize for a in plan.accesses), default=4)
    return next((w for w in (8, 4, 2) if w * widest <= 16 and lanes_fit(plan, w)), 1)


def _split_columns(plan: RowPlan, threads: int, rows: int, width: int) -> list[Launch]:
    """Rows too few to fill the SMs (a bias's gradient: a column sum over 4096 x 768) split along
    their length over the blocks of a cooperative grid (blocks of `rows` x `threads` threads, each
    taking `width` rows), as far as that leaves at least 8 elements a thread; that split and half
    of it, where the rows' held part fits in half the words."""
    row_groups = -(-plan.rows // (rows * width))
    split = 1
    while row_groups * split * 2 <= SPLIT_BLOCKS and plan.row_length >= threads * split * 2 * 8:
        split *= 2
    shapes = dict.fromkeys(Launch(threads, rows, width, split=s) for s in (split, max(1, split // 2)))
    return [c for c in shapes if _words(plan, c) <= REGISTER_WORDS // 2]


def tag(plan: RowPlan, launch: Launch) -> str:
    if not plan.along_rows:
        return (f"y{launch.threads}r{launch.rows}" + (f"w{launch.width}" if launch.width > 1 else "")
                + (f"g{launch.split}" if launch.split > 1 else "") + ("n" if launch.no_l1 else "")
                + ("o" if plan.online else ""))
    return (f"t{launch.threads}r{launch.rows}v{launch.width}" + (f"l{launch.lanes}" if launch.lanes > 1 else "")
            + ("s" if launch.storage == "shared" and plan.stored else "")
            + (f"c{launch.cluster}" if launch.cluster > 1 else "") + (f"g{launch.split}" if launch.split > 1 else "")
            + ("p" if launch.prefetch else "") + ("P" if launch.persistent else "") + ("n" if launch.no_l1 else "")
            + ("o" if plan.online else ""))


def propose_candidates(plan: RowPlan) -> list[Candidate]:
    return [Candidate(model_source(plan, c), f"builtin:rows:{tag(plan, c)}",
                      {"threads": c.threads, "rows": c.rows, "vector_width": c.width, "storage": c.storage,
                       "cluster": c.cluster, "split": c.split, "no_l1": c.no_l1, "persistent": c.persistent,
                       "along_rows": plan.along_rows})
            for c in launch_configs(plan)]


_HEADER = '''\
# builtin:rows:$tag - one row-reduction kernel, specialised to these signatures$how.
INPUTS = $inputs  # (shape, stride, dtype) of each input
OUTPUTS = $outputs
KERNEL_NAME = "$name"

MAIN_SOURCE = r\'\'\'$main_source\'\'\'
# (grid, block, dynamic shared memory, cluster, split-row workspace bytes, persistent, split-row counter bytes)
MAIN_LAUNCH = $main_launch
# Bytes each input's data pointer must be a multiple of for MAIN's vector loads; where one is
# not, FALLBACK (the same computation, one element per access) runs instead.
MAIN_ALIGNMENT = $alignment
FALLBACK_SOURCE = $fallback_source
FALLBACK_LAUNCH = $fallback_launch
'''

# The program: a launch spec, run by the C++ launch op (no Python per call), clusters included.
_SPEC_MODEL = string.Template('''\
import torch

from agent_backend.env.launch_op import launch_spec_model
from agent_backend.env.launch_spec import Arg, KernelLaunch, LaunchSpec
from agent_backend.specs import TensorSpec

''' + _HEADER + '''ARGS = [Arg.input(k) for k in range(len(INPUTS))] + [Arg.output(k) for k in range(len(OUTPUTS))]


def _launch(source, launch, alignment=()):
    grid, block, shared, cluster, workspace, persistent, counters = launch
    # a split row's blocks wait for each other: a cooperative launch (all resident), given its
    # workspace and its barriers' counters
    split = [Arg.workspace(workspace), Arg.counters(counters)] if workspace else []
    return KernelLaunch.compile(source, KERNEL_NAME, grid=grid, block=block, args=ARGS + split, shared_mem=shared,
                                alignment=alignment, cluster=cluster, cooperative=workspace > 0, persistent=persistent)


KERNELS = [_launch(MAIN_SOURCE, MAIN_LAUNCH, MAIN_ALIGNMENT)]
if FALLBACK_SOURCE:
    KERNELS.append(_launch(FALLBACK_SOURCE, FALLBACK_LAUNCH))
ModelNew = launch_spec_model(LaunchSpec(inputs=[TensorSpec(*s, "cuda") for s in INPUTS],
                                        outputs=[TensorSpec(*s, "cuda") for s in OUTPUTS], kernels=KERNELS))
''')

def launch_arguments(plan: RowPlan, launch: Launch, codegen=this_codegen) -> tuple:
    """(grid, block, dynamic shared memory, cluster size, workspace bytes of a split row, persistent,
    counter bytes of a split row), as `codegen` (a version of the codegen module) sizes them."""
    block = (launch.threads * launch.rows,) if plan.along_rows else (launch.rows, launch.threads)
    return (codegen.grid_blocks(plan, launch), block, codegen.shared_bytes(plan, launch), launch.cluster,
            codegen.workspace_bytes(plan, launch), launch.persistent, codegen.counter_bytes(plan, launch))


def model_source(plan: RowPlan, launch: Launch, codegen=this_codegen) -> str:
    """KernelBench-style program whose ModelNew runs `plan` with `launch` (a launch spec),
    compiled for the current GPU at import; its kernels and their memory as `codegen` writes and
    sizes them (another version of the codegen module, where benchmarks/rows_ab.py compares two)."""
    write = codegen.kernel_source
    name = f"rows_{tag(plan, launch)}"
    # one element an access; across rows, a thread's rows spread over more blocks, so the split
    # shrinks as much (a cooperative grid must fit on the GPU at once)
    scalar = dataclasses.replace(launch, width=1, split=max(1, launch.split // lanes(plan, launch)), prefetch=False)
    fallback = write(plan, name, scalar) if launch.width > 1 else None
    alignment = [1] * len(plan.inputs)
    for k, a in enumerate(plan.accesses):
        if not a.per_row and is_vector_access(plan, k, launch.width):
            itemsize = plan.inputs[a.input].torch_dtype.itemsize
            alignment[a.input] = max(alignment[a.input], launch.width * itemsize)
    spread = (f", a cluster of {launch.cluster} blocks a row," if launch.cluster > 1 else
              f", {launch.split} blocks of a cooperative grid a row," if launch.split > 1 else "")
    return _SPEC_MODEL.substitute(
        tag=tag(plan, launch), name=name, how=spread + " and run by the C++ launch op",
        inputs=_signatures(plan.inputs), outputs=_signatures(o.spec for o in plan.outputs),
        main_source=write(plan, name, launch), main_launch=launch_arguments(plan, launch, codegen),
        alignment=tuple(alignment),
        fallback_source=f"r'''{fallback}'''" if fallback else None,
        fallback_launch=launch_arguments(plan, scalar, codegen) if fallback else None)


def _signatures(specs) -> str:
    return "[" + ", ".join(f"({s.shape}, {s.stride}, {s.dtype!r})" for s in specs) + "]"
