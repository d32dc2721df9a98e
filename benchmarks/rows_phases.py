"""Where the split softmax of 16 x 393216 (benchmarks/suite: softmax_long_rows) spends its time
against a copy, and whether overlapping one group of rows' stores with the next group's loads
helps. Hand-written kernels on the generated kernel's grid, all through the launch op,
triton.testing.do_bench, the least of 5 interleaved rounds (`bench`); `ncu` mode runs each once
for the profiler. On an H200, 2026-11-26:
benchmarks/results/phase_probe-h200-torch2.11-2026-11-26-twentythird.txt.

    python benchmarks/rows_phases.py bench bf16 fp32
    ncu --kernel-name regex:"pipe|copy|rows_" python benchmarks/rows_phases.py ncu bf16

- copy: each thread loads its slice of the row (the generated kernel's vectors), then stores it:
  no math, no barrier; copy-sync: a grid.sync() between; copy-plain: not a cooperative launch.
- empty-*: the launch alone, cooperative with a grid.sync() or plain.
- pipe-G<g>: softmax over g groups of rows, each block a slice of a row of every group: it loads
  group k + 1 while waiting for group k's row to be summed, then stores group k (a barrier a row:
  a counter that every launch adds as many arrivals to, so it needs no zeroing);
  -gridsync: grid.sync() for the barrier; -online: each vector's max and terms as it arrives (as
  the generated kernel does), not the max of the whole slice first.
- tma-*: the row over a cluster of 8 blocks, one block an SM, each block's slice into shared
  memory by bulk copies (cp.async.bulk, mbarriers): tma-copy stores each chunk as it lands;
  tma-softmax takes each thread's vectors into registers as they land (online max and sum), the
  row's pair over the cluster through distributed shared memory, and stores by bulk copies
  (-st: each thread its own stores; -nch8: 8 chunks a block; -t256: 256 threads).
- gen-G<g>: the generated kernel's own code (its preamble, its stats, grid.sync) over g groups of
  rows: every group's slice loaded first, then each group's stats, grid.sync and stores in turn.
  The twenty-fourth session's runs (neither beat the generated kernel):
  benchmarks/results/phase_probe-h200-torch2.11-2026-11-26-twentyfourth.txt.

    python benchmarks/rows_phases.py bench bf16 fp32 --only copy,tma,gen

It also times benchmarks/rows_stagger.py's kernels (a layout where each block holds a slice of
every row): `--only copy,stagger,warp`.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

from agent_backend.env.launch_op import launch_spec_model  # noqa: E402
from agent_backend.env.launch_spec import Arg, KernelLaunch, LaunchSpec  # noqa: E402
from agent_backend.explain import tasks_of, trace_tasks  # noqa: E402
from agent_backend.specs import TensorSpec  # noqa: E402
from benchmarks.rows_plans import bench_beside_inductor_and_copy, plan_contenders  # noqa: E402
from benchmarks.suite.problem import build  # noqa: E402
from benchmarks.suite.registry import select  # noqa: E402
from skills.rows.candidates import tag  # noqa: E402
from skills.rows.codegen import Launch, kernel_source as generated_source  # noqa: E402
from skills.rows.plan import build_plan  # noqa: E402

ROWS, ROW_LENGTH = 16, 393216
# the generated kernel's launch: threads, blocks a row, elements a vector, blocks an SM
SHAPES = {"bf16": (256, 16, 8, 2), "fp32": (128, 32, 4, 4)}
VARIANTS = {  # label: kernel, defines, cooperative
    "copy": ("copy", {}, True), "copy-sync": ("copy", {"SYNC": 1}, True), "copy-plain": ("copy", {}, False),
    "empty-coop-sync": ("empty", {"SYNC": 1}, True), "empty-plain": ("empty", {}, False),
    "pipe-G1": ("pipe", {"G": 1}, True), "pipe-G2": ("pipe", {"G": 2}, True), "pipe-G4": ("pipe", {"G": 4}, True),
    "pipe-G2-gridsync": ("pipe", {"G": 2, "GRIDSYNC": 1}, True),
    "pipe-G1-online": ("pipe", {"G": 1, "ONLINE": 1}, True), "pipe-G2-online": ("pipe", {"G": 2, "ONLINE": 1}, True),
    "pipe-G4-online": ("pipe", {"G": 4, "ONLINE": 1}, True),
}
# Both sources' types and helpers (each compiled with its own defines: E, VW, ...)
COMMON = r"""
#include <cooperative_groups.h>
namespace cg = cooperative_groups;
struct bf16 { unsigned short bits; };
template <typename T, int N> struct alignas(sizeof(T) * N) Vec { T v[N]; };
__device__ __forceinline__ float tof(float x) { return x; }
__device__ __forceinline__ float tof(bf16 h) { return __uint_as_float(((unsigned)h.bits) << 16); }
__device__ __forceinline__ void fromf(float f, float& o) { o = f; }
__device__ __forceinline__ void fromf(float f, bf16& o) { asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(o.bits) : "f"(f)); }
__device__ __forceinline__ float ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
#define L2E 1.44269504088896341f
#define NEG_INF __int_as_float(0xff800000)
typedef Vec<E, VW> V;
// two (max, sum of exp(x - max)) pairs as one
__device__ __forceinline__ float2 merge(float2 a, float2 b) {
  const float m = fmaxf(a.x, b.x);
  if (m == NEG_INF) return a;  // both empty
  return make_float2(m, a.y * ex2((a.x - m) * L2E) + b.y * ex2((b.x - m) * L2E));
}
"""
KERNELS = COMMON + r'''

extern "C" __global__ void __launch_bounds__(THREADS, MINB)
copy(const E* __restrict__ in, int* cnt, E* __restrict__ out, float2* ws) {
  const int t = threadIdx.x;
  const long base = (long)(blockIdx.x / SPLIT) * ROWLEN + (long)(blockIdx.x % SPLIT) * (NV * THREADS * VW);
  V b[NV];
  #pragma unroll
  for (int e = 0; e < NV; ++e) b[e] = *reinterpret_cast<const V*>(in + base + (e * THREADS + t) * VW);
#if SYNC
  cg::this_grid().sync();
#endif
  #pragma unroll
  for (int e = 0; e < NV; ++e) *reinterpret_cast<V*>(out + base + (e * THREADS + t) * VW) = b[e];
}

extern "C" __global__ void empty(const E* __restrict__ in, int* cnt, E* __restrict__ out, float2* ws) {
#if SYNC
  cg::this_grid().sync();
#endif
}

// (m, s) of a block: each thread's online pair merged by shuffles and shared memory
__device__ float2 block_pair(float2 p, float2* red) {
  #pragma unroll
  for (int k = 16; k > 0; k >>= 1)
    p = merge(p, make_float2(__shfl_xor_sync(~0u, p.x, k), __shfl_xor_sync(~0u, p.y, k)));
  const int t = threadIdx.x;
  if (t % 32 == 0) red[t / 32] = p;
  __syncthreads();
  p = red[0];
  for (int w = 1; w < THREADS / 32; ++w) p = merge(p, red[w]);
  __syncthreads();
  return p;
}

#define NH (NV / G)
#define RPG (ROWS / G)          // rows a group
#define BPR (SPLIT * G)         // blocks a row within a group
extern "C" __global__ void __launch_bounds__(THREADS, MINB)
pipe(const E* __restrict__ in, int* cnt, E* __restrict__ out, float2* ws) {
  __shared__ float2 red[THREADS / 32];
  __shared__ int target_s;
  const int t = threadIdx.x;
  const int piece = blockIdx.x % BPR;
  V b[2][NH];
  float2 fin;
  #pragma unroll
  for (int g = 0; g <= G; ++g) {
    if (g < G) {  // load group g, its block pair, publish, arrive
      const int row = g * RPG + blockIdx.x / BPR;
      const long base = (long)row * ROWLEN + (long)piece * (NH * THREADS * VW);
      #pragma unroll
      for (int e = 0; e < NH; ++e) b[g & 1][e] = *reinterpret_cast<const V*>(in + base + (e * THREADS + t) * VW);
    }
    if (g > 0) {  // wait for group g-1's row, store it
      const int row = (g - 1) * RPG + blockIdx.x / BPR;
#if GRIDSYNC
      cg::this_grid().sync();
#else
      if (t == 0) {
        const int target = target_s;
        int spins = 0;
        while (true) {
          int now;
          asm volatile("ld.acquire.gpu.global.s32 %0, [%1];" : "=r"(now) : "l"(cnt + row));
          if (now - target >= 0 || ++spins > (1 << 24)) break;  // a probe must not hang
          __nanosleep(32);
        }
      }
      __syncthreads();
#endif
      float2 p = make_float2(NEG_INF, 0.f);
      for (int k = t; k < BPR; k += THREADS) p = merge(p, __ldcg(&ws[row * BPR + k]));
      fin = block_pair(p, red);
      const float rs = 1.0f / fin.y;
      const long base = (long)row * ROWLEN + (long)piece * (NH * THREADS * VW);
      #pragma unroll
      for (int e = 0; e < NH; ++e) {
        V y;
        #pragma unroll
        for (int v = 0; v < VW; ++v) fromf(ex2((tof(b[(g - 1) & 1][e].v[v]) - fin.x) * L2E) * rs, y.v[v]);
        *reinterpret_cast<V*>(out + base + (e * THREADS + t) * VW) = y;
      }
    }
    if (g < G) {
      const int row = g * RPG + blockIdx.x / BPR;
      float m = NEG_INF;
      float s = 0.f;
#if ONLINE  // each vector as it arrives: its max, the sum rescaled where the max grew, its terms
      #pragma unroll
      for (int e = 0; e < NH; ++e) {
        float vm = m;
        #pragma unroll
        for (int v = 0; v < VW; ++v) vm = fmaxf(vm, tof(b[g & 1][e].v[v]));
        if (vm != m) s *= ex2((m - vm) * L2E);
        m = vm;
        #pragma unroll
        for (int v = 0; v < VW; ++v) s += ex2((tof(b[g & 1][e].v[v]) - m) * L2E);
      }
#else  // the max of every vector held, then the sum
      #pragma unroll
      for (int e = 0; e < NH; ++e)
        #pragma unroll
        for (int v = 0; v < VW; ++v) m = fmaxf(m, tof(b[g & 1][e].v[v]));
      #pragma unroll
      for (int e = 0; e < NH; ++e)
        #pragma unroll
        for (int v = 0; v < VW; ++v) s += ex2((tof(b[g & 1][e].v[v]) - m) * L2E);
#endif
      const float2 p = block_pair(make_float2(m, s), red);
      if (t == 0) {
        ws[row * BPR + piece] = p;
#if !GRIDSYNC
        __threadfence();
        const int old = atomicAdd(cnt + row, 1);
        target_s = (old / BPR + 1) * BPR;
#endif
      }
    }
  }
}
'''

TMA_KERNELS = COMMON + r"""
#define SLICE (ROWLEN / C)            // elements a block
#define CHUNK (SLICE / NCH)           // elements a bulk copy
#define NVC (CHUNK / VW / THREADS)    // vectors a thread a chunk
static_assert(NVC * VW * THREADS * NCH * C == ROWLEN, "the row splits evenly");

__device__ __forceinline__ unsigned saddr(const void* p) { return (unsigned)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void wait_phase0(unsigned long long* bar) {
  unsigned done;
  do {
    asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], 0; selp.u32 %0, 1, 0, p; }"
                 : "=r"(done) : "r"(saddr(bar)) : "memory");
  } while (!done);
}
// thread 0: every chunk of this block's slice on its way into shared memory, a barrier each
__device__ __forceinline__ void load_all(const E* src, E* sm, unsigned long long* bar) {
  if (threadIdx.x == 0) {
    for (int c = 0; c < NCH; ++c)
      asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"(saddr(bar + c)));
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    for (int c = 0; c < NCH; ++c) {
      asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;"
                   :: "r"(saddr(bar + c)), "r"((unsigned)(CHUNK * sizeof(E))) : "memory");
      asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                   :: "r"(saddr(sm + c * CHUNK)), "l"(src + c * CHUNK), "r"((unsigned)(CHUNK * sizeof(E))),
                      "r"(saddr(bar + c)) : "memory");
    }
  }
  __syncthreads();  // the barriers are initialised before anyone waits on them
}
// chunk c of shared memory out to global memory, once every thread's writes to it are done
__device__ __forceinline__ void store_chunk(E* dst, E* sm, int c) {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
  __syncthreads();
  if (threadIdx.x == 0) {
    asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;"
                 :: "l"(dst + c * CHUNK), "r"(saddr(sm + c * CHUNK)), "r"((unsigned)(CHUNK * sizeof(E))) : "memory");
    asm volatile("cp.async.bulk.commit_group;" ::: "memory");
  }
}
__device__ __forceinline__ void stores_read() {
  if (threadIdx.x == 0) asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
}

// each chunk stored as soon as it arrives: a copy through shared memory by the copy engine
extern "C" __global__ void __launch_bounds__(THREADS, 1)
tma_copy(const E* __restrict__ in, int* cnt, E* __restrict__ out, float2* ws) {
  extern __shared__ __align__(128) unsigned char smem[];
  __shared__ __align__(8) unsigned long long bar[NCH];
  E* sm = reinterpret_cast<E*>(smem);
  const long base = (long)blockIdx.x * SLICE;
  load_all(in + base, sm, bar);
  for (int c = 0; c < NCH; ++c) {
    wait_phase0(bar + c);
    store_chunk(out + base, sm, c);
  }
  stores_read();
}

// softmax: the slice into shared memory by bulk copies, each thread's vectors into registers as
// they arrive (online max and sum), the row's pair over the cluster through distributed shared
// memory, the results written back in place and stored by bulk copies a chunk at a time
// (BULK_STORE 0: each thread stores its own vectors)
extern "C" __global__ void __launch_bounds__(THREADS, 1)
tma_softmax(const E* __restrict__ in, int* cnt, E* __restrict__ out, float2* ws) {
  extern __shared__ __align__(128) unsigned char smem[];
  __shared__ __align__(8) unsigned long long bar[NCH];
  __shared__ float2 red[THREADS / 32];
  __shared__ float2 mine, fin;
  E* sm = reinterpret_cast<E*>(smem);
  const int t = threadIdx.x;
  const long base = (long)blockIdx.x * SLICE;
  load_all(in + base, sm, bar);
  V b[NCH * NVC];
  float m = NEG_INF, s = 0.f;
  #pragma unroll
  for (int c = 0; c < NCH; ++c) {
    wait_phase0(bar + c);
    #pragma unroll
    for (int e = 0; e < NVC; ++e) {
      V x = reinterpret_cast<const V*>(sm + c * CHUNK)[e * THREADS + t];
      b[c * NVC + e] = x;
      float vm = m;
      #pragma unroll
      for (int v = 0; v < VW; ++v) vm = fmaxf(vm, tof(x.v[v]));
      if (vm != m) s *= ex2((m - vm) * L2E);
      m = vm;
      #pragma unroll
      for (int v = 0; v < VW; ++v) s += ex2((tof(x.v[v]) - m) * L2E);
    }
  }
  float2 p = make_float2(m, s);
  #pragma unroll
  for (int k = 16; k > 0; k >>= 1)
    p = merge(p, make_float2(__shfl_xor_sync(~0u, p.x, k), __shfl_xor_sync(~0u, p.y, k)));
  if (t % 32 == 0) red[t / 32] = p;
  __syncthreads();
  if (t == 0) {
    for (int w = 1; w < THREADS / 32; ++w) p = merge(p, red[w]);
    mine = p;
  }
  cg::cluster_group cluster = cg::this_cluster();
  cluster.sync();  // every block's pair is written
  if (t < 32) {
    p = t < C ? *cluster.map_shared_rank(&mine, t) : make_float2(NEG_INF, 0.f);
    #pragma unroll
    for (int k = 16; k > 0; k >>= 1)
      p = merge(p, make_float2(__shfl_xor_sync(~0u, p.x, k), __shfl_xor_sync(~0u, p.y, k)));
    if (t == 0) fin = p;
  }
  asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");  // done reading the others
  __syncthreads();
  const float mx = fin.x, rs = 1.0f / fin.y;
  #pragma unroll
  for (int c = 0; c < NCH; ++c) {
    #pragma unroll
    for (int e = 0; e < NVC; ++e) {
      V y;
      #pragma unroll
      for (int v = 0; v < VW; ++v) fromf(ex2((tof(b[c * NVC + e].v[v]) - mx) * L2E) * rs, y.v[v]);
#if BULK_STORE
      reinterpret_cast<V*>(sm + c * CHUNK)[e * THREADS + t] = y;
#else
      reinterpret_cast<V*>(out + base + c * CHUNK)[e * THREADS + t] = y;
#endif
    }
#if BULK_STORE
    store_chunk(out + base, sm, c);
#endif
  }
  stores_read();
  asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");  // no block leaves while read
}
"""
# TMA variants: threads a block, blocks a row (one cluster), bulk copies a block
TMA_SHAPES = {"bf16": (512, 8, 4), "fp32": (512, 8, 4)}
TMA_VARIANTS = {  # label: kernel, defines
    "tma-copy": ("tma_copy", {}), "tma-softmax": ("tma_softmax", {"BULK_STORE": 1}),
    "tma-softmax-st": ("tma_softmax", {"BULK_STORE": 0}),
    "tma-softmax-nch8": ("tma_softmax", {"BULK_STORE": 1, "NCH": 8, "THREADS": 256}),
    "tma-softmax-t256": ("tma_softmax", {"BULK_STORE": 1, "THREADS": 256}),
}
ONE_BLOCK_AN_SM = 120 * 1024  # dynamic shared memory no two blocks of one SM can both have


def tma_source(dtype: str, **extra) -> str:
    threads, cluster, chunks = TMA_SHAPES[dtype]
    values = {"E": "bf16" if dtype == "bf16" else "float", "VW": 8 if dtype == "bf16" else 4,
              "THREADS": threads, "C": cluster, "NCH": chunks, "ROWLEN": ROW_LENGTH, "BULK_STORE": 1, **extra}
    return "".join(f"#define {k} {v}\n" for k, v in values.items()) + TMA_KERNELS


def probe_model(dtype: str, source: str, kernel: str, grid: int, block: int, workspace: int, **launch):
    """Kernel `kernel` of `source` as a launch-op model of (x, counters) -> y over the 16 x 393216
    rows in `dtype`: its arguments x, the counters, y and `workspace` bytes of scratch; `launch`:
    KernelLaunch.compile's cluster, shared memory or cooperative launch."""
    x = TensorSpec((ROWS, ROW_LENGTH), (ROW_LENGTH, 1), "bfloat16" if dtype == "bf16" else "float32", "cuda")
    counters = TensorSpec((ROWS,), (1,), "int32", "cuda")
    args = (Arg.input(0), Arg.input(1), Arg.output(0), Arg.workspace(workspace))
    compiled = KernelLaunch.compile(source, kernel, grid=grid, block=block, args=args, **launch)
    return launch_spec_model(LaunchSpec(inputs=(x, counters), outputs=(x,), kernels=(compiled,)))()


def tma_model(dtype: str, kernel: str, extra: dict):
    """A TMA variant as a launch-op model of (x, counters) -> y: a cluster of blocks a row, one
    block an SM, the block's slice of the row in dynamic shared memory."""
    threads, cluster, _ = TMA_SHAPES[dtype]
    slice_bytes = ROW_LENGTH // cluster * (2 if dtype == "bf16" else 4)
    return probe_model(dtype, tma_source(dtype, **extra), kernel, ROWS * cluster, extra.get("THREADS", threads), 8,
                       cluster=cluster, shared_mem=max(slice_bytes, ONE_BLOCK_AN_SM))

# The generated kernel's code as it was (its preamble, online stats in double, grid.sync), its rows in G
# groups: each block holds a slice of one row of every group, all loaded first; then for each
# group in turn its stats, a grid.sync, its stores (which overlap the next group's stats).
GEN_GROUPS_KERNEL = r"""
#include <cooperative_groups.h>
namespace cg = cooperative_groups;
__device__ __forceinline__ float ld_f(float x) { return x; }
__device__ __forceinline__ float ld_f(bf16 h) { return bf16_to_float(h); }
__device__ __forceinline__ void st_f(float f, float& o) { o = f; }
__device__ __forceinline__ void st_f(float f, bf16& o) { o = float_to_bf16(f); }
#define NBLK (ROWS * SPLIT)
#define NH (ROWLEN / SPLIT / THREADS / VW / G)  // vectors a thread a group
#define RPG (ROWS / G)
#define BPR (SPLIT * G)
#define NW (THREADS / 32)
// the block's (max, sum of exps) pair: shuffles, then a slot a warp (`m`, `s`)
__device__ __forceinline__ void fold_block(float& acc2, double& acc5, float* m, double* s) {
  const int t = threadIdx.x;
  #pragma unroll
  for (int k = 16; k > 0; k >>= 1) {
    const float om = __shfl_xor_sync(0xffffffffu, acc2, k);
    const double os = __shfl_xor_sync(0xffffffffu, acc5, k);
    const float to = pw_maximum(acc2, om);
    acc5 = rows_online_rescale(acc5, acc2, to) + rows_online_rescale(os, om, to);
    acc2 = to;
  }
  if (t % 32 == 0) { m[t / 32] = acc2; s[t / 32] = acc5; }
  __syncthreads();
  acc2 = m[0];
  for (int w = 1; w < NW; ++w) acc2 = pw_maximum(acc2, m[w]);
  acc5 = rows_online_rescale(s[0], m[0], acc2);
  for (int w = 1; w < NW; ++w) acc5 += rows_online_rescale(s[w], m[w], acc2);
}
extern "C" __global__ void __launch_bounds__(THREADS, MINB)
gen_groups(const E* __restrict__ in0, int* cnt, E* __restrict__ out0, unsigned char* ws) {
  cg::grid_group grid = cg::this_grid();
  const int t = threadIdx.x;
  const int piece = blockIdx.x % BPR;
  float* ws0 = reinterpret_cast<float*>(ws);
  double* ws1 = reinterpret_cast<double*>(ws + 4 * NBLK * G);
  __shared__ float red0[G][NW];
  __shared__ double red1[G][NW];
  Vec<E, VW> buf[G][NH];
  #pragma unroll
  for (int g = 0; g < G; ++g) {
    const idx_t base = (idx_t)(g * RPG + blockIdx.x / BPR) * ROWLEN + (idx_t)piece * (NH * THREADS * VW);
    #pragma unroll
    for (int e = 0; e < NH; ++e) buf[g][e] = *reinterpret_cast<const Vec<E, VW>*>(in0 + base + (e * THREADS + t) * VW);
  }
  #pragma unroll
  for (int g = 0; g < G; ++g) {
    float acc2 = (-__uint_as_float(0x7f800000u));
    double acc5 = 0.0;
    #pragma unroll
    for (int e = 0; e < NH; ++e) {
      const float from = acc2;
      float y[VW];
      #pragma unroll
      for (int v = 0; v < VW; ++v) { y[v] = ld_f(buf[g][e].v[v]); acc2 = pw_maximum(acc2, y[v]); }
      if (acc2 != from) acc5 *= (double)pw_exp_fast_ftz(from - acc2);
      const float b = fmaxf(acc2, -3.40282347e+38f);
      float terms = 0.0f;
      #pragma unroll
      for (int v = 0; v < VW; ++v) terms += pw_exp_fast_ftz(y[v] - b);
      acc5 += (double)terms;
    }
    fold_block(acc2, acc5, red0[g], red1[g]);
    if (t == 0) { ws0[g * NBLK + blockIdx.x] = acc2; ws1[g * NBLK + blockIdx.x] = acc5; }
    grid.sync();
    const int first = g * NBLK + (blockIdx.x / BPR) * BPR;
    acc2 = (-__uint_as_float(0x7f800000u));
    for (int k = t; k < BPR; k += THREADS) acc2 = pw_maximum(acc2, __ldcg(&ws0[first + k]));
    acc5 = 0.0;
    for (int k = t; k < BPR; k += THREADS)
      acc5 += rows_online_rescale(__ldcg(&ws1[first + k]), __ldcg(&ws0[first + k]), acc2);
    fold_block(acc2, acc5, red0[g], red1[g]);  // its slots read before the grid.sync
    const float mx = acc2;
    const float rcp0 = pw_div_fast(1.0f, rows_online_sum(acc5, acc2));
    const idx_t base = (idx_t)(g * RPG + blockIdx.x / BPR) * ROWLEN + (idx_t)piece * (NH * THREADS * VW);
    #pragma unroll
    for (int e = 0; e < NH; ++e) {
      Vec<E, VW> o;
      #pragma unroll
      for (int v = 0; v < VW; ++v) st_f(pw_exp_fast(ld_f(buf[g][e].v[v]) - mx) * rcp0, o.v[v]);
      *reinterpret_cast<Vec<E, VW>*>(out0 + base + (e * THREADS + t) * VW) = o;
    }
  }
}
"""
GEN_GROUPS = (1, 2, 4)  # gen-G<g>


def generated_plan(dtype: str) -> tuple[object, Launch]:
    """The softmax_long_rows task's online plan and the generated kernel's launch (SHAPES)."""
    (problem,) = select(only=["softmax_long_rows"])
    model, inputs = build(problem, dtype, "cpu", small=False)
    (task,) = [t.on_device("cuda") for t in tasks_of(trace_tasks(model, inputs, backward=False, min_ops=1))]
    threads, split, width, _ = SHAPES[dtype]
    return build_plan(task, True), Launch(threads, 1, width, split=split)


def generated_preamble(plan, launch: Launch) -> str:
    """The generated kernel's source up to the kernel itself: its types and helpers."""
    return generated_source(plan, "k", launch).split('extern "C"')[0]


def gen_groups_source(dtype: str, groups: int, preamble: str) -> str:
    """gen_groups over `groups` groups of rows, after `preamble`: the generated source's helpers."""
    threads, split, width, per_sm = SHAPES[dtype]
    values = {"E": "bf16" if dtype == "bf16" else "float", "VW": width, "THREADS": threads, "SPLIT": split,
              "MINB": per_sm, "ROWS": ROWS, "ROWLEN": ROW_LENGTH, "G": groups}
    return preamble + "".join(f"#define {k} {v}\n" for k, v in values.items()) + GEN_GROUPS_KERNEL


def gen_groups_model(dtype: str, groups: int, preamble: str):
    """gen_groups_source on the generated kernel's grid (SHAPES), as a launch-op model of
    (x, counters) -> y."""
    threads, split, _, _ = SHAPES[dtype]
    return probe_model(dtype, gen_groups_source(dtype, groups, preamble), "gen_groups", ROWS * split, threads,
                       12 * ROWS * split * groups, cooperative=True)


def defines(dtype: str, **extra) -> dict:
    threads, split, width, per_sm = SHAPES[dtype]
    return {"E": "bf16" if dtype == "bf16" else "float", "VW": width, "THREADS": threads, "SPLIT": split,
            "NV": ROW_LENGTH // split // threads // width, "MINB": per_sm, "ROWS": ROWS, "ROWLEN": ROW_LENGTH,
            "G": 1, "SYNC": 0, "GRIDSYNC": 0, "ONLINE": 0, **extra}


def kernel_source(dtype: str, **extra) -> str:
    return "".join(f"#define {k} {v}\n" for k, v in defines(dtype, **extra).items()) + KERNELS


def variant_model(dtype: str, kernel: str, extra: dict, cooperative: bool):
    """The variant as a launch-op model of (x, counters) -> y."""
    threads, split, _, _ = SHAPES[dtype]
    return probe_model(dtype, kernel_source(dtype, **extra), kernel, ROWS * split, threads, 8 * ROWS * split * 4,
                       cooperative=cooperative)


def main(mode: str, dtype: str, only: tuple[str, ...] = ()) -> None:
    from benchmarks.rows_stagger import stagger_variants  # it builds on this module's COMMON
    x = (torch.randn(ROWS, ROW_LENGTH, device="cuda") * 2).to(torch.bfloat16 if dtype == "bf16" else torch.float32)
    expected = torch.softmax(x.float(), -1).to(x.dtype)
    plan, generated = generated_plan(dtype)
    fns = plan_contenders([("generated:" + tag(plan, generated), plan, generated)], [x], (expected,), atol=1e-5)
    preamble = generated_preamble(plan, generated)
    variants = {**{k: (kern, lambda kern=kern, e=extra, c=coop: variant_model(dtype, kern, e, c))
                   for k, (kern, extra, coop) in VARIANTS.items()},
                **{k: (kern, lambda kern=kern, e=extra: tma_model(dtype, kern, e))
                   for k, (kern, extra) in TMA_VARIANTS.items()},
                **{f"gen-G{g}": ("gen_groups", lambda g=g: gen_groups_model(dtype, g, preamble)) for g in GEN_GROUPS},
                **stagger_variants(dtype)}
    for label, (kernel, make) in variants.items():
        if only and not label.startswith(only):
            continue
        counters = torch.zeros(ROWS, dtype=torch.int32, device="cuda")  # each variant its own arrivals
        try:
            model = make()
            for _ in range(3):  # the counters' rounds too
                out = model(x, counters)
                torch.cuda.synchronize()
                if kernel in ("pipe", "tma_softmax", "gen_groups", "stagger"):
                    assert torch.allclose(out.float(), expected.float(), rtol=2e-2, atol=1e-6), "differs from softmax"
                elif kernel in ("copy", "tma_copy", "stagger-copy"):
                    assert torch.equal(out, x), "not a copy"
        except Exception as e:  # noqa: BLE001 - a variant may fail: say so, time the rest
            print(label, "failed:", str(e).splitlines()[0][:200], flush=True)
            continue
        print(f"{dtype} {label}: checked", file=sys.stderr, flush=True)
        fns[label] = (lambda m=model, c=counters: m(x, c))
    if mode == "ncu":
        for f in fns.values():
            f()
        torch.cuda.synchronize()
        return
    line = bench_beside_inductor_and_copy(fns, lambda a: torch.softmax(a, -1), [x], x, "torch-copy", rounds=5)
    print(dtype, torch.cuda.get_device_name(), line, flush=True)


if __name__ == "__main__":
    arguments = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    arguments.add_argument("mode", choices=("bench", "ncu"))
    arguments.add_argument("dtypes", nargs="+", choices=("bf16", "fp32"))
    arguments.add_argument("--only", default="", help="comma-separated label prefixes of the variants to run")
    options = arguments.parse_args()
    for d in options.dtypes:
        main(options.mode, d, tuple(p for p in options.only.split(",") if p))
