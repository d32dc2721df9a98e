"""PointwisePlan + launch shape -> the CUDA C source of one kernel.

Sizes and strides are baked in as constants (division by a constant compiles to a multiply), so
the kernel takes only pointers: inputs, then outputs. Each thread walks groups of `width`
consecutive elements (in row-major order of the iteration shape) in a grid-stride loop,
`unroll` groups a step, `block` apart so that a warp's accesses stay contiguous; it loads every
group of a step before computing any, so the loads are in flight together. Elements past the
last whole group (only when the iteration space is one coalesced dim) are a scalar tail for the
first block.
"""
from __future__ import annotations

import math

from .ops import DEVICE_FUNCTIONS
from .plan import Operand, PointwisePlan

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
    params = ([f"const {op.info.storage}* __restrict__ in{k}" for k, op in enumerate(plan.inputs)]
              + [f"{op.info.storage}* __restrict__ out{k}" for k, op in enumerate(plan.outputs)])
    body = ((_main_loop(plan, block, unroll, width, groups) if groups else "")
            + (_tail(plan, groups * width, tail) if tail else ""))
    return f"""{CONVERSIONS}
{DEVICE_FUNCTIONS}

typedef {"long long" if plan.wide_index else "int"} idx_t;

{_compute_function(plan)}

extern "C" __global__ void __launch_bounds__({block}) {name}({", ".join(params)}) {{
{body}
}}
"""


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


def _coordinates(plan: PointwisePlan) -> list[str]:
    """c<d> = the index of element i along coalesced dim d, for the dims some operand moves in."""
    accessed = [plan.inputs[k] for k in plan.reads] + list(plan.outputs)
    lines = []
    for d, size in enumerate(plan.sizes):
        if all(op.strides[d] == 0 for op in accessed):
            continue
        inner = math.prod(plan.sizes[d + 1:])
        coord = "i" if inner == 1 else f"(i / {inner})"
        lines.append(f"const idx_t c{d} = {coord if d == 0 else f'{coord} % {size}'};")
    return lines


def _offset(plan: PointwisePlan, op: Operand) -> str:
    terms = [f"c{d}" if st == 1 else f"c{d} * {st}" for d, st in enumerate(op.strides) if st != 0]
    return " + ".join(terms) or "0"


def _indent(lines: list[str], spaces: int) -> str:
    return "\n".join(" " * spaces + line for line in lines)
