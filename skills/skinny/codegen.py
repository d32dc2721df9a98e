"""SkinnyPlan + Launch -> the CUDA C source of one kernel: the product on the tensor cores
(mma.sync m16n8k16, fp32 sums), reading the matrix once.

A block takes 16 rows of the matrix; its `warps` warps split k, each taking 64 * `unroll`
elements of k at a time (strided over the warps), and fold their sums through shared memory at
the end, in warp order. Lane (g, q) of a warp (g = lane / 4, q = lane % 4) loads 16-byte vectors
(8 elements of k) from matrix rows g and g + 8, and from vector g (and g + 8 where there are more
than 8): the q-th of each 32 elements, so that a load instruction reads 64 contiguous bytes of
each row, whole 32-byte sectors (a sector read half by one instruction and half by the next
would cross from L2 twice, as the matrix is not kept in L1). The product's sum over k does not
care which k each of its 16 slots holds, so a lane's registers go to the fragments as they are:
for the slots (2q, 2q + 1) and (2q + 8, 2q + 9) of a step, A takes a register pair of the
matrix's vectors and B the same pair of the vector's, and both then hold the same elements of k.

The matrix is read past L1 (each element once); the vectors through it, as every block reads
them. Sizes and strides are constants; the kernel takes the inputs' pointers, then the output's.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from skills.pointwise.codegen import CONVERSIONS, compute_function, scalar_element
from skills.pointwise.dtypes import operand_info
from skills.pointwise.ops import DEVICE_FUNCTIONS

from .plan import SkinnyPlan

WARP, TILE_ROWS, TILE_VECTORS, STEP = 32, 16, 8, 64  # mma m16n8k16; a warp's k a step: 4 lanes x 16
_MMA_TYPE = {torch.bfloat16: "bf16", torch.float16: "f16"}


@dataclass(frozen=True)
class Launch:
    warps: int    # a block's warps, splitting k
    unroll: int   # steps of 64 elements of k a warp loads before it multiplies

    @property
    def threads(self) -> int:
        return self.warps * WARP


def tiles(plan: SkinnyPlan) -> int:
    """8-wide tiles of vectors."""
    return -(-plan.vectors // TILE_VECTORS)


def blocks(plan: SkinnyPlan) -> int:
    return -(-plan.rows // TILE_ROWS)


def vector_loads(plan: SkinnyPlan) -> dict[str, bool]:
    """Whether the matrix's and the vectors' 8 elements of k are one 16-byte load each (the
    pointer aligned, which the launch spec checks): contiguous along k, every row's start at a
    multiple of 8 elements."""
    def whole(strides: tuple[int, int], count: int) -> bool:
        return strides[1] == 1 and (strides[0] % 8 == 0 or count == 1) and plan.k % 8 == 0
    return {"matrix": whole(plan.matrix.strides, plan.rows), "vector": whole(plan.vector.strides, plan.vectors)}


_HELPERS = r"""
typedef unsigned short u16;
typedef unsigned int u32;
// 8 elements of the matrix where `ok` (else zeros), read once: past L1, which the vectors use;
// L2 fetches 256 bytes at once, as the rest of them follows. Predicated inside the asm, not
// branched around (straight-line code for the scheduler).
__device__ __forceinline__ uint4 sk_stream(const u16* p, bool ok) {
  uint4 v = make_uint4(0, 0, 0, 0);
  asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %5, 0;\n"
               " @p ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];\n}"
               : "+r"(v.x), "+r"(v.y), "+r"(v.z), "+r"(v.w) : "l"(p), "r"((int)ok));
  return v;
}
__device__ __forceinline__ uint4 sk_vector(const u16* p, bool ok) {
  uint4 v = make_uint4(0, 0, 0, 0);
  asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %5, 0;\n @p ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];\n}"
               : "+r"(v.x), "+r"(v.y), "+r"(v.z), "+r"(v.w) : "l"(p), "r"((int)ok));
  return v;
}
// 8 elements `stride` apart, those from `count` on zero.
__device__ __forceinline__ uint4 sk_gather(const u16* p, long long stride, int count) {
  u32 w[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const u32 lo = 2 * i < count ? __ldg(p + 2 * i * stride) : 0;
    const u32 hi = 2 * i + 1 < count ? __ldg(p + (2 * i + 1) * stride) : 0;
    w[i] = lo | (hi << 16);
  }
  return make_uint4(w[0], w[1], w[2], w[3]);
}
"""


def kernel_source(plan: SkinnyPlan, name: str, launch: Launch, vectors: bool = True) -> str:
    """The kernel; `vectors`: 16-byte loads where vector_loads allows (else one element a load)."""
    whole = vector_loads(plan) if vectors else {"matrix": False, "vector": False}
    n_tiles, k, epilogue = tiles(plan), plan.k, plan.epilogue
    params = ([f"const {operand_info(s.torch_dtype).storage}* __restrict__ in{i}" for i, s in enumerate(plan.inputs)]
              + [f"{op.info.storage}* __restrict__ out{i}" for i, op in enumerate(epilogue.outputs)])
    mma = (f"mma.sync.aligned.m16n8k16.row.col.f32.{_MMA_TYPE[plan.dtype]}.{_MMA_TYPE[plan.dtype]}.f32 "
           "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};")
    u = launch.unroll

    def load(kind: str, pointer: str, ok: str, at: str) -> str:
        stride = (plan.matrix if kind == "matrix" else plan.vector).strides[1]
        if whole[kind]:
            fn = "sk_stream" if kind == "matrix" else "sk_vector"
            return f"{fn}({pointer} + {at}, {ok} && {at} < {k})"
        return f"{ok} ? sk_gather({pointer} + (long long)({at}) * {stride}, {stride}, {k} - ({at})) : make_uint4(0, 0, 0, 0)"

    names, loads, products = [], [], []
    for j in range(u):
        for h in range(2):
            at = f"k0 + {j * STEP + h * 32}"
            step = [(f"lo{j}_{h}", load("matrix", "lo", "lo_ok", at)), (f"hi{j}_{h}", load("matrix", "hi", "hi_ok", at))]
            step += [(f"v{t}_{j}_{h}", load("vector", f"vec{t}", f"vec{t}_ok", at)) for t in range(n_tiles)]
            names += [n for n, _ in step]
            loads += [f"uint4 {n}_next = {expr};" for n, expr in step]
            products += [f"sk_mma(acc{t}, lo{j}_{h}.{a}, hi{j}_{h}.{a}, lo{j}_{h}.{b}, hi{j}_{h}.{b}, "
                         f"v{t}_{j}_{h}.{a}, v{t}_{j}_{h}.{b});"
                         for a, b in (("x", "y"), ("z", "w")) for t in range(n_tiles)]
    # the epilogue's element i: the product's (row, j), in the outputs' order
    element = scalar_element(epilogue, {plan.product: "s"})
    m_row, v_row = plan.matrix.strides[0], plan.vector.strides[0]
    o_row, o_vec = plan.place
    vector_pointers = "\n".join(
        f"  const bool vec{t}_ok = g + {t * 8} < {plan.vectors};\n"
        f"  const u16* vec{t} = reinterpret_cast<const u16*>(in{plan.vector.input}) + (long long)(g + {t * 8}) * {v_row};"
        for t in range(n_tiles))
    nl = "\n    "
    return f"""{CONVERSIONS}
{DEVICE_FUNCTIONS}
{_HELPERS}
typedef {"long long" if epilogue.wide_index else "int"} idx_t;

{compute_function(epilogue)}
__device__ __forceinline__ void sk_mma(float* c, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {{
  asm volatile("{mma}"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}}

extern "C" __global__ void __launch_bounds__({launch.threads}) {name}({", ".join(params)}) {{
  const int warp = threadIdx.x / {WARP}, lane = threadIdx.x % {WARP}, g = lane / 4, q = lane % 4;
  const int row0 = blockIdx.x * {TILE_ROWS};
  const bool lo_ok = row0 + g < {plan.rows}, hi_ok = row0 + g + 8 < {plan.rows};
  const u16* lo = reinterpret_cast<const u16*>(in{plan.matrix.input}) + (long long)(row0 + g) * {m_row};
  const u16* hi = lo + 8LL * {m_row};
{vector_pointers}
  float {", ".join(f"acc{t}[4] = {{0.f, 0.f, 0.f, 0.f}}" for t in range(n_tiles))};
  // k0: this lane's first element of k in a step. Each step's products take what the step before
  // loaded (the first's, loaded here), while its own loads fetch the next: a warp's product never
  // waits on a load it has just issued. The loop's bound is the warp's, as mma.sync needs every lane.
  int k0 = warp * {STEP * u} + 8 * q;
  {nl[:-2].join(loads)}
  {nl[:-2].join(f"uint4 {n} = {n}_next;" for n in names)}
  for (int base = warp * {STEP * u}; base < {k}; base += {launch.warps * STEP * u}) {{
    k0 = base + {launch.warps * STEP * u} + 8 * q;
    {nl.join(loads)}
    {nl.join(products)}
    {nl.join(f"{n} = {n}_next;" for n in names)}
  }}
  __shared__ float part[{launch.warps}][{4 * n_tiles}][{WARP}];
#pragma unroll
  for (int e = 0; e < 4; ++e) {{
    {nl.join(f"part[warp][{4 * t} + e][lane] = acc{t}[e];" for t in range(n_tiles))}
  }}
  __syncthreads();
  // output (row r of the tile, vector j): C's element (g, 2q + j % 2) or (g + 8, ...) of lane g * 4 + q
  for (int o = threadIdx.x; o < {TILE_ROWS * TILE_VECTORS * n_tiles}; o += {launch.threads}) {{
    const int r = o % {TILE_ROWS}, j = o / {TILE_ROWS}, row = row0 + r;
    const int slot = (j / 8) * 4 + (r / 8) * 2 + j % 2, from = (r % 8) * 4 + (j % 8) / 2;
    float s = part[0][slot][from];
    for (int w = 1; w < {launch.warps}; ++w) s += part[w][slot][from];
    if (row < {plan.rows} && j < {plan.vectors}) {{
      const idx_t i = (idx_t)row * {o_row} + (idx_t)j * {o_vec};
      {(nl + "  ").join(element)}
    }}
  }}
}}
"""
