"""RowPlan + launch shape -> the CUDA C source of one row kernel.

A row is taken by `threads` threads (a sub-warp, a warp or several warps), `rows` rows a block,
or, for long rows, by a cluster of `cluster` blocks, or by `split` blocks of a cooperative grid,
each block taking one slice of it. Thread t reads
the vectors t, t + threads, ... of its slice (`width` elements each), so a warp's accesses are
contiguous. Inputs read by more than one pass are loaded once, into registers (`storage`
"registers": a fully unrolled array) or shared memory ("shared"), and every pass works on that
copy; inputs read by one pass only are read from global memory there. After each pass the
partial results are combined across the row's threads: warp shuffles, then shared memory across
the warps of a row, then distributed shared memory across the blocks of a cluster, or global
memory (a workspace the launch op allocates) and a barrier of the row's blocks (SPLIT_BARRIER_FUNCTION,
on counters the launch op keeps) across the blocks of a split row;
every thread combines in the same order, so all hold the same per-row values. A thread may also
take `lanes` consecutive whole rows that read one input alike (a matrix-vector product's outputs
for each vector, which read one matrix row: lanes_fit_along): that input's vector is loaded once
for all of them, each row's own inputs and sums are its own (names suffixed _w0, _w1, ...).

Plans whose rows are not contiguous but whose consecutive rows are (a reduction over dim 1 of
(B, C, L), or over the rows of a matrix: a column sum) get the "across rows" kernel: a block of
rows x threads threads, threadIdx.x running over consecutive rows (so a warp's accesses are
contiguous), threadIdx.y over the elements of each row; partials combine through shared memory.
A thread may take `width` consecutive rows (lanes_fit), reading a vector across them a step: the
per-row code is then written once for each of its rows, its names suffixed _w0, _w1, ... Few
rows are split along their length over a cooperative grid, as long rows are.

A plan with a scan (cumsum) streams each row in order instead, in chunks of tiles (a tile: a
vector of each of the row's threads): each thread sums its vectors' elements in fp32, the thread
totals are scanned across the row's threads in double (shuffles, then shared memory across
warps), and a double carry runs from tile to tile; see _Writer._scan.

Sizes and strides are constants in the source; the kernel takes only pointers: inputs, then
outputs, then, for a split row, the workspace and the counters. No thread returns early: out-of-range rows only
skip their loads and stores, so every thread reaches every barrier.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace

from skills.pointwise.codegen import CONVERSIONS
from skills.pointwise.dtypes import dtype_info, operand_info
from skills.pointwise.ops import DEVICE_FUNCTIONS

from .plan import IDENTITY, Partial, Pass, RowPlan, needs_wide_index

# Sums accumulate in double: a mean of values that cancel is then exact to the final rounding,
# never less accurate than the reference's fp32 sums (the verifier allows twice its error).
# H100/H200 add doubles at half the fp32 rate, far above what a memory-bound row needs.
ACCUMULATOR = {"sum": "double", "online": "double", "max": "float", "min": "float"}
# An online sum's terms, exp(y - max), are positive and at most 1, so nothing cancels: in fp32 a
# thread's sum of n of them strays by at most (n - 1) roundings, and a row's sum, over a warp or
# more of such partials folded in a tree, far less. So where each thread sums at most this many
# of a row's terms, with a warp or more a row, the online sum is fp32 throughout: on an H200 the
# double sums (a conversion and an add a vector, double shuffles and folds a row) took a
# persistent softmax over 1024 x 393216 from 530 to 609 us in bf16, 983 to 1059 in fp32.
ONLINE_FP32_TERMS = 128
TYPICAL_SM_COUNT = 132  # H100/H200: how many blocks of a split row's cooperative grid each SM must hold
# A thread holds its part of a row in what the register file leaves each thread of the blocks
# an SM holds, less what the kernel needs besides (indices, partials, the epilogue's values).
REGISTER_FILE, MAX_THREAD_REGISTERS, OTHER_REGISTERS = 64 * 1024, 255, 32
WORKSPACE_SLOT_BYTES = 8  # a split row's partial of one block in the workspace (the widest accumulator)
# A split row's barrier counter on a line of L2 of its own: the blocks of other rows spinning on theirs, and
# this row's blocks leaving, never touch it (on an H100, interleaved with counters a word apart: the split
# softmax over 16 x 393216 bf16 16.2 -> 15.9 us split 16, 17.0 -> 15.9 split 32; fp32 25.8 -> 25.7,
# 25.0 -> 24.8; a bf16 sum over those rows 13.5 -> 12.3, 12.9 -> 12.0; rows_ab-h100-...-fortysixth-slots).
COUNTER_LINE_BYTES = 128
COMBINE = {"sum": "({a} + {b})", "online": "({a} + {b})", "max": "pw_maximum({a}, {b})",
           "min": "pw_minimum({a}, {b})"}
WARP = 32
FLOAT_MAX = "3.40282347e+38f"
FIRST_VALUE_RANGE = "64.0f"  # how far a thread's max may rise over its first value: 64 * e^64 terms fit fp32
# ... and the form of such a term, whose argument may be up to that (every output fp16/bf16)
FIRST_VALUE_EXP = "pw_exp_fast_bounded({})"
# An online sum (plan.Partial): a sum of exp(y - m) relative to max m, rescaled to max `to` (0 where
# m is -inf); and the row's sum once its max m is known, as the graph computes it where m is not
# finite: y - m is NaN for some y (m = +-inf), or, behind logsumexp's guard, every term is 0 or inf.
ONLINE_FUNCTIONS = f"""
template <typename S> __device__ __forceinline__ S rows_online_rescale(S s, float m, float to) {{
  return m == to ? s : s * (S)expf(m - to);
}}
template <typename S> __device__ __forceinline__ float rows_online_sum(S s, float m) {{
  return fabsf(m) <= {FLOAT_MAX} ? (float)s : __uint_as_float(0x7fc00000u);
}}
template <typename S> __device__ __forceinline__ float rows_online_sum_guarded(S s, float m) {{
  if (fabsf(m) <= {FLOAT_MAX}) return (float)s;
  return m != m ? m : m < 0.0f ? 0.0f : __uint_as_float(0x7f800000u);
}}
"""
FULL_MASK = "0xffffffffu"
# A scan's tiles each thread loads before it scans them (loads in flight; one __syncthreads a chunk).
SCAN_TILES = 4
KEPT = "keep_"  # prefix of the register array a kept element value (Pass.keeps) lives in
# A prefetching block's loads of the next row: 16 bytes from global to shared memory, not waited for.
PREFETCH_FUNCTION = """
__device__ __forceinline__ void rows_prefetch16(void* to, const void* from) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" :: "r"((unsigned)__cvta_generic_to_shared(to)), "l"(from)
               : "memory");
}
__device__ __forceinline__ void rows_prefetch_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
__device__ __forceinline__ void rows_prefetch_wait() { asm volatile("cp.async.wait_group 0;" ::: "memory"); }
"""
# The barrier after which a cluster's blocks read each other's partials. cluster.sync() releases
# every memory operation before it: a MEMBAR.ALL.GPU that waits for each global load and store the
# thread has in flight (a persistent cluster's last row's stores, its next row's loads). The
# partials are the block's own shared memory, so a release of shared::cta operations is enough (on
# an H200, a persistent bf16 softmax over 1024 x 393216: 469 -> 443 us). The wait keeps its
# acquire. A block's reads of the others' slots are folded before it arrives at the next barrier,
# which the next write to those slots follows (two slots by row parity where rows repeat). The
# restricted fence is PTX 8.6 (CUDA 12.8); an older compiler keeps cluster.sync().
CLUSTER_SYNC_FUNCTION = """
__device__ __forceinline__ void rows_cluster_sync() {
#if __CUDACC_VER_MAJOR__ > 12 || (__CUDACC_VER_MAJOR__ == 12 && __CUDACC_VER_MINOR__ >= 8)
  asm volatile("fence.release.sync_restrict::shared::cta.cluster;" ::: "memory");
  asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
  asm volatile("barrier.cluster.wait.aligned;" ::: "memory");
#else
  cooperative_groups::this_cluster().sync();
#endif
}
"""
# The barrier after which a split row's blocks read each other's partials from the workspace: the
# row's blocks only, where grid.sync() waited for every block, so a row whose blocks have all
# arrived stores while others still load (on an H100, a softmax over 16 x 393216, interleaved with
# grid.sync()'s: fp32 27.1 -> 25.8 us split 16, 25.8 -> 25.0 split 32; bf16 16.1 -> 16.2 split 16,
# 16.5 -> 17.1 split 32; benchmarks/results, 2026-12-08). The block's
# first thread releases what the block wrote (the partials, written by its first thread or, across
# rows, after a __syncthreads), arrives, and waits to acquire `blocks` arrivals; the last block to
# leave zeroes both counters, so every launch finds them as the launch op first zeroed them
# (launch_spec.Arg.counters). Each barrier of a kernel has counters of its own: a block may arrive
# at the next before the last has left this one.
SPLIT_BARRIER_FUNCTION = """
__device__ __forceinline__ void rows_split_barrier(unsigned int* arrived, unsigned int* left, unsigned int blocks) {
  if (threadIdx.x == 0 && threadIdx.y == 0) {
    __threadfence();
    atomicAdd(arrived, 1u);
    unsigned int seen;
    do {
      asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(seen) : "l"(arrived) : "memory");
    } while (seen < blocks);
    if (atomicAdd(left, 1u) == blocks - 1u) {
      *left = 0u;
      *arrived = 0u;
    }
  }
  __syncthreads();
}
"""
# An input element that no other row reads gains nothing from L1, and with a row's loads all
# issued at once, lines allocated there for them limit how many are in flight. Not volatile: the
# inputs do not change while the kernel runs, and volatile loads kept the compiler from scheduling
# them (cross-entropy's row kernel took 128 registers instead of 78, and twice the time).
STREAM_LOAD_FUNCTION = """
template <typename T> __device__ __forceinline__ T rows_ld_stream(const T* p) {
  if constexpr (sizeof(T) == 16) {
    uint4 u;
    asm("ld.global.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(u.x), "=r"(u.y), "=r"(u.z), "=r"(u.w) : "l"(p));
    return *reinterpret_cast<const T*>(&u);
  } else if constexpr (sizeof(T) == 8) {
    uint2 u;
    asm("ld.global.L1::no_allocate.v2.u32 {%0, %1}, [%2];" : "=r"(u.x), "=r"(u.y) : "l"(p));
    return *reinterpret_cast<const T*>(&u);
  } else if constexpr (sizeof(T) == 4) {
    unsigned u;
    asm("ld.global.L1::no_allocate.u32 %0, [%1];" : "=r"(u) : "l"(p));
    return *reinterpret_cast<const T*>(&u);
  } else {
    return *p;
  }
}
"""


@dataclass(frozen=True)
class Launch:
    threads: int            # threads per row: a power of two
    rows: int = 1           # rows per block
    width: int = 1          # elements per access (1, or a width dividing plan.vector_width)
    storage: str = "registers"  # where inputs read by several passes are kept: "registers" or "shared"
    cluster: int = 1        # blocks per row (a thread-block cluster); the row is split into slices
    split: int = 1          # or blocks per row of a cooperative grid, combining through global memory
    prefetch: bool = False  # one block an SM, looping over rows, loading the next into shared memory meanwhile
    no_l1: bool = False     # streamed inputs loaded without a place in L1 (streamed_access, STREAM_LOAD_FUNCTION)
    persistent: bool = False  # clusters looping over rows, each storing a row while loading the next (can_persist)
    lanes: int = 1          # along rows: consecutive rows a thread takes at once (lanes_fit_along), sharing loads

    @property
    def block(self) -> int:
        return self.threads * self.rows

    @property
    def blocks_per_row(self) -> int:
        return self.cluster * self.split


def along_width(plan: RowPlan, launch: Launch) -> int:
    """Elements a thread reads at a time along its row (the launch's width along rows; across
    rows, the width is the rows a thread takes)."""
    return launch.width if plan.along_rows else 1


def lanes(plan: RowPlan, launch: Launch) -> int:
    """Consecutive rows a thread takes: across rows, reading each element of all of them at once;
    along rows, reading once each vector that all of them read (Launch.lanes)."""
    return launch.lanes if plan.along_rows else launch.width


def slice_vectors(plan: RowPlan, launch: Launch) -> int:
    """Vectors of one row each block of a cluster (or of a split row) takes."""
    return -(-(plan.row_length // along_width(plan, launch)) // launch.blocks_per_row)


def vectors_per_thread(plan: RowPlan, launch: Launch) -> int:
    return -(-slice_vectors(plan, launch) // launch.threads)


def grid_blocks(plan: RowPlan, launch: Launch) -> int:
    if launch.prefetch:
        return min(plan.rows, TYPICAL_SM_COUNT)
    return -(-plan.rows // (launch.rows * lanes(plan, launch))) * launch.blocks_per_row


def blocks_per_sm(plan: RowPlan, launch: Launch) -> int:
    """The blocks of `launch`'s grid each SM holds at once (a cooperative grid must be resident):
    the launch bounds' minimum, and what a thread's registers are budgeted for."""
    return -(-grid_blocks(plan, launch) // TYPICAL_SM_COUNT)


def register_budget(launch: Launch, blocks: int) -> int:
    """Registers a thread may hold its part of a row in: what the register file leaves each thread
    of `blocks` blocks of `launch` an SM (at most MAX_THREAD_REGISTERS), less OTHER_REGISTERS."""
    return min(MAX_THREAD_REGISTERS, REGISTER_FILE // (launch.block * blocks)) - OTHER_REGISTERS


def workspace_bytes(plan: RowPlan, launch: Launch) -> int:
    """Global memory a split row's blocks exchange their partials through: a slot a partial, a
    block and a row (each pass's partials have their own, so no pass overwrites what another
    block may still read)."""
    if launch.split == 1:
        return 0
    partials = sum(len(p.partials) for p in plan.passes)
    return WORKSPACE_SLOT_BYTES * partials * plan.rows * launch.split


def split_groups(plan: RowPlan, launch: Launch) -> int:
    """The groups of `split` blocks a split grid's rows take, each its own barrier's."""
    return grid_blocks(plan, launch) // launch.split


def counter_bytes(plan: RowPlan, launch: Launch) -> int:
    """The counters a split row's barriers take (SPLIT_BARRIER_FUNCTION): two a pass and a group
    of blocks (_Writer._through_global: a pass's arrivals, then its departures), each on a line of
    its own."""
    if launch.split == 1:
        return 0
    return COUNTER_LINE_BYTES * 2 * len(plan.passes) * split_groups(plan, launch)


def shared_bytes(plan: RowPlan, launch: Launch) -> int:
    """Dynamic shared memory the kernel needs (the on-chip copy of its rows, when shared; the
    next row's, when prefetched)."""
    if launch.storage != "shared" and not launch.prefetch:
        return 0
    return sum(_round16(vectors_per_thread(plan, launch) * launch.block * buffer_bytes(plan, k, launch.width))
               for k in plan.stored)


def keeps_values(plan: RowPlan, launch: Launch) -> bool:
    """Whether costly element values are kept between sweeps (Pass.keeps): where each thread's
    part of the row is held in registers along it, so the arrays are indexed by the constants
    of fully unrolled loops."""
    return launch.storage == "registers" and bool(plan.stored) and plan.along_rows


def can_prefetch(plan: RowPlan, launch: Launch) -> bool:
    """Whether `launch` may prefetch (Launch.prefetch): one row a block, along it, held in
    registers, read in 16-byte vectors (cp.async's size)."""
    return (plan.along_rows and bool(plan.stored) and not plan.scan and launch.rows == 1
            and launch.blocks_per_row == 1 and launch.storage == "registers"
            and all(buffer_bytes(plan, k, launch.width) == 16 for k in plan.stored))


def can_persist(plan: RowPlan, launch: Launch) -> bool:
    """Whether `launch` may be persistent (Launch.persistent): a row along a cluster of blocks,
    held in registers, whose every element is written (the sweep that stores a row's vector
    loads the next row's into its registers), not a scan. Only as many clusters as fit at once
    are launched (KernelLaunch.persistent), each taking rows blockIdx.x / cluster, + clusters, ..."""
    return (plan.along_rows and bool(plan.stored) and not plan.scan and launch.rows == 1 and launch.cluster > 1
            and launch.storage == "registers" and any(not o.per_row for o in plan.outputs))


def kernel_source(plan: RowPlan, name: str, launch: Launch) -> str:
    return _Writer(plan, launch).source(name)


def _round16(n: int) -> int:
    return -(-n // 16) * 16


def is_vector_access(plan: RowPlan, k: int, width: int) -> bool:
    """Access k is read `width` elements at a time (along its row, or across rows: an element
    of each of a thread's rows); else one element stands for the vector."""
    a = plan.accesses[k]
    return width > 1 and (a.inner[-1] if plan.along_rows else a.outer[-1]) != 0


_COORDINATE = re.compile(r"\bo\d+\b")


def lanes_fit(plan: RowPlan, width: int) -> bool:
    """Across rows, whether a thread may take `width` consecutive rows: they share every outer
    coordinate but the last (of which width divides the size), each access and output steps
    by 1 or 0 from row to row and aligns to width elements in every other step, the rows'
    values need no coordinate, and nothing is held on chip or written per element."""
    if plan.along_rows or not plan.outer:
        return False
    steps = [(a.outer, a.inner) for a in plan.accesses] + [(o.outer, o.inner) for o in plan.outputs]
    return (_rows_alike(plan) and plan.outer[-1] % width == 0
            and all(outer[-1] in (0, 1) and all(st % width == 0 for st in outer[:-1] + inner)
                    for outer, inner in steps)
            and all(o.outer[-1] == 1 for o in plan.outputs))


def _rows_alike(plan: RowPlan) -> bool:
    """What a thread taking several rows at once needs of any plan: nothing held on chip or
    written per element, no scan, and no row coordinate in the rows' values."""
    lines = list(plan.prelude) + [line for p in plan.passes for line in p.body + p.after]
    lines += [o.value for o in plan.outputs]
    return (not plan.stored and not plan.scan and all(o.per_row for o in plan.outputs)
            and not any(_COORDINATE.search(line) or _ROW.search(line) for line in lines))


def lanes_fit_along(plan: RowPlan, lanes: int) -> bool:
    """Along rows, whether a thread may take `lanes` consecutive rows at once (Launch.lanes): rows
    that differ in the last outer coordinate only (of which lanes divides the size), some element
    access the same for all of them but not for other rows (read once: a matrix-vector product's
    matrix row, for each vector; not a weight every row reads), nothing held on chip or written per
    element, no row coordinate in the rows' values."""
    if not plan.along_rows or not plan.outer or lanes == 1:
        return lanes == 1
    others = [k for k, size in enumerate(plan.outer[:-1]) if size > 1]
    shared = [a for a in plan.accesses if not a.per_row and a.outer[-1] == 0
              and others and all(a.outer[k] != 0 for k in others)]
    return _rows_alike(plan) and plan.outer[-1] % lanes == 0 and bool(shared)


def streamed_access(plan: RowPlan, k: int) -> bool:
    """Whether each element access k reads belongs to one row only: it steps along every outer
    dim of more than one row (a LayerNorm's weight, read by every row, does not)."""
    return all(st != 0 for size, st in zip(plan.outer, plan.accesses[k].outer) if size > 1)


def buffer_bytes(plan: RowPlan, k: int, width: int) -> int:
    itemsize = plan.inputs[plan.accesses[k].input].torch_dtype.itemsize
    return itemsize * (width if is_vector_access(plan, k, width) else 1)


class _Writer:
    def __init__(self, plan: RowPlan, launch: Launch):
        if launch.width > 1 and plan.along_rows and plan.vector_width % launch.width:
            raise ValueError(f"width {launch.width} does not divide the plan's vector width {plan.vector_width}")
        if launch.width > 1 and not plan.along_rows and not lanes_fit(plan, launch.width):
            raise ValueError(f"a thread cannot take {launch.width} rows of this plan at once")
        if launch.cluster > 1 and (launch.rows != 1 or not plan.along_rows or launch.threads < WARP):
            raise ValueError("a row split over a cluster is one row a block of a warp or more, along it")
        if launch.split > 1 and launch.rows != 1 and plan.along_rows:
            raise ValueError("a row split over a cooperative grid along it is one row a block")
        if launch.cluster > 1 and launch.split > 1:
            raise ValueError("a row is split over a cluster or over a cooperative grid, not both")
        if launch.storage == "shared" and not plan.along_rows:
            raise ValueError("rows are held in shared memory only along rows")
        if plan.scan and (launch.blocks_per_row > 1 or launch.storage != "registers"):
            raise ValueError("a scan streams its rows, each within one block")
        if launch.prefetch and not can_prefetch(plan, launch):
            raise ValueError("a prefetching block holds one row along it in registers, 16-byte vectors")
        if plan.along_rows and not lanes_fit_along(plan, launch.lanes):
            raise ValueError(f"a thread cannot take {launch.lanes} rows of this plan at once")
        if launch.lanes > 1 and (launch.blocks_per_row > 1 or launch.prefetch or launch.persistent):
            raise ValueError("a thread takes several rows only where each block takes whole rows")
        if launch.persistent and not can_persist(plan, launch):
            raise ValueError("a persistent cluster holds a row along it in registers and stores its every element")
        self.plan, self.launch = plan, launch
        self.T, self.R, self.C, self.S = launch.threads, launch.rows, launch.cluster, launch.split
        self.V, self.L = along_width(plan, launch), lanes(plan, launch)
        self.B = launch.blocks_per_row
        self.E = vectors_per_thread(plan, launch)
        self.SV = slice_vectors(plan, launch)
        self.NV = plan.row_length // self.V
        self.partial_index = {p.acc: i for i, p in enumerate(p for ps in plan.passes for p in ps.partials)}
        threads = self.T * self.B
        self.online_fp32 = plan.along_rows and threads >= WARP and -(-plan.row_length // threads) <= ONLINE_FP32_TERMS

    def _accumulator(self, p: Partial) -> str:
        """The type partial p accumulates in (ACCUMULATOR, but see ONLINE_FP32_TERMS)."""
        return "float" if p.combine == "online" and self.online_fp32 else ACCUMULATOR[p.combine]

    # -- the kernel ------------------------------------------------------------------------
    def source(self, name: str) -> str:
        plan = self.plan
        params = ([f"const {operand_info(s.torch_dtype).storage}* __restrict__ in{k}"
                   for k, s in enumerate(plan.inputs)]
                  + [f"{dtype_info(o.spec.torch_dtype).storage}* __restrict__ out{k}" for k, o in enumerate(plan.outputs)]
                  + (["unsigned char* ws", "unsigned int* bar"] if workspace_bytes(plan, self.launch) else []))
        if self.launch.prefetch:
            lines = self._prefetching_rows()
        elif self.launch.persistent:
            lines = self._persistent_rows()
        else:
            lines = self._thread_index() + self._bases() + self._row_work(self._load_stored())
        if self.C > 1:  # no block may leave while another still reads its shared memory
            lines.append("cluster.sync();")
        lines = _drop_unused(lines, ["t", "slot"])
        include = "#include <cooperative_groups.h>\nnamespace cg = cooperative_groups;\n" if self.C > 1 else ""
        helpers = "".join(text for text, used in ((PREFETCH_FUNCTION, self.launch.prefetch),
                                                  (CLUSTER_SYNC_FUNCTION, self.C > 1),
                                                  (SPLIT_BARRIER_FUNCTION, self.S > 1),
                                                  (STREAM_LOAD_FUNCTION, self.launch.no_l1),
                                                  (ONLINE_FUNCTIONS, plan.online)) if used)
        return f"""{include}{CONVERSIONS}
{DEVICE_FUNCTIONS}{helpers}

typedef {"long long" if self._wide_index() else "int"} idx_t;

extern "C" __global__ void __launch_bounds__({self._bounds()}) {name}({", ".join(params)}) {{
{_indent(lines, 2)}
}}
"""

    def _wide_index(self) -> bool:
        """64-bit offsets: the plan's rule, which leaves room for a grid's rows past the last,
        except in a persistent kernel, which forms no offset past the last row (the next row
        clamped to it): there 32 bits do while every offset into the tensors fits (on an H200
        a persistent bf16 softmax over 4096 x 393216 took 1900 us with 64-bit offsets, 1817 without)."""
        if not self.launch.persistent:
            return self.plan.wide_index
        specs = self.plan.inputs + tuple(o.spec for o in self.plan.outputs)
        return needs_wide_index(self.plan.rows * self.plan.row_length, specs)

    def _row_work(self, load_stored: list[str]) -> list[str]:
        """From a row's per-row reads (its bases known) to its stores."""
        lines = self._row_reads() + self._lanes(self.plan.prelude) + load_stored + self._kept_arrays()
        for p in self.plan.passes:
            lines += self._pass(p)
        if self.plan.scan:
            lines += self._scan()
        elif self._element_outputs():
            lines += self._epilogue()
        return lines + self._row_stores()

    def _prefetching_rows(self) -> list[str]:
        """One block an SM loops over rows, blockIdx.x, + gridDim.x, ...: it takes each row's
        vectors from shared memory into registers, starts loading the next row's (cp.async,
        each thread its own slots), then works on this one, so that a row's loads overlap the
        last one's reductions and stores (on an H200, GroupNorm over 512 rows of 32768 bf16
        elements: 1.16x the kernel that loads each row when it starts, one block an SM too)."""
        rows = self.plan.rows
        fetch = self._loop([f"rows_prefetch16(&next{k}[e * {self.launch.block} + t], {self._global_pointer(k)});"
                            for k in self.plan.stored]) + ["rows_prefetch_commit();"]
        take = (self._register_buffers() + ["rows_prefetch_wait();"]
                + self._loop([f"buf{k}[e] = next{k}[e * {self.launch.block} + t];" for k in self.plan.stored]))
        first = ["{", "  const idx_t row = (idx_t)blockIdx.x;", "  const bool row_ok = true;"]
        ahead = ["{", "  const idx_t row = next_row;", f"  const bool row_ok = row < {rows};"]
        bases = self._bases()
        body = (["const bool row_ok = true;"] + bases + take + ["const idx_t next_row = row + gridDim.x;"]
                + ahead + _indent_lines(bases + fetch) + ["}"] + self._row_work([]) + [
                    "__syncthreads();  // the row's shared reductions are read before the next row's are written"])
        return (["const int t = threadIdx.x;", "const int slot = 0;"] + self._shared_copies("next")
                + first + _indent_lines(bases + fetch) + ["}"]
                + [f"for (idx_t row = (idx_t)blockIdx.x; row < {rows}; row += gridDim.x) {{"] + _indent_lines(body) + ["}"])

    def _persistent_rows(self) -> list[str]:
        """A cluster loops over rows blockIdx.x / cluster, + the clusters launched, ...: each
        thread's vectors of the first row loaded before the loop, and each later row's loaded
        into a vector's registers as soon as the epilogue has stored that vector of the row
        before, so that one row's stores overlap the next row's loads (on an H200, a hand-written
        softmax of this structure over 4096 x 393216 bf16: 85% of a copy's rate; one cluster a
        row, 64%; benchmarks/rows_persistent.py)."""
        rows = self.plan.rows
        first = (["{", f"  const idx_t row = (idx_t)blockIdx.x / {self.C};", f"  const bool row_ok = row < {rows};"]
                 + _indent_lines(self._held_bases("row", "o", "base") + self._read_stored()) + ["}"])
        # the last row loads itself again: with no branch, no register holds a vector's old value
        # beside its new one (if (next_ok) buf[e] = ... spilled 200-340 bytes of a bf16 softmax)
        body = (["const bool row_ok = true;"] + self._unheld_bases()
                + [f"const idx_t next_row = row + clusters < {rows} ? row + clusters : row;"]
                + self._next_bases() + self._row_work([]))
        return (["const int t = threadIdx.x;", "const int slot = 0;"] + self._cluster_slice()
                + [f"const idx_t clusters = gridDim.x / {self.C};"] + self._register_buffers() + first
                + ["int parity = 0;  // which of two slots the cluster's partials of this row go to",
                   f"for (idx_t row = (idx_t)blockIdx.x / {self.C}; row < {rows}; row += clusters, parity ^= 1) {{"]
                + _indent_lines(body) + ["}"])

    def _unheld_bases(self) -> list[str]:
        """_bases but the held inputs', whose vectors a persistent cluster's row already has."""
        held = tuple(f"const idx_t a{k}_base =" for k in self.plan.stored)
        return [line for line in self._bases() if not line.startswith(held)]

    def _next_bases(self) -> list[str]:
        """The held inputs' offsets of the next row's first element (a<k>_next, from n<d>)."""
        return self._held_bases("next_row", "n", "next")

    def _held_bases(self, row: str, coordinate: str, suffix: str) -> list[str]:
        """The held inputs' offsets of the first element of row `row` (a<k>_<suffix>, from
        <coordinate><d>)."""
        held = {f"a{k}_base" for k in self.plan.stored}
        lines = [line for line in self._bases() if re.match(r"const idx_t o\d+ =", line)
                 or line.split(" = ")[0].split()[-1] in held]
        renamed = (re.sub(r"\bo(\d+)\b", rf"{coordinate}\1", re.sub(r"\b(a\d+)_base\b", rf"\1_{suffix}", line))
                   for line in lines)
        return [_ROW.sub(row, line) for line in renamed]

    def _next_loads(self) -> list[str]:
        """The next row's vector of each held input into the registers of this row's (persistent)."""
        return [f"buf{k}[e] = {self._global_read(k).replace(f'a{k}_base', f'a{k}_next')};" for k in self.plan.stored]

    def _bounds(self) -> str:
        """The block size, and for a cooperative grid the blocks an SM must hold (so the compiler
        keeps registers within what lets the whole grid be resident)."""
        if self.S == 1:
            return str(self.launch.block)
        return f"{self.launch.block}, {blocks_per_sm(self.plan, self.launch)}"

    def _thread_index(self) -> list[str]:
        """t: the thread's place in its row; slot: its row in the block; row: the row index."""
        if not self.plan.along_rows:
            group = f"(blockIdx.x / {self.S})" if self.S > 1 else "blockIdx.x"
            first = f"(idx_t){group} * {self.R} + slot"
            first = f"({first}) * {self.L}" if self.L > 1 else first
            lines = ["const int t = threadIdx.y;", "const int slot = threadIdx.x;", f"const idx_t row = {first};"]
        elif self.R == 1:
            lines = ["const int t = threadIdx.x;", "const int slot = 0;",
                     f"const idx_t row = (idx_t)blockIdx.x{f' / {self.B}' if self.B > 1 else ''}"
                     f"{f' * {self.L}' if self.L > 1 else ''};"]
        else:
            first = f"(idx_t)blockIdx.x * {self.R} + slot"
            lines = [f"const int t = threadIdx.x % {self.T};", f"const int slot = threadIdx.x / {self.T};",
                     f"const idx_t row = {f'({first}) * {self.L}' if self.L > 1 else first};"]
        if self.C > 1:
            lines += self._cluster_slice()
        if self.S > 1:
            lines += [f"const idx_t slice0 = (idx_t)(blockIdx.x % {self.S}) * {self.SV};"]
        lines.append(f"const bool row_ok = row < {self.plan.rows};")
        return lines

    def _cluster_slice(self) -> list[str]:
        """The block's cluster, and the first vector of the row its slice starts at."""
        return ["cg::cluster_group cluster = cg::this_cluster();",
                f"const idx_t slice0 = (idx_t)cluster.block_rank() * {self.SV};"]

    def _bases(self) -> list[str]:
        """Each operand's offset of the row's first element."""
        plan = self.plan
        operands = [a.outer for a in plan.accesses] + [o.outer for o in plan.outputs]
        lines = []
        for d, size in enumerate(plan.outer):
            if all(st[d] == 0 for st in operands):
                continue
            inner = math.prod(plan.outer[d + 1:])
            coord = "row" if inner == 1 else f"(row / {inner})"
            lines.append(f"const idx_t o{d} = {coord if d == 0 else f'{coord} % {size}'};")
        lines += [f"const idx_t a{k}_base = {_dot('o', a.outer)};" for k, a in enumerate(plan.accesses)]
        lines += [f"const idx_t out{k}_base = {_dot('o', o.outer)};" for k, o in enumerate(plan.outputs)]
        return lines

    def _row_reads(self) -> list[str]:
        lines = []
        for k, a in enumerate(self.plan.accesses):
            if a.per_row:
                info = operand_info(self.plan.inputs[a.input].torch_dtype)
                for w in range(self.L):  # lane w's row is w rows on (a step of the last outer dim)
                    at = f"a{k}_base + {w * a.outer[-1]}" if self.L > 1 and a.outer[-1] else f"a{k}_base"
                    value = info.load.format(f"in{a.input}[{at}]")
                    lines += self._in_lane([f"const {info.ctype} a{k} = row_ok ? {value} : ({info.ctype})0;"], w)
        return lines

    def _lanes(self, lines: list[str]) -> list[str]:
        """Per-row `lines` once for each of the thread's rows (across rows, a thread may take several)."""
        return [line for w in range(self.L) for line in self._in_lane(lines, w)]

    def _in_lane(self, lines: list[str], w: int) -> list[str]:
        """`lines` for the thread's row w: its values renamed (a0 -> a0_w1, ...), row -> (row + w)."""
        if self.L == 1:
            return list(lines)
        return [_ROW.sub(f"(row + {w})", _LANE_LOCAL.sub(rf"\1_w{w}", line)) for line in lines]

    # -- sweeps over the row -------------------------------------------------------------------
    def _offset(self, inner: tuple[int, ...], index: str) -> str:
        """Offset of element `index` of the row along strides `inner` (over plan.inner)."""
        terms = []
        for d, (size, st) in enumerate(zip(self.plan.inner, inner)):
            if st == 0:
                continue
            below = math.prod(self.plan.inner[d + 1:])
            coord = index if below == 1 else f"({index} / {below})"
            if d > 0:
                coord = f"({coord} % {size})"
            terms.append(coord if st == 1 else f"{coord} * {st}")
        return " + ".join(terms) or "0"

    def _buffer(self, k: int) -> str:
        if self.launch.storage == "shared":
            return f"buf{k}[e * {self.launch.block} + threadIdx.x]"
        return f"buf{k}[e]"

    def _global_read(self, k: int) -> str:
        """The vector (or element) of access k at the element j0."""
        if self.launch.no_l1 and streamed_access(self.plan, k):
            return f"rows_ld_stream({self._global_pointer(k)})"
        return f"*{self._global_pointer(k)}"

    def _global_pointer(self, k: int) -> str:
        a = self.plan.accesses[k]
        address = f"in{a.input} + a{k}_base + {self._offset(a.inner, 'j0')}"
        width = self.launch.width
        if is_vector_access(self.plan, k, width):
            storage = dtype_info(self.plan.inputs[a.input].torch_dtype).storage
            return f"reinterpret_cast<const Vec<{storage}, {width}>*>({address})"
        return f"({address})"

    def _element(self, k: int, holder: str) -> str:
        """Access k's value at lane v of the vector in `holder`, in its compute type."""
        info = dtype_info(self.plan.inputs[self.plan.accesses[k].input].torch_dtype)
        return info.load.format(f"{holder}.v[v]" if is_vector_access(self.plan, k, self.V) else holder)

    def _load_stored(self) -> list[str]:
        if not self.plan.stored:
            return []
        buffers = self._shared_copies("buf") if self.launch.storage == "shared" else self._register_buffers()
        return buffers + self._read_stored()

    def _register_buffers(self) -> list[str]:
        """buf<k>: each stored input's vectors of the row, E a thread, in registers."""
        return [f"{self._buffer_type(k)} buf{k}[{self.E}];" for k in self.plan.stored]

    def _read_stored(self) -> list[str]:
        """Each stored input's vectors of the row (its bases known) into its buffer."""
        return self._loop([f"{self._buffer(k)} = {self._global_read(k)};" for k in self.plan.stored])

    def _shared_copies(self, name: str) -> list[str]:
        """`<name><k>`: each stored input's copy of the block's rows in dynamic shared memory, one
        after another (shared_bytes: the whole)."""
        lines, offset = ["extern __shared__ __align__(16) unsigned char rows_smem[];"], 0
        for k in self.plan.stored:
            kind = self._buffer_type(k)
            lines.append(f"{kind}* {name}{k} = reinterpret_cast<{kind}*>(rows_smem + {offset});")
            offset += _round16(self.E * self.launch.block * buffer_bytes(self.plan, k, self.V))
        return lines

    @property
    def _keeps(self) -> bool:
        return keeps_values(self.plan, self.launch)

    def _kept_arrays(self) -> list[str]:
        if not self._keeps:
            return []
        terms = [f"float {KEPT}{p.kept[0]}[{self.E}][{self.V}];" for p in self._kept_terms]
        return [f"{ctype} {KEPT}{var}[{self.E}][{self.V}];" for p in self.plan.sweeps for ctype, var in p.keeps] + terms

    @property
    def _kept_terms(self) -> list[Partial]:
        """The online sums whose terms a thread keeps for a later sweep (Partial.kept), in place of
        the row's elements: where values are kept, their pass may take its max first, the later
        sweeps read no element held on chip (so its registers hold the terms: at least 4 bytes an
        element, or over a cooperative grid, whose launch bounds give each thread its registers,
        the words the terms take within that budget), and no sweep loads the next row's
        (persistent)."""
        kept = [p for w in self.plan.passes for p in w.partials if p.kept]
        stored_bytes = sum(self.plan.inputs[self.plan.accesses[k].input].torch_dtype.itemsize for k in self.plan.stored)
        budget = register_budget(self.launch, blocks_per_sm(self.plan, self.launch)) if self.S > 1 else 0
        fits = (self._keeps and not self.launch.persistent
                and (stored_bytes >= 4 * len(kept) or len(kept) * self.E * self.V <= budget)
                and all(self._may_take_max_first(w) for w in self.plan.passes if any(p.kept for p in w.partials))
                and not any(w.rescaled and set(w.rescaled.reads) & set(self.plan.stored) for w in self.plan.sweeps))
        return kept if fits else []

    def _buffer_type(self, k: int) -> str:
        storage = dtype_info(self.plan.inputs[self.plan.accesses[k].input].torch_dtype).storage
        width = self.launch.width
        return f"Vec<{storage}, {width}>" if is_vector_access(self.plan, k, width) else storage

    def _loop(self, body: list[str]) -> list[str]:
        """`body` for every vector of the thread's slice of the row, with j0 its first element."""
        unroll = "#pragma unroll" if self.launch.storage == "registers" and self.plan.stored else "#pragma unroll 4"
        q = "(slice0 + s)" if self.B > 1 else "s"
        bounds = ["row_ok"] + ([f"s < {self.SV}"] if self.SV % self.T else [])
        if self.B > 1 and self.SV * self.B != self.NV:
            bounds.append(f"{q} < {self.NV}")
        first = [f"const idx_t j0 = {q} * {self.V};"] if any("j0" in line for line in body) else []
        index = [f"  const idx_t s = (idx_t)e * {self.T} + t;"] if first or len(bounds) > 1 else []
        return ([unroll, f"for (int e = 0; e < {self.E}; ++e) {{"] + index + [f"  if ({' && '.join(bounds)}) {{"]
                + ["    " + line for line in first + body] + ["  }", "}"])

    def _sweep(self, work: Pass, per_element_end: list[str], before: list[str] = (),
               per_vector_end: list[str] = (), held: tuple[int, ...] | None = None) -> list[str]:
        """A loop over the thread's vectors: read `work.reads`, run `before`, then per element
        `work.body` and `per_element_end`, then `per_vector_end` (where values are kept between
        sweeps, `work.reusing` for reads and body, and the values it keeps stored after it). The
        accesses `held` (the plan's stored ones unless given) are read from their on-chip copies,
        the others from global memory."""
        held = self.plan.stored if held is None else held
        per_row = []
        if self._keeps:
            per_element_end = [f"{KEPT}{var}[e][v] = {var};" for _, var in work.keeps] + list(per_element_end)
            if work.reusing:
                takes = tuple(f"const {ctype} {var} = {KEPT}{var}[e][v];" for ctype, var in work.reusing.takes)
                work = replace(work, reads=work.reusing.reads, body=takes + work.reusing.body)
            if work.rescaled and self._kept_terms:
                work, per_row = self._rescaled(work, per_element_end)
        if self.L > 1 and not self.plan.along_rows:  # each of the thread's rows: its lane of each vector across them
            reads = [f"const {self._buffer_type(k)} l{k} = {self._global_read(k)};"
                     for k in work.reads if k not in held]
            return self._lanes(per_row) + self._loop(reads + [line for w in range(self.L) for line in self._in_lane(
                self._element_values(work.reads, lambda k: self._lane_of(k, w)) + list(work.body)
                + list(per_element_end), w)])
        # along rows: each vector an access reads for all of the thread's rows (one row, or
        # Launch.lanes rows where its step between them is 0) loaded once, the others once a row
        # (l<k>_w<w>), then each row's elements, work and partials, its names renamed (_in_lane)
        once = [k for k in work.reads if k not in held
                and (self.L == 1 or self.plan.accesses[k].outer[-1] == 0)]
        reads = [f"const {self._buffer_type(k)} l{k} = {self._global_read(k)};" for k in once]
        for w in range(self.L):
            for k in work.reads:
                if k not in once and k not in held:
                    step = w * self.plan.accesses[k].outer[-1]
                    read = self._global_read(k).replace(f"a{k}_base", f"(a{k}_base + {step})")
                    reads.append(f"const {self._buffer_type(k)} l{k}_w{w} = {read};")
        def holder(k: int, w: int) -> str:
            return self._buffer(k) if k in held else f"l{k}" if k in once else f"l{k}_w{w}"
        inner = [line for w in range(self.L) for line in self._in_lane(
            self._element_values(work.reads, lambda k: holder(k, w)) + list(work.body) + list(per_element_end), w)]
        body = (reads + self._lanes(list(before))
                + ["#pragma unroll", f"for (int v = 0; v < {self.V}; ++v) {{"]
                + ["  " + line for line in inner] + ["}"] + self._lanes(list(per_vector_end)))
        return self._lanes(per_row) + self._loop(body)

    def _rescaled(self, work: Pass, per_element_end: list[str]) -> tuple[Pass, list[str]]:
        """The sweep's work taking each kept term (Partial.kept) times exp(the max it was taken
        against - the row's max), and the per-row lines to run before it. A term whose one use is a
        multiply by a row's reciprocal (softmax's exp / its sum: plan._reciprocal) is multiplied by
        the two factors' product, taken once a row (<acc>_scale): one multiply an element fewer after
        the row's barrier, two roundings as before."""
        rescales = {p.kept[0]: f"{p.acc}_rescale" for p in self._kept_terms}
        body, takes, per_row = list(work.rescaled.body), [], []
        for ctype, var in work.rescaled.takes:
            uses = [i for i, line in enumerate(body) if re.search(rf"\b{var}\b", line)]
            used_after = any(re.search(rf"\b{var}\b", line) for line in per_element_end)
            only_use = body[uses[0]] if len(uses) == 1 and not used_after else ""
            product = re.fullmatch(rf"const float (v\d+) = \({var} \* (rcp\d+)\);", only_use)
            if product:
                scale = rescales[var].removesuffix("_rescale") + "_scale"
                per_row.append(f"const float {scale} = {rescales[var]} * {product[2]};")
                body[uses[0]] = f"const float {product[1]} = {KEPT}{var}[e][v] * {scale};"
            else:
                takes.append(f"const {ctype} {var} = {KEPT}{var}[e][v] * {rescales[var]};")
        return replace(work, reads=work.rescaled.reads, body=tuple(takes + body)), per_row

    def _lane_of(self, k: int, w: int) -> str:
        """Access k's element in the thread's row w: lane w of the vector l<k> read across the rows,
        or l<k> itself where the access is the same for all of them."""
        return f"l{k}.v[{w}]" if is_vector_access(self.plan, k, self.L) else f"l{k}"

    def _element_values(self, reads, holder) -> list[str]:
        """`a<k>`, access k's value at lane v, for each k of `reads`, from the vector `holder(k)`."""
        return [f"const {dtype_info(self.plan.inputs[self.plan.accesses[k].input].torch_dtype).ctype} a{k} = "
                f"{self._element(k, holder(k))};" for k in reads]

    def _pass(self, work: Pass) -> list[str]:
        lines = self._lanes([f"{self._accumulator(p)} {p.acc} = {IDENTITY[p.combine]};" for p in work.partials])
        online = [p for p in work.partials if p.combine == "online"]
        if online and self._keeps_terms(work) and self._terms_as_they_land:
            lines += self._terms_against_a_first_value(work, online)
        elif online and self._keeps_terms(work):
            # terms kept for a later sweep: the thread's max over its part (on chip) first, then
            # each term against it once, with no rescale a vector
            scales = [p for p in work.partials if p.acc in {q.scale for q in online}]
            lines += self._sweep(work, *self._accumulations(scales))
            lines += self._lanes([f"const float {p.acc}_top = fmaxf({p.scale}, -{FLOAT_MAX});" for p in online])
            lines += self._sweep(work, *self._accumulations([p for p in work.partials if p not in scales], True))
        else:
            lines += self._sweep(work, *self._accumulations(work.partials))
        lines += self._combine(work)
        kept = [p for p in self._kept_terms if p in work.partials]
        return lines + self._lanes(list(work.after) + [
            f"const float {p.acc}_rescale = {p.kept[1].format(f'{p.acc}_top - {p.kept[2]}')};" for p in kept])

    def _terms_against_a_first_value(self, work: Pass, online: list[Partial]) -> list[str]:
        """Terms kept for a later sweep, each summed against one value of the thread's as its
        vector lands (the floor of its first element: never above the thread's max, so its largest
        term is at least 1, and an integer, so x minus it is exact unless the difference outgrows
        x's binade, then within half an ulp of a difference under 64): while later vectors still
        load, with no rescale a vector, no sweep for the thread's max first. Where the thread's max
        is over FIRST_VALUE_RANGE above that value (a term might overflow) or is NaN, its terms
        again against its max, from global memory (the on-chip copy died as its terms were made).
        Then each sum against the thread's max, as the row's combine takes it (see
        _terms_as_they_land for where)."""
        lines = [f"float {p.acc}_top = -{FLOAT_MAX};" for p in online]
        per_element, before, after = self._accumulations(work.partials, True, FIRST_VALUE_EXP)
        first = [f"if (e == 0 && v == 0) {p.acc}_top = floorf(fmaxf({p.source}, -{FLOAT_MAX}));" for p in online]
        lines += self._sweep(work, first + per_element, before, after)
        for p in online:
            lines += ([f"if (!({p.scale} - {p.acc}_top <= {FIRST_VALUE_RANGE})) {{",
                       f"  {p.acc}_top = fmaxf({p.scale}, -{FLOAT_MAX});", f"  {p.acc} = {IDENTITY[p.combine]};"]
                      + _indent_lines(self._sweep(work, *self._accumulations([p], True), held=()))
                      + ["}", f"{p.acc} *= {p.kept[1].format(f'{p.acc}_top - fmaxf({p.scale}, -{FLOAT_MAX})')};"])
        return lines

    @property
    def _terms_as_they_land(self) -> bool:
        """Whether kept terms are taken against a thread's first value as its vectors land: over a
        cooperative grid along rows, where every output is fp16/bf16. On an H100
        (rows_ab-h100-...-thirtyeighth-first-value.txt) that ran the split softmax over 16 x 393216
        5% faster in bf16 and 2.4% in fp32, but a 4096-row fp32 softmax's block a row 1.3% slower;
        and in fp32 the differences from the first value round where those from the max do not:
        emulated on that softmax's layout, 1e-6 relative error on its largest outputs against 1.5e-7
        (benchmarks/rows_first_value_error.py), which an fp16/bf16 output's rounding hides."""
        return (self.S > 1 and self.plan.along_rows
                and all(o.spec.torch_dtype.itemsize == 2 for o in self.plan.outputs))

    def _keeps_terms(self, work: Pass) -> bool:
        """Whether a pass's online sums keep their terms (Partial.kept), against the thread's max
        taken first or its first value. Elsewhere the online sweep, whose exps run while later
        vectors still load: on an H100 (2026-12-06, benchmarks/rows_ab.py), taking the max first
        without keeping the terms ran the split softmax over 16 x 393216 2% slower in fp32, and
        from 2% slower to 1% faster in bf16."""
        return any(p in self._kept_terms for p in work.partials)

    def _may_take_max_first(self, work: Pass) -> bool:
        """Whether a pass's online sums may take the thread's max first (a sweep of its own): every
        element the pass reads is held on chip, so a second sweep reads no memory; no values are
        kept between its sweeps; each sum's max is a max partial of the pass."""
        maxes = {p.acc for p in work.partials if p.combine == "max"}
        return (set(work.reads) <= set(self.plan.stored) and not work.keeps and work.reusing is None
                and all(p.scale in maxes for p in work.partials if p.combine == "online"))

    def _accumulations(self, partials, max_taken: bool = False,
                       term_form: str | None = None) -> tuple[list[str], list[str], list[str]]:
        """The lines accumulating `partials` over a sweep: per element, before each vector and
        after it. An online sum whose max a sweep before took (`max_taken`) sums its terms against
        that max (`<acc>_top`), staged as a sum is, each in its exp's form or `term_form`."""
        # Double sums take each vector's elements summed in fp32 (at most 8), one conversion a
        # vector: conversions to double run at 1/8 of the fp32 rate, and a row's exp and
        # conversions per element outlasted its memory time (cross-entropy over 32000 classes).
        online = [p for p in partials if p.combine == "online"]
        staged = [p for p in partials if p.combine == "sum" and self.V > 1]
        plain = [p for p in partials if p not in staged and p not in online]
        if max_taken:  # a kept term (Partial.kept) in its exp's own form, stored as it is summed
            kept = [p for p in online if p in self._kept_terms]
            per_element = [line for p in kept for line in (
                f"const float {p.kept[0]} = {(term_form or p.kept[1]).format(f'{p.source} - {p.acc}_top')};",
                f"{KEPT}{p.kept[0]}[e][v] = {p.kept[0]};", f"{p.acc}_v += {p.kept[0]};")]
            per_element += [f"{p.acc}_v += {(term_form or p.term).format(f'{p.source} - {p.acc}_top')};"
                            for p in online if p not in kept]
            before = [f"float {p.acc}_v = 0.0f;" for p in online]
            after = [f"{p.acc} += ({self._accumulator(p)}){p.acc}_v;" for p in online]
            online = []
        else:  # an online sum goes before its max, which it reads as it was before the element
            per_element = [] if self.V > 1 else [line for p in online
                                                 for line in _online_element(p, self._accumulator(p))]
            before, after = [], []
        per_element += [f"{p.acc} = {COMBINE[p.combine].format(a=p.acc, b=_operand(p))};" for p in plain]
        per_element += [f"{p.acc}_v += {p.source};" for p in staged]
        before += [f"float {p.acc}_v = 0.0f;" for p in staged]
        after += [f"{p.acc} += (double){p.acc}_v;" for p in staged]
        if self.V > 1:
            per_element += [f"{p.acc}_y[v] = {p.source};" for p in online]
            before += [line for p in online for line in (f"const float {p.acc}_from = {p.scale};",
                                                         f"float {p.acc}_y[{self.V}];")]
            after += [line for p in online for line in _online_vector(p, self.V, self._accumulator(p))]
        return per_element, before, after

    # -- combining partials across the threads of a row -----------------------------------------
    def _combine(self, work: Pass) -> list[str]:
        partials = work.partials
        if not self.plan.along_rows:
            return self._combine_across_rows(work) + (self._through_global(partials, work) if self.S > 1 else [])
        lines = self._lanes(self._combine_in_block(partials))
        if self.C > 1:  # then the blocks of a cluster, through distributed shared memory
            # persistent: two slots, so that no block writes a row's partial where another may
            # still read the last row's (it reads it before the barrier the next write follows)
            at = "[parity]" if self.launch.persistent else ""
            lines += self._fold_in_first_warp(  # the first warp folds the blocks' slots, one a lane
                partials, lambda i: f"cred{i}{'[2]' if at else ''}", lambda i: f"cred{i}{at}", "t == 0",
                "rows_cluster_sync();", lambda i, c: f"*cluster.map_shared_rank(&cred{i}{at}, {c})", self.C, "cfin")
        if self.S > 1:
            lines += self._through_global(partials, work)
        return lines

    def _combine_in_block(self, partials) -> list[str]:
        """Shuffles within each warp, then the row's warps' partials through shared memory,
        folded by shuffles in the row's first warp, whose result every thread reads (where
        every thread folded every warp's slot, a block of 1024 threads spent 32 folds a thread
        a row: on an H200 a persistent softmax over 1024 x 393216 took twice a hand-written
        kernel's time)."""
        lines = _shuffles(partials, min(self.T, WARP), self._accumulator)
        if self.T > WARP:
            warps = self.T // WARP
            lines += self._fold_in_first_warp(partials, lambda i: f"red{i}[{self.R}][{warps}]",
                                              lambda i: f"red{i}[slot][t / {WARP}]", f"t % {WARP} == 0",
                                              "__syncthreads();", lambda i, at: f"red{i}[slot][{at}]", warps, "fin")
        return lines

    def _fold_in_first_warp(self, partials, declared, stored, writer: str, sync: str, slot, count: int,
                            result: str) -> list[str]:
        """Each partial written by the threads where `writer` holds to `stored(i)` (partial i's
        shared variable, `declared(i)`), then `sync`, then its `count` (at most a warp's) slots
        `slot(i, lane)` folded by shuffles in the row's first warp, a slot a lane, into
        `result<i>[slot]` (shared), which every thread of the row then reads (each thread folding
        every slot took a block of 1024 threads 32 folds a row). Only lane 0's result is kept, so
        every block of a cluster, folding the same slots in the same order, holds the same value."""
        lines, results = [], {}
        for p in partials:
            i = self.partial_index[p.acc]
            results[p.acc] = f"{result}{i}"
            lines += [f"__shared__ {self._accumulator(p)} {declared(i)};", f"if ({writer}) {stored(i)} = {p.acc};",
                      f"__shared__ {self._accumulator(p)} {result}{i}[{self.R}];"]
        lines += [sync, f"if (t < {WARP}) {{"]
        lines += [f"  {p.acc} = t < {count} ? {slot(self.partial_index[p.acc], 't')} : {IDENTITY[p.combine]};"
                  for p in partials]
        lines += ["  " + line for line in _shuffles(partials, count, self._accumulator)]
        lines += ["  if (t == 0) {"] + [f"    {results[p.acc]}[slot] = {p.acc};" for p in partials] + ["  }", "}"]
        return lines + ["__syncthreads();"] + [f"{p.acc} = {results[p.acc]}[slot];" for p in partials]

    def _through_global(self, partials, work: Pass) -> list[str]:
        """Each block's partials of its rows to their slots of the workspace (slot row * split +
        the block's place in the row), the barrier of its row's blocks (rows_split_barrier, on the
        pass's counters: `groups` arrivals, then as many departures), then every block combines its
        rows' slots.
        Along rows, every warp folds them all, lane l slots l, l + 32, ..., then shuffles: no
        barrier or shared memory between the barrier and the stores, where a block fold's two
        __syncthreads and its slots in shared memory were (on an H100, split softmax over 16 x
        393216: 0.6-3.7% faster in fp32 and bf16, benchmarks/results/rows_ab-h100-...-fortieth*);
        across rows (a row's threads already agree) each thread folds its row's slots in order.
        Every block does the same in the same order, so all hold the same value; across rows,
        where nothing after the last pass reads it but the row's store, only the storing thread
        folds (on an H100, splits of 32-64 where every thread folded up to 512 slots ran 2-10x
        slower than splits of 8-16).
        Loads through L2 (__ldcg): the other blocks' writes never sat in this SM's L1."""
        lines, slots = [], self.plan.rows * self.S
        width = min(self.T, WARP)
        if self.plan.along_rows:  # one row a block, every block's row in range; each warp folds them all
            mine, guard, first, step = "blockIdx.x", "", f"t % {width}", width
        else:
            mine, guard, first, step = f"row * {self.S} + blockIdx.x % {self.S}", "row_ok && ", "0", 1
        stored_only = not self.plan.along_rows and work is self.plan.passes[-1] and not self._element_outputs()
        fold_guard = f"{guard}t == 0 && blockIdx.x % {self.S} == 0 && " if stored_only else guard
        folds = []
        for p in partials:
            i = self.partial_index[p.acc]
            kind = self._accumulator(p)
            lines += [f"{kind}* ws{i} = reinterpret_cast<{kind}*>(ws + {WORKSPACE_SLOT_BYTES * i * slots});",
                      f"if ({guard}t == 0) ws{i}[{mine}] = {p.acc};"]
            slot = self._item(p, lambda j, at: f"__ldcg(&ws{j}[row * {self.S} + {at}])", "g")
            item = COMBINE[p.combine].format(a=p.acc, b=slot)
            folds += [f"{p.acc} = {IDENTITY[p.combine]};",
                      f"for (int g = {first}; {fold_guard}g < {self.S}; g += {step}) {p.acc} = {item};"]
        groups = split_groups(self.plan, self.launch)
        line = COUNTER_LINE_BYTES // 4
        first = 2 * groups * next(i for i, p in enumerate(self.plan.passes) if p is work)  # this pass's counters
        arrived = f"bar + {line} * ({f'{first} + ' if first else ''}blockIdx.x / {self.S})"
        barrier = [f"rows_split_barrier({arrived}, {arrived} + {line * groups}, {self.S}u);"]
        if not self.plan.along_rows:  # each row's first thread wrote its partials
            barrier.insert(0, "__syncthreads();")
        lines = self._lanes(lines) + barrier + self._lanes(folds)
        if not self.plan.along_rows:
            return lines
        return lines + self._lanes(_shuffles(partials, width, self._accumulator))

    def _combine_across_rows(self, work: Pass) -> list[str]:
        """Through shared memory, each of the thread's rows in its own array, one barrier for all."""
        if self.T == 1:
            return []
        stores, folds = [], []
        for p in work.partials:
            i = self.partial_index[p.acc]
            stores += [f"__shared__ {self._accumulator(p)} red{i}[{self.T}][{self.R}];",
                       f"red{i}[t][slot] = {p.acc};"]
            folds += self._fold(p, lambda j, at: f"red{j}[{at}][slot]", "y", self.T)
        return self._lanes(stores) + ["__syncthreads();"] + self._lanes(folds)

    def _fold(self, p: Partial, slot, index: str, count: int) -> list[str]:
        """p.acc = the combination of its slots `slot(i, at)` (i: p's index) for `at` in [0, count),
        in order, the loop's variable `index`."""
        return [f"{p.acc} = {self._item(p, slot, 0)};", f"for (int {index} = 1; {index} < {count}; ++{index}) "
                f"{p.acc} = {COMBINE[p.combine].format(a=p.acc, b=self._item(p, slot, index))};"]

    def _item(self, p: Partial, slot, at) -> str:
        """Partial p's item at `at` of slots `slot(i, at)` (i: a partial's index). An online sum's
        is rescaled to its max, which its pass's partials (in order) folded before it."""
        item = slot(self.partial_index[p.acc], at)
        if p.combine != "online":
            return item
        return f"rows_online_rescale({item}, {slot(self.partial_index[p.scale], at)}, {p.scale})"

    # -- outputs -----------------------------------------------------------------------------
    def _element_outputs(self) -> list[int]:
        return [k for k, o in enumerate(self.plan.outputs) if not o.per_row]

    def _epilogue(self) -> list[str]:
        """Element outputs: each vector's elements computed into a register vector, then written."""
        assign, declare, write = self._output_vectors()
        loads = self._next_loads() if self.launch.persistent else []
        return self._sweep(self.plan.epilogue, assign, declare, write + loads)

    def _output_vectors(self) -> tuple[list[str], list[str], list[str]]:
        """The element outputs' register vectors, in _sweep's order: assigned at lane v, declared,
        written at j0."""
        declare, assign, write = [], [], []
        for k in self._element_outputs():
            o = self.plan.outputs[k]
            info = dtype_info(o.spec.torch_dtype)
            vec = f"Vec<{info.storage}, {self.V}>"
            declare.append(f"{vec} y{k};")
            assign.append(f"y{k}.v[v] = {info.store.format(o.value)};")
            write.append(f"*reinterpret_cast<{vec}*>(out{k} + out{k}_base + {self._offset(o.inner, 'j0')}) = y{k};")
        return assign, declare, write

    # -- a scan along the row ---------------------------------------------------------------
    def _scan(self) -> list[str]:
        """The row in chunks of K tiles, in order (tile e: vector e * T + t of thread t, so a warp's
        accesses are contiguous). A thread loads its vectors of the chunk's K tiles at once, sums
        each vector's source elements in order (fp32: at most 8), then the K thread totals are
        scanned across the row's threads together (shuffles, then shared memory across warps: one
        __syncthreads a chunk, buffers alternating between chunks so none is overwritten while
        read). Element j's sum = carry (the earlier tiles' totals) + the exclusive prefix of its
        thread's total + its prefix in its vector: the first two in double (as the family sums),
        rounded to fp32 once a vector, so an element's error does not grow along the row. Then the
        epilogue computes and stores the element outputs of the tile."""
        K = self._scan_tiles
        reads = sorted(set(self.plan.scan.work.reads) | set(self.plan.epilogue.reads))
        lines = ["double carry = 0.0;"] + ([f"const int lane = t % {min(self.T, WARP)};"] if self.T > 1 else [])
        if self.T > WARP:
            buffers = min(2, self._scan_chunks)
            lines += [f"const int warp = t / {WARP};",
                      f"__shared__ double scan_warps[{buffers}][{K}][{self.R}][{self.T // WARP}];"]
        body = [f"{self._buffer_type(k)} l{k}[{K}];" for k in reads]
        body += [f"float pre[{K}][{self.V}];", f"double incl[{K}], excl[{K}], tile[{K}];"]
        body += self._tile_sums(reads) + self._scan_across_threads() + self._tile_outputs()
        return lines + ["#pragma unroll 1", f"for (int c = 0; c < {self._scan_chunks}; ++c) {{"] + [
            "  " + line for line in body] + ["}"]

    def _tile_sums(self, reads: list[int]) -> list[str]:
        """Each tile's vectors l<k>[i] loaded (zeros past the row's end); pre[i][v], the fp32 sum
        of the vector's source up to lane v; incl[i], the vector's total (0 past the end)."""
        scan = self.plan.scan
        elements = self._element_values(scan.work.reads, lambda k: f"l{k}[i]") + list(scan.work.body)
        return self._over_tiles(
            [f"l{k}[i] = ok ? {self._global_read(k)} : {self._buffer_type(k)}{{}};" for k in reads]
            + ["float run = 0.0f;", "#pragma unroll", f"for (int v = 0; v < {self.V}; ++v) {{"]
            + ["  " + line for line in elements]
            + [f"  run += {scan.source};", "  pre[i][v] = run;", "}", "incl[i] = ok ? (double)run : 0.0;"])

    def _tile_outputs(self) -> list[str]:
        """Each tile's element outputs, from the scan's value at each element (carry + exclusive
        prefix, rounded to fp32 once a vector, + the prefix in the vector); the carry moves on."""
        assign, declare, write = self._output_vectors()
        per_element = (self._element_values(self.plan.epilogue.reads, lambda k: f"l{k}[i]")
                       + [f"const float {self.plan.scan.value} = base + pre[i][v];"]
                       + list(self.plan.epilogue.body) + assign)
        return self._over_tiles(
            ["const float base = (float)(carry + excl[i]);", "carry += tile[i];", "if (ok) {"]
            + ["  " + line for line in declare + ["#pragma unroll", f"for (int v = 0; v < {self.V}; ++v) {{"]]
            + ["    " + line for line in per_element] + ["  }"] + ["  " + line for line in write] + ["}"])

    @property
    def _scan_tiles(self) -> int:
        return min(SCAN_TILES, self.E)

    @property
    def _scan_chunks(self) -> int:
        return -(-self.E // self._scan_tiles)

    def _over_tiles(self, body: list[str]) -> list[str]:
        """`body` for each tile i of chunk c, with s its vector's index in the row, j0 its first
        element and ok whether the row has it."""
        K = self._scan_tiles
        bounds = ["row_ok"] + ([f"s < {self.NV}"] if self._scan_chunks * K * self.T != self.NV else [])
        tile = "i" if self._scan_chunks == 1 else f"(idx_t)c * {K} + i"
        first = [f"const idx_t j0 = s * {self.V};"] if any("j0" in line for line in body) else []
        index = [f"const idx_t s = ({tile}) * {self.T} + t;"] if first or len(bounds) > 1 else []
        return (["#pragma unroll", f"for (int i = 0; i < {K}; ++i) {{"]
                + ["  " + line for line in index + first + [f"const bool ok = {' && '.join(bounds)};"] + body]
                + ["}"])

    def _scan_across_threads(self) -> list[str]:
        """incl[i]: the inclusive scan of the threads' totals of tile i over the row's threads;
        excl[i] the exclusive one, tile[i] the row's total of the tile."""
        lanes, K = min(self.T, WARP), self._scan_tiles
        if lanes == 1:
            return ["#pragma unroll", f"for (int i = 0; i < {K}; ++i) {{", "  excl[i] = 0.0;", "  tile[i] = incl[i];",
                    "}"]
        lines = ["#pragma unroll", f"for (int d = 1; d < {lanes}; d <<= 1) {{", "  #pragma unroll",
                 f"  for (int i = 0; i < {K}; ++i) {{",
                 f"    const double up = __shfl_up_sync({FULL_MASK}, incl[i], d, {lanes});",
                 "    if (lane >= d) incl[i] += up;", "  }", "}",
                 "#pragma unroll", f"for (int i = 0; i < {K}; ++i) {{",
                 f"  const double before = __shfl_up_sync({FULL_MASK}, incl[i], 1, {lanes});",
                 "  excl[i] = lane == 0 ? 0.0 : before;"]
        if self.T <= WARP:
            return lines + [f"  tile[i] = __shfl_sync({FULL_MASK}, incl[i], {lanes - 1}, {lanes});", "}"]
        buffer = "c & 1" if self._scan_chunks > 1 else "0"
        return lines + ["}", f"if (lane == {WARP - 1}) {{", "  #pragma unroll",
                        f"  for (int i = 0; i < {K}; ++i) scan_warps[{buffer}][i][slot][warp] = incl[i];", "}",
                        "__syncthreads();", "#pragma unroll", f"for (int i = 0; i < {K}; ++i) {{",
                        "  tile[i] = 0.0;", f"  for (int w = 0; w < {self.T // WARP}; ++w) {{",
                        f"    const double u = scan_warps[{buffer}][i][slot][w];",
                        "    if (w < warp) excl[i] += u;", "    tile[i] += u;", "  }", "}"]

    def _row_stores(self) -> list[str]:
        stores = []
        for k, o in enumerate(self.plan.outputs):
            if o.per_row:
                info = dtype_info(o.spec.torch_dtype)
                for w in range(self.L):  # lane w's output is w rows on (a step of the last outer dim)
                    at = f"out{k}_base + {w * o.outer[-1]}" if self.L > 1 else f"out{k}_base"
                    stores += self._in_lane([f"out{k}[{at}] = {info.store.format(o.value)};"], w)
        if not stores:
            return []
        first = ("t == 0" + (" && cluster.block_rank() == 0" if self.C > 1 else "")
                 + (f" && blockIdx.x % {self.S} == 0" if self.S > 1 else ""))
        return [f"if (row_ok && {first}) {{"] + ["  " + s for s in stores] + ["}"]


# A row's values in the kernel (accesses' values, computed values, accumulators, their shared and
# workspace slots) and its index: what a thread taking several rows keeps once for each.
# (acc<k>_v, _y, _from, _at, _top: a vector's staged sum, an online sum's vector, its max before it,
# its max before shuffles, the max taken first)
_LANE_LOCAL = re.compile(r"\b((?:a|v|acc|red|fin|ws|rcp)\d+(?:_v|_y|_from|_at|_top|_rescale|_scale)?)\b")
_ROW = re.compile(r"\brow\b")


def _online_element(p: Partial, kind: str) -> list[str]:
    """An online sum's element, before its max takes it: where the max grows, the sum (in type
    `kind`) is rescaled."""
    term = p.term.format
    return ["{", f"  const float to = pw_maximum({p.scale}, {p.source});",
            f"  if (to != {p.scale}) {p.acc} *= ({kind}){term(f'{p.scale} - to')};",
            f"  {p.acc} += ({kind}){term(f'{p.source} - fmaxf(to, -{FLOAT_MAX})')};", "}"]


def _online_vector(p: Partial, width: int, kind: str) -> list[str]:
    """An online sum's vector of `width` elements (p.acc_y), once its max took them all: the sum
    (in type `kind`) rescaled where the max grew, then their terms summed in fp32 (the max -inf:
    every term 0)."""
    term = p.term.format
    return [f"if ({p.scale} != {p.acc}_from) {p.acc} *= ({kind}){term(f'{p.acc}_from - {p.scale}')};", "{",
            f"  const float base = fmaxf({p.scale}, -{FLOAT_MAX});", "  float terms = 0.0f;", "  #pragma unroll",
            f"  for (int v = 0; v < {width}; ++v) terms += {term(f'{p.acc}_y[v] - base')};",
            f"  {p.acc} += ({kind})terms;", "}"]


def _shuffles(partials, lanes: int, kind_of) -> list[str]:
    """Each partial combined over `lanes` consecutive lanes of a warp (a power of two) by
    butterfly shuffles, so every one of them holds the result. An online sum (in type kind_of(p))
    is rescaled once from its lane's max to the lanes' max (its max, a partial of the same pass,
    combined first), then added: one exp a lane, where merging (sum, max) pairs took one a step."""
    if lanes == 1:
        return []
    def butterfly(lines: list[str]) -> list[str]:
        return ["#pragma unroll", f"for (int m = {lanes // 2}; m > 0; m >>= 1) {{"] + _indent_lines(lines) + ["}"]
    online = [p for p in partials if p.combine == "online"]
    if any(p.scale not in {q.acc for q in partials} for p in online):
        raise ValueError("an online sum's max is not among the partials combined with it")
    lines = butterfly([f"{p.acc} = {COMBINE[p.combine].format(a=p.acc, b=_shuffle_xor(p.acc))};"
                       for p in partials if p.combine != "online"])
    if not online:
        return lines
    return (["{"] + [f"  const float {p.acc}_at = {p.scale};" for p in online] + _indent_lines(lines)
            + [f"  {p.acc} = rows_online_rescale({p.acc}, {p.acc}_at, {p.scale});" for p in online]
            + _indent_lines(butterfly([f"{p.acc} = {p.acc} + ({kind_of(p)}){_shuffle_xor(p.acc)};" for p in online]))
            + ["}"])


def _shuffle_xor(value: str) -> str:
    """`value` of the lane whose index differs from this one's in the bits of m."""
    return f"__shfl_xor_sync({FULL_MASK}, {value}, m)"


def _operand(p: Partial) -> str:
    """The value a partial accumulates, in its accumulator's type."""
    return f"(double)({p.source})" if ACCUMULATOR[p.combine] == "double" else p.source


def _drop_unused(lines: list[str], names: list[str]) -> list[str]:
    """`lines` less the declarations of `names` that nothing else uses."""
    for name in names:
        used = re.compile(rf"\b{name}\b")
        declared = re.compile(rf"^const \w+ {name} = ")
        if sum(1 for line in lines if used.search(line)) == 1:
            lines = [line for line in lines if not declared.match(line)]
    return lines


def _dot(prefix: str, strides: tuple[int, ...]) -> str:
    terms = [f"{prefix}{d}" if st == 1 else f"{prefix}{d} * {st}" for d, st in enumerate(strides) if st != 0]
    return " + ".join(terms) or "0"


def _indent_lines(lines: list[str], spaces: int = 2) -> list[str]:
    return [" " * spaces + line for line in lines]


def _indent(lines: list[str], spaces: int) -> str:
    return "\n".join(_indent_lines(lines, spaces))
