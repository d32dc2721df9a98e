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
"""
from __future__ import annotations

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
from skills.rows.codegen import Launch  # noqa: E402
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
KERNELS = r'''
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
__device__ __forceinline__ float2 merge(float2 a, float2 b) {
  const float m = fmaxf(a.x, b.x);
  if (m == NEG_INF) return a;  // both empty
  return make_float2(m, a.y * ex2((a.x - m) * L2E) + b.y * ex2((b.x - m) * L2E));
}
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


def defines(dtype: str, **extra) -> dict:
    threads, split, width, per_sm = SHAPES[dtype]
    return {"E": "bf16" if dtype == "bf16" else "float", "VW": width, "THREADS": threads, "SPLIT": split,
            "NV": ROW_LENGTH // split // threads // width, "MINB": per_sm, "ROWS": ROWS, "ROWLEN": ROW_LENGTH,
            "G": 1, "SYNC": 0, "GRIDSYNC": 0, "ONLINE": 0, **extra}


def kernel_source(dtype: str, **extra) -> str:
    return "".join(f"#define {k} {v}\n" for k, v in defines(dtype, **extra).items()) + KERNELS


def variant_model(dtype: str, kernel: str, extra: dict, cooperative: bool):
    """The variant as a launch-op model of (x, counters) -> y."""
    x = TensorSpec((ROWS, ROW_LENGTH), (ROW_LENGTH, 1), "bfloat16" if dtype == "bf16" else "float32", "cuda")
    counters = TensorSpec((ROWS,), (1,), "int32", "cuda")
    threads, split, _, _ = SHAPES[dtype]
    args = (Arg.input(0), Arg.input(1), Arg.output(0), Arg.workspace(8 * ROWS * split * 4))
    launch = KernelLaunch.compile(kernel_source(dtype, **extra), kernel, grid=ROWS * split, block=threads, args=args,
                                  cooperative=cooperative)
    return launch_spec_model(LaunchSpec(inputs=(x, counters), outputs=(x,), kernels=(launch,)))()


def main(mode: str, dtype: str) -> None:
    (problem,) = select(only=["softmax_long_rows"])
    model, inputs = build(problem, dtype, "cpu", small=False)
    (task,) = [t.on_device("cuda") for t in tasks_of(trace_tasks(model, inputs, backward=False, min_ops=1))]
    x = (torch.randn(ROWS, ROW_LENGTH, device="cuda") * 2).to(torch.bfloat16 if dtype == "bf16" else torch.float32)
    expected = torch.softmax(x.float(), -1).to(x.dtype)
    plan = build_plan(task, True)
    threads, split, width, _ = SHAPES[dtype]
    generated = Launch(threads, 1, width, split=split)
    fns = plan_contenders([("generated:" + tag(plan, generated), plan, generated)], [x], (expected,), atol=1e-5)
    for label, (kernel, extra, cooperative) in VARIANTS.items():
        counters = torch.zeros(ROWS, dtype=torch.int32, device="cuda")  # each variant its own arrivals
        try:
            model = variant_model(dtype, kernel, extra, cooperative)
            for _ in range(3):  # the counters' rounds too
                out = model(x, counters)
                torch.cuda.synchronize()
                if kernel == "pipe":
                    assert torch.allclose(out.float(), expected.float(), rtol=2e-2, atol=1e-6), "differs from softmax"
                elif kernel == "copy":
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
    for d in sys.argv[2:]:
        main(sys.argv[1], d)
