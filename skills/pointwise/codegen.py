"""PointwisePlan + launch shape -> the CUDA C source of one kernel.

Sizes and strides are baked in as constants (division by a constant compiles to a multiply), so
the kernel takes only pointers: inputs, then outputs. Each thread walks groups of `width`
consecutive elements (in row-major order of the iteration shape) in a grid-stride loop,
`unroll` groups a step, `block` apart so that a warp's accesses stay contiguous; it loads every
group of a step before computing any, so the loads are in flight together. Elements past the
last whole group (only when the iteration space is one coalesced dim) are a scalar tail for the
first block. Plans with a transposed operand also get a tiled kernel (tiled_kernel_source) that
stages it through shared memory, so that every global access of a warp is contiguous.
"""
from __future__ import annotations

import math

from .ops import DEVICE_FUNCTIONS
from .plan import Operand, PointwisePlan

TILE = 32  # the tiled kernel's tile edge: one warp spans a tile row

CONVERSIONS = r"""
struct f16 { unsigned short bits; };
struct bf16 { unsigned short bits; };
template <typename T, int N> struct alignas(sizeof(T) * N) Vec { T v[N]; };

__device__ __forceinline__ float f16_to_float(f16 h) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h.bits));
  return f;
}
__device__ __forceinline__ f16 float_to_f16(float f) {
  f16 h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h.bits) : "f"(f));
  return h;
}
__device__ __forceinline__ float bf16_to_float(bf16 h) { return __uint_as_float(((unsigned int)h.bits) << 16); }
// Round to nearest even, NaN kept: one instruction from sm_80, else c10::BFloat16's bit trick.
__device__ __forceinline__ bf16 float_to_bf16(float f) {
  bf16 h;
#if __CUDA_ARCH__ >= 800
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h.bits) : "f"(f));
#else
  const unsigned int u = __float_as_uint(f);
  h.bits = (f != f) ? (unsigned short)0x7fc0u : (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
#endif
  return h;
}
__device__ __forceinline__ float round_f16(float x) { return f16_to_float(float_to_f16(x)); }
__device__ __forceinline__ float round_bf16(float x) { return bf16_to_float(float_to_bf16(x)); }
"""


def kernel_source(plan: PointwisePlan, name: str, block: int, unroll: int, width: int) -> str:
    """A kernel for `plan` reading and writing `width` elements per access (1, or a width that
    divides plan.vector_width); launch it with `block` threads and any number of blocks."""
    groups, tail = divmod(plan.numel, width)
    body = ((_main_loop(plan, block, unroll, width, groups) if groups else "")
            + (_tail(plan, groups * width, tail) if tail else ""))
    return _kernel(plan, name, block, body)


def _kernel(plan: PointwisePlan, name: str, threads: int, body: str) -> str:
    params = ([f"const {op.info.storage}* __restrict__ in{k}" for k, op in enumerate(plan.inputs)]
              + [f"{op.info.storage}* __restrict__ out{k}" for k, op in enumerate(plan.outputs)])
    return f"""{CONVERSIONS}
{DEVICE_FUNCTIONS}

typedef {"long long" if plan.wide_index else "int"} idx_t;

{_compute_function(plan)}

extern "C" __global__ void __launch_bounds__({threads}) {name}({", ".join(params)}) {{
{body}
}}
"""


def is_staged(op: Operand) -> bool:
    """Whether the tiled kernel moves `op` through shared memory: it is contiguous along the
    outer of the two innermost dims (a transposed view), so direct accesses of a warp, which
    runs along the innermost dim, would each touch another row."""
    return len(op.strides) >= 2 and op.strides[-2] == 1 and op.strides[-1] not in (0, 1)


def wants_tiles(plan: PointwisePlan) -> bool:
    """Whether the tiled kernel applies: some operand is staged, and all staged tiles fit in
    the 48 KB of static shared memory a block may have."""
    staged = [op for op in _accessed(plan) if is_staged(op)]
    return bool(staged) and sum(op.spec.torch_dtype.itemsize for op in staged) * TILE * (TILE + 1) <= 48 * 1024


def tile_count(plan: PointwisePlan) -> int:
    *batch, rows, cols = plan.sizes
    return math.prod(batch) * -(-rows // TILE) * -(-cols // TILE)


def tiled_kernel_source(plan: PointwisePlan, name: str, rows: int) -> str:
    """A kernel for `plan` (2 dims or more) that takes one TILE x TILE tile of the two innermost
    dims per block of TILE x `rows` threads (launch tile_count(plan) blocks). A warp spans a
    tile row, so direct accesses are coalesced for operands contiguous along the innermost dim;
    staged ones are read (written) along their own contiguous dim into (out of) a padded shared
    tile. Leading dims are batch dims, one tile of each per block."""
    staged_in = [k for k in plan.reads if is_staged(plan.inputs[k])]
    staged_out = [k for k, op in enumerate(plan.outputs) if is_staged(op)]
    # a staged tile is indexed [column][row] within the tile
    tiles = ([f"__shared__ {plan.inputs[k].info.storage} in{k}_tile[{TILE}][{TILE + 1}];" for k in staged_in]
             + [f"__shared__ {plan.outputs[k].info.storage} out{k}_tile[{TILE}][{TILE + 1}];" for k in staged_out])
    reads = [f"in{k}_tile[j][threadIdx.x] = in{k}[{_offset(plan, plan.inputs[k])}];" for k in staged_in]
    loaded = [plan.inputs[k].info.load.format(
        f"in{k}_tile[threadIdx.x][j]" if k in staged_in else f"in{k}[{_offset(plan, plan.inputs[k])}]")
        for k in plan.reads]
    stores = [f"out{k}_tile[threadIdx.x][j]" if k in staged_out else f"out{k}[{_offset(plan, op)}]"
              for k, op in enumerate(plan.outputs)]
    writes = [f"out{k}[{_offset(plan, plan.outputs[k])}] = out{k}_tile[j][threadIdx.x];" for k in staged_out]
    passes = ((_tile_pass(plan, rows, True, reads) + ["__syncthreads();"] if reads else [])
              + _tile_pass(plan, rows, False, _call_compute(plan, loaded, stores))
              + (["__syncthreads();"] + _tile_pass(plan, rows, True, writes) if writes else []))
    return _kernel(plan, name, TILE * rows, _indent(tiles + _tile_origin(plan) + passes, 2))


def _tile_origin(plan: PointwisePlan) -> list[str]:
    """row0/col0: the block's tile's first row and column; c<d>: its batch coordinates."""
    *batch, rows, cols = plan.sizes
    tiles_c, tiles_r = -(-cols // TILE), -(-rows // TILE)
    lines = [f"const idx_t col0 = (idx_t)(blockIdx.x % {tiles_c}) * {TILE};",
             f"const idx_t row0 = (idx_t)(blockIdx.x / {tiles_c}{f' % {tiles_r}' if batch else ''}) * {TILE};"]
    if batch:
        lines.append(f"const idx_t b = (idx_t)blockIdx.x / {tiles_c * tiles_r};")
        lines += _coordinates(plan, tuple(batch), "b")
    return lines


def _tile_pass(plan: PointwisePlan, rows: int, along_rows: bool, work: list[str]) -> list[str]:
    """`work` for each element of the tile that lies inside the iteration space; j counts the
    steps of the threadIdx.y rows. Passes along rows put threadIdx.x on the row coordinate, so
    staged operands (stride 1 along rows) are accessed contiguously by a warp."""
    d = len(plan.sizes)
    r, c = ("threadIdx.x", "j") if along_rows else ("j", "threadIdx.x")
    bounds = [f"c{d - 2 + k} < {n}" for k, n in enumerate(plan.sizes[-2:]) if n % TILE]
    inner = ([f"const idx_t c{d - 2} = row0 + {r};", f"const idx_t c{d - 1} = col0 + {c};"]
             + ([f"if ({' && '.join(bounds)}) {{"] + ["  " + line for line in work] + ["}"] if bounds else work))
    return (["#pragma unroll", f"for (int step = 0; step < {TILE // rows}; ++step) {{",
             f"  const int j = threadIdx.y + step * {rows};"]
            + ["  " + line for line in inner] + ["}"])


def _main_loop(plan: PointwisePlan, block: int, unroll: int, width: int, groups: int) -> str:
    step = block * unroll
    return f"""  for (idx_t base = (idx_t)blockIdx.x * {step} + (idx_t)threadIdx.x; base < {groups};
       base += (idx_t)gridDim.x * {step}) {{
{_indent(_declarations(plan, width, unroll), 4)}
    #pragma unroll
    for (int u = 0; u < {unroll}; ++u) {{
      const idx_t group = base + u * {block};
      if (group < {groups}) {{
        const idx_t i = group * {width};
{_indent(_group_loads(plan, width), 8)}
      }}
    }}
    #pragma unroll
    for (int u = 0; u < {unroll}; ++u) {{
      if (base + u * {block} < {groups}) {{
{_indent(_group_compute_and_store(plan, width), 8)}
      }}
    }}
  }}"""


def _tail(plan: PointwisePlan, start: int, count: int) -> str:
    return f"""
  if (blockIdx.x == 0 && threadIdx.x < {count}) {{
    const idx_t i = {start} + (idx_t)threadIdx.x;
{_indent(_scalar_element(plan), 4)}
  }}"""


def _compute_function(plan: PointwisePlan) -> str:
    params = ([f"const {plan.inputs[k].info.ctype} x{k}" for k in plan.reads]
              + [f"{op.info.ctype}& y{k}" for k, op in enumerate(plan.outputs)])
    lines = list(plan.body) + [f"y{k} = {value};" for k, value in enumerate(plan.results)]
    return (f"__device__ __forceinline__ void pw_compute({', '.join(params)}) {{\n"
            f"{_indent(lines, 2)}\n}}")


def is_vector_access(op: Operand, width: int) -> bool:
    """Read with vector accesses; otherwise one element stands for the whole group."""
    return width > 1 and op.strides[-1] != 0


def _declarations(plan: PointwisePlan, width: int, unroll: int) -> list[str]:
    lines = []
    for k in plan.reads:
        op = plan.inputs[k]
        kind = f"Vec<{op.info.storage}, {width}>" if is_vector_access(op, width) else op.info.storage
        lines.append(f"{kind} in{k}_data[{unroll}];")
    lines += [f"idx_t out{k}_offset[{unroll}];" for k in range(len(plan.outputs))]
    return lines


def _group_loads(plan: PointwisePlan, width: int) -> list[str]:
    lines = _coordinates(plan)
    for k in plan.reads:
        op = plan.inputs[k]
        if is_vector_access(op, width):
            vec = f"Vec<{op.info.storage}, {width}>"
            lines.append(f"in{k}_data[u] = *reinterpret_cast<const {vec}*>(in{k} + {_offset(plan, op)});")
        else:
            lines.append(f"in{k}_data[u] = in{k}[{_offset(plan, op)}];")
    lines += [f"out{k}_offset[u] = {_offset(plan, op)};" for k, op in enumerate(plan.outputs)]
    return lines


def _group_compute_and_store(plan: PointwisePlan, width: int) -> list[str]:
    loaded = []
    for k in plan.reads:
        op = plan.inputs[k]
        loaded.append(op.info.load.format(f"in{k}_data[u].v[j]" if is_vector_access(op, width) else f"in{k}_data[u]"))
    outs = plan.outputs
    return ([f"Vec<{op.info.storage}, {width}> out{k}_v;" for k, op in enumerate(outs)]
            + ["#pragma unroll", f"for (int j = 0; j < {width}; ++j) {{"]
            + ["  " + line for line in _call_compute(plan, loaded, [f"out{k}_v.v[j]" for k in range(len(outs))])]
            + ["}"]
            + [f"*reinterpret_cast<Vec<{op.info.storage}, {width}>*>(out{k} + out{k}_offset[u]) = out{k}_v;"
               for k, op in enumerate(outs)])


def _scalar_element(plan: PointwisePlan) -> list[str]:
    loaded = [plan.inputs[k].info.load.format(f"in{k}[{_offset(plan, plan.inputs[k])}]") for k in plan.reads]
    stores = [f"out{k}[{_offset(plan, op)}]" for k, op in enumerate(plan.outputs)]
    return _coordinates(plan) + _call_compute(plan, loaded, stores)


def _call_compute(plan: PointwisePlan, loaded: list[str], stores: list[str]) -> list[str]:
    outs = plan.outputs
    return ([f"{op.info.ctype} y{k};" for k, op in enumerate(outs)]
            + [f"pw_compute({', '.join(loaded + [f'y{k}' for k in range(len(outs))])});"]
            + [f"{dst} = {op.info.store.format(f'y{k}')};" for k, (dst, op) in enumerate(zip(stores, outs))])


def _accessed(plan: PointwisePlan) -> list[Operand]:
    return [plan.inputs[k] for k in plan.reads] + list(plan.outputs)


def _coordinates(plan: PointwisePlan, sizes: tuple[int, ...] | None = None, index: str = "i") -> list[str]:
    """c<d> = the index of element `index` of `sizes` (the leading coalesced dims; all of them
    by default) along dim d, for the dims some operand moves in."""
    sizes = plan.sizes if sizes is None else sizes
    lines = []
    for d, size in enumerate(sizes):
        if all(op.strides[d] == 0 for op in _accessed(plan)):
            continue
        inner = math.prod(sizes[d + 1:])
        coord = index if inner == 1 else f"({index} / {inner})"
        lines.append(f"const idx_t c{d} = {coord if d == 0 else f'{coord} % {size}'};")
    return lines


def _offset(plan: PointwisePlan, op: Operand) -> str:
    terms = [f"c{d}" if st == 1 else f"c{d} * {st}" for d, st in enumerate(op.strides) if st != 0]
    return " + ".join(terms) or "0"


def _indent(lines: list[str], spaces: int) -> str:
    return "\n".join(" " * spaces + line for line in lines)
