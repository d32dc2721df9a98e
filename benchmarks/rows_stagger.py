"""The 16 x 393216 softmax (benchmarks/suite: softmax_long_rows) on a layout other than the
generated kernel's: each block a slice of every row (the "stagger" layout: a thread one vector of
each row), all rows' loads in flight from the start. Hand-written kernels, timed by
benchmarks/rows_phases.py beside the generated kernel, Inductor and copies:

    python benchmarks/rows_phases.py bench bf16 fp32 --only copy,stagger,warp

- stagger-copy: each row stored as it lands (no exchange); -copy-sync: a grid.sync() between
  every row loaded and any stored (the generated kernel's order on this layout).
- stagger-D<d>: the rows finished in order, row r - d's results stored after row r's pair is
  published (a counter a row, a fence and an atomic each), so early rows' stores overlap later
  rows' loads; -E<d>: the pairs as epoch-tagged words instead (no fence, no counter a row);
  -G<g>D<d>: the rows in groups of g a step (their folds side by side), -nowait: the wait skipped
  (its results wrong: timed only).
- warp-W*: each warp a part of one row (WPR warps a row a block), the pairs as epoch words;
  warp-grid-W*: one grid.sync() instead.
- stagger*-sync: the stagger layout with the generated kernel's one exchange: every row's pair,
  one grid.sync(), then each warp folds whole rows (staggerp-*, staggerp2-*: 96 or 192 blocks, so
  that a block's threads are a power of two, as the rows template's are).

On an H100, 2026-12-06: benchmarks/results/stagger_probe-h100-torch2.11-2026-12-06-thirtyfifth.txt.
"""
from __future__ import annotations

from benchmarks.rows_phases import COMMON, ROW_LENGTH, ROWS, probe_model

# Shared by the stagger kernels: a warp's pairs as one, a late conversion, and the epoch words.
STAGGER_HELPERS = r"""
__device__ __forceinline__ float2 warp_pair(float2 p) {
  #pragma unroll
  for (int k = 16; k > 0; k >>= 1)
    p = merge(p, make_float2(__shfl_xor_sync(~0u, p.x, k), __shfl_xor_sync(~0u, p.y, k)));
  return p;
}

// an element converted again where it is stored (asm volatile: not the copy the stats made, which
// would hold a float per element in registers where the row holds a half)
__device__ __forceinline__ float tof_late(float x) { return x; }
__device__ __forceinline__ float tof_late(bf16 h) {
  unsigned u;
  asm volatile("shl.b32 %0, %1, 16;" : "=r"(u) : "r"((unsigned)h.bits));
  return __uint_as_float(u);
}
// N vectors of a thread, `stride` elements apart from p, its first
template <int N> __device__ __forceinline__ void load_vectors(V (&x)[N], const E* p, long stride) {
  #pragma unroll
  for (int e = 0; e < N; ++e) x[e] = *reinterpret_cast<const V*>(p + e * stride);
}
template <int N> __device__ __forceinline__ float vectors_max(const V (&x)[N]) {
  float m = NEG_INF;
  #pragma unroll
  for (int e = 0; e < N; ++e)
    #pragma unroll
    for (int v = 0; v < VW; ++v) m = fmaxf(m, tof(x[e].v[v]));
  return m;
}
// the sum of exp(x - m) over the vectors
template <int N> __device__ __forceinline__ float vectors_sum_below(const V (&x)[N], float m) {
  float s = 0.f;
  #pragma unroll
  for (int e = 0; e < N; ++e)
    #pragma unroll
    for (int v = 0; v < VW; ++v) s += ex2((tof(x[e].v[v]) - m) * L2E);
  return s;
}
// softmax's results of the vectors, exp(x - mx) * rs, stored as load_vectors loaded them
template <int N> __device__ __forceinline__ void store_softmax(E* p, const V (&x)[N], long stride, float mx, float rs) {
  #pragma unroll
  for (int e = 0; e < N; ++e) {
    V y;
    #pragma unroll
    for (int v = 0; v < VW; ++v) fromf(ex2((tof_late(x[e].v[v]) - mx) * L2E) * rs, y.v[v]);
    *reinterpret_cast<V*>(p + e * stride) = y;
  }
}
__device__ __forceinline__ unsigned long long ld_word(const unsigned long long* p) {
  unsigned long long v;
  asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p));
  return v;
}
__device__ __forceinline__ unsigned long long word(unsigned epoch, float f) {
  return ((unsigned long long)epoch << 32) | __float_as_uint(f);
}
// this launch's epoch (never 0): a ticket of the counter each of the NB blocks takes one of
__device__ __forceinline__ unsigned epoch_ticket(int* cnt) { return (unsigned)atomicAdd(cnt, 1) / NB + 1; }
"""
# The layout every stagger kernel (but stagger_warp) builds on: each block a slice of every row,
# a thread NPR vectors of each.
STAGGER_LAYOUT = COMMON + STAGGER_HELPERS + r"""
#define S (ROWLEN / NB)         // elements of each row a block holds
#define NPR (S / THREADS / VW)  // vectors a thread a row
#define NW (THREADS / 32)
#define SLOTS (NB / 32)         // a lane's blocks of a row, where a warp reads a row's pairs
static_assert(NPR * THREADS * VW * NB == ROWLEN, "the rows split evenly");

// what a block's threads share: each warp's pair of each row, each row's (max, 1 / sum), the epoch
struct Shared {
  float2 red[ROWS][NW];
  float2 fin[ROWS];
  unsigned epoch;
};
// the block's slice of every row (from `off` on), a vector of each a thread
__device__ __forceinline__ void load_rows(V (&b)[ROWS][NPR], const E* in, long off) {
  #pragma unroll
  for (int r = 0; r < ROWS; ++r) load_vectors(b[r], in + r * (long)ROWLEN + off + threadIdx.x * VW, THREADS * VW);
}
// a warp's pairs of a row folded: its max and 1 / sum, which lane 0 sets
__device__ __forceinline__ void fold_to_fin(float2 p, float2& fin) {
  p = warp_pair(p);
  if (threadIdx.x % 32 == 0) fin = make_float2(p.x, 1.0f / p.y);
}
// row q's results from its (max, 1 / sum)
__device__ __forceinline__ void store_row(E* out, const V (&x)[NPR], long off, int q, float2 f) {
  store_softmax(out + q * (long)ROWLEN + off + threadIdx.x * VW, x, THREADS * VW, f.x, f.y);
}
// row q's results, once warp 0 has folded its blocks' pairs into p
__device__ __forceinline__ void finish_row(float2 p, Shared& sh, E* out, const V (&x)[NPR], long off, int q) {
  if (threadIdx.x < 32) fold_to_fin(p, sh.fin[q]);
  __syncthreads();
  store_row(out, x, off, q, sh.fin[q]);
}
"""
# Each block a slice of every row, all rows' loads in flight from the start, the rows finished in
# order: row r's pair published (a counter a row), then row r - D's pair awaited and its results
# stored, so early rows' stores overlap later rows' loads (COPY: each row stored as it lands).
STAGGER_COUNTER_KERNEL = r"""
extern "C" __global__ void __launch_bounds__(THREADS, MINB)
stagger(const E* __restrict__ in, int* cnt, E* __restrict__ out, float2* ws) {
  __shared__ Shared sh;
  __shared__ int target[ROWS];
  const int t = threadIdx.x;
  const long off = (long)blockIdx.x * S;
  V b[ROWS][NPR];
  load_rows(b, in, off);
  #pragma unroll
  for (int r = 0; r < ROWS + D; ++r) {
#if COPY
#if SYNC
    if (r == 0) cg::this_grid().sync();  // every row loaded before any is stored
#endif
    if (r < ROWS) {
      #pragma unroll
      for (int e = 0; e < NPR; ++e)
        *reinterpret_cast<V*>(out + r * (long)ROWLEN + off + (e * THREADS + t) * VW) = b[r][e];
    }
#else
    if (r < ROWS) {  // row r's pair: published, arrived
      const float m = vectors_max(b[r]), s = vectors_sum_below(b[r], m);
      float2 p = warp_pair(make_float2(m, s));
      if (t % 32 == 0) sh.red[r][t / 32] = p;
      __syncthreads();
      if (t == 0) {
        for (int w = 1; w < NW; ++w) p = merge(p, sh.red[r][w]);
        ws[r * NB + blockIdx.x] = p;
        __threadfence();
        target[r] = (atomicAdd(cnt + r, 1) / NB + 1) * NB;
      }
    }
    const int q = r - D;
    if (q >= 0) {  // row q's pair awaited, its results stored
      float2 p = make_float2(NEG_INF, 0.f);
      if (t < 32) {
        if (t == 0) {
          const int want = target[q];
          int spins = 0;
          while (true) {
            int now;
            asm volatile("ld.acquire.gpu.global.s32 %0, [%1];" : "=r"(now) : "l"(cnt + q));
            if (now - want >= 0 || ++spins > (1 << 24)) break;  // a probe must not hang
          }
        }
        __syncwarp();
        for (int k = t; k < NB; k += 32) p = merge(p, __ldcg(&ws[q * NB + k]));
      }
      finish_row(p, sh, out, b[q], off, q);
    }
#endif
  }
}
"""
# stagger's rows without fences or a counter a row: each block's pair of a row goes out as two
# 64-bit words, each a float beside the launch's epoch (a ticket from one counter at the start,
# over NB), read back until every word carries it; warp 0 loads row q's words before it folds row
# r, so they are on their way while it waits for its own data.
STAGGER_EPOCH_KERNEL = r"""
extern "C" __global__ void __launch_bounds__(THREADS, MINB)
stagger_epoch(const E* __restrict__ in, int* cnt, E* __restrict__ out, unsigned long long* ws) {
  __shared__ Shared sh;
  const int t = threadIdx.x;
  const long off = (long)blockIdx.x * S;
  V b[ROWS][NPR];
  load_rows(b, in, off);
  if (t == 0) sh.epoch = epoch_ticket(cnt);
  #pragma unroll
  for (int r = 0; r < ROWS + D; ++r) {
    const int q = r - D;
    unsigned long long got[SLOTS][2];
    if (q >= 0 && t < 32) {
      #pragma unroll
      for (int k = 0; k < SLOTS; ++k) {
        got[k][0] = ld_word(ws + ((long)q * NB + k * 32 + t) * 2);
        got[k][1] = ld_word(ws + ((long)q * NB + k * 32 + t) * 2 + 1);
      }
    }
    if (r < ROWS) {
      const float m = vectors_max(b[r]), s = vectors_sum_below(b[r], m);
      const float2 p = warp_pair(make_float2(m, s));
      if (t % 32 == 0) sh.red[r][t / 32] = p;
    }
    __syncthreads();
    const unsigned epoch = sh.epoch;
    if (r < ROWS && t == 0) {
      float2 p = sh.red[r][0];
      for (int w = 1; w < NW; ++w) p = merge(p, sh.red[r][w]);
      ws[((long)r * NB + blockIdx.x) * 2] = word(epoch, p.x);
      ws[((long)r * NB + blockIdx.x) * 2 + 1] = word(epoch, p.y);
    }
    if (q >= 0) {
      float2 p = make_float2(NEG_INF, 0.f);
      if (t < 32) {
        #pragma unroll
        for (int k = 0; k < SLOTS; ++k) {
          int spins = 0;
          while (((unsigned)(got[k][0] >> 32) != epoch || (unsigned)(got[k][1] >> 32) != epoch)
                 && ++spins < (1 << 22)) {  // a probe must not hang
            got[k][0] = ld_word(ws + ((long)q * NB + k * 32 + t) * 2);
            got[k][1] = ld_word(ws + ((long)q * NB + k * 32 + t) * 2 + 1);
          }
          p = merge(p, make_float2(__uint_as_float((unsigned)got[k][0]), __uint_as_float((unsigned)got[k][1])));
        }
      }
      finish_row(p, sh, out, b[q], off, q);
    }
  }
}
"""
# stagger_epoch over groups of G rows: each step folds a group's rows side by side (their shuffle
# chains interleaved, lane groups of warp 0 each one row's warp slots), and G warps await the
# group D steps back, a row each; one barrier a step for the folds, one for the results.
STAGGER_GROUP_KERNEL = r"""
#define GR (ROWS / G)  // groups
#define LPR (32 / G)   // lanes of warp 0 a row's warp slots
extern "C" __global__ void __launch_bounds__(THREADS, MINB)
stagger_group(const E* __restrict__ in, int* cnt, E* __restrict__ out, unsigned long long* ws) {
  __shared__ Shared sh;
  const int t = threadIdx.x, lane = t % 32, warp = t / 32;
  const long off = (long)blockIdx.x * S;
  V b[ROWS][NPR];
  load_rows(b, in, off);
  if (t == 0) sh.epoch = epoch_ticket(cnt);
  #pragma unroll
  for (int k = 0; k < GR + D; ++k) {
    const int qg = k - D;
    const bool poller = qg >= 0 && warp < G;
    const long slots = ((long)(qg * G + warp) * NB + lane) * 2;
    unsigned long long got[SLOTS][2];
    if (poller) {
      #pragma unroll
      for (int j = 0; j < SLOTS; ++j) {
        got[j][0] = ld_word(ws + slots + j * 64);
        got[j][1] = ld_word(ws + slots + j * 64 + 1);
      }
    }
    if (k < GR) {
      float m[G], s[G];
      #pragma unroll
      for (int g = 0; g < G; ++g) {
        m[g] = vectors_max(b[k * G + g]);
        s[g] = vectors_sum_below(b[k * G + g], m[g]);
      }
      #pragma unroll
      for (int o = 16; o > 0; o >>= 1)
        #pragma unroll
        for (int g = 0; g < G; ++g) {
          const float2 p = merge(make_float2(m[g], s[g]),
                                 make_float2(__shfl_xor_sync(~0u, m[g], o), __shfl_xor_sync(~0u, s[g], o)));
          m[g] = p.x;
          s[g] = p.y;
        }
      if (lane == 0) {
        #pragma unroll
        for (int g = 0; g < G; ++g) sh.red[k * G + g][warp] = make_float2(m[g], s[g]);
      }
    }
    __syncthreads();
    const unsigned epoch = sh.epoch;
    if (k < GR && warp == 0) {
      const int g = lane / LPR, j = lane % LPR;
      float2 p = make_float2(NEG_INF, 0.f);
      for (int w = j; w < NW; w += LPR) p = merge(p, sh.red[k * G + g][w]);
      #pragma unroll
      for (int o = LPR / 2; o > 0; o >>= 1)
        p = merge(p, make_float2(__shfl_xor_sync(~0u, p.x, o), __shfl_xor_sync(~0u, p.y, o)));
      if (j == 0) {
        ws[((long)(k * G + g) * NB + blockIdx.x) * 2] = word(epoch, p.x);
        ws[((long)(k * G + g) * NB + blockIdx.x) * 2 + 1] = word(epoch, p.y);
      }
    }
    if (qg >= 0) {
      if (poller) {
        float2 p = make_float2(NEG_INF, 0.f);
        #pragma unroll
        for (int j = 0; j < SLOTS; ++j) {
          int spins = 0;
          while (!NOWAIT && ((unsigned)(got[j][0] >> 32) != epoch || (unsigned)(got[j][1] >> 32) != epoch)
                 && ++spins < (1 << 22)) {  // a probe must not hang
            got[j][0] = ld_word(ws + slots + j * 64);
            got[j][1] = ld_word(ws + slots + j * 64 + 1);
          }
          p = merge(p, make_float2(__uint_as_float((unsigned)got[j][0]), __uint_as_float((unsigned)got[j][1])));
        }
        fold_to_fin(p, sh.fin[qg * G + warp]);
      }
      __syncthreads();
      #pragma unroll
      for (int g = 0; g < G; ++g) store_row(out, b[qg * G + g], off, qg * G + g, sh.fin[qg * G + g]);
    }
  }
}
"""
# Each warp a row's part (a block: a part of every row, WPR warps a row), the row's pair out as
# epoch words (stagger_epoch's) and read back by every warp of the row: no block barrier but the
# one that shares the epoch, each warp on its own once its row is summed.
STAGGER_WARP_KERNEL = r"""
#define NVW (ROWLEN / NB / WPR / 32 / VW)  // vectors a lane
#define PARTS (NB * WPR)                   // a row's parts, each a published pair
static_assert(NVW * 32 * VW * PARTS == ROWLEN && PARTS % 32 == 0, "the rows split evenly");
extern "C" __global__ void __launch_bounds__(ROWS * WPR * 32, MINB)
stagger_warp(const E* __restrict__ in, int* cnt, E* __restrict__ out, unsigned long long* ws) {
  __shared__ unsigned epoch_s;
  const int t = threadIdx.x, lane = t % 32, warp = t / 32;
  const int row = warp / WPR, part = blockIdx.x * WPR + warp % WPR;
  const long base = row * (long)ROWLEN + (long)part * (NVW * 32 * VW);
  V b[NVW];
  load_vectors(b, in + base + lane * VW, 32 * VW);
  if (t == 0) epoch_s = epoch_ticket(cnt);
  __syncthreads();
  const unsigned epoch = epoch_s;
  float m = NEG_INF, s = 0.f;
  #pragma unroll
  for (int e = 0; e < NVW; ++e) {  // online, a vector at a time: no float copy of the row held
    float vm = m;
    #pragma unroll
    for (int v = 0; v < VW; ++v) vm = fmaxf(vm, tof(b[e].v[v]));
    if (vm != m) s *= ex2((m - vm) * L2E);
    m = vm;
    #pragma unroll
    for (int v = 0; v < VW; ++v) s += ex2((tof(b[e].v[v]) - m) * L2E);
  }
  float2 p = warp_pair(make_float2(m, s));
  unsigned long long* slots = ws + (long)row * PARTS * 2;
#if GRIDSYNC  // the pairs as they are, one grid.sync() for every row
  float2* pairs = reinterpret_cast<float2*>(slots);
  if (lane == 0) pairs[part] = p;
  cg::this_grid().sync();
  p = make_float2(NEG_INF, 0.f);
  #pragma unroll
  for (int j = 0; j < PARTS / 32; ++j) p = merge(p, __ldcg(&pairs[j * 32 + lane]));
#else
  if (lane == 0) { slots[part * 2] = word(epoch, p.x); slots[part * 2 + 1] = word(epoch, p.y); }
  p = make_float2(NEG_INF, 0.f);
  #pragma unroll
  for (int j = 0; j < PARTS / 32; ++j) {
    unsigned long long a, c;
    int spins = 0;
    do {
      a = ld_word(slots + (j * 32 + lane) * 2);
      c = ld_word(slots + (j * 32 + lane) * 2 + 1);
    } while (((unsigned)(a >> 32) != epoch || (unsigned)(c >> 32) != epoch) && ++spins < (1 << 22));
    p = merge(p, make_float2(__uint_as_float((unsigned)a), __uint_as_float((unsigned)c)));
  }
#endif
  p = warp_pair(p);
  const float rs = 1.0f / p.y;
  store_softmax(out + base + lane * VW, b, 32 * VW, p.x, rs);
}
"""
# stagger_warp's shapes: label: (blocks, warps a row a block, blocks an SM) by dtype
WARP_SHAPES = {"bf16": {"W1": (128, 1, 1), "W2": (128, 2, 1), "W1s": (256, 1, 2)},
               "fp32": {"W1": (128, 1, 1), "W2": (128, 2, 1), "W1s": (256, 1, 2)}}
WARP_EXCHANGES = {"": 0, "grid-": 1}  # label part: GRIDSYNC


def warp_source(dtype: str, shape: str, gridsync: int = 0) -> str:
    blocks, per_row, per_sm = WARP_SHAPES[dtype][shape]
    values = {"E": "bf16" if dtype == "bf16" else "float", "VW": 8 if dtype == "bf16" else 4, "NB": blocks,
              "WPR": per_row, "MINB": per_sm, "ROWS": ROWS, "ROWLEN": ROW_LENGTH, "GRIDSYNC": gridsync}
    return "".join(f"#define {k} {v}\n" for k, v in values.items()) + COMMON + STAGGER_HELPERS + STAGGER_WARP_KERNEL


def warp_model(dtype: str, shape: str, gridsync: int = 0):
    """A stagger_warp shape as a launch-op model of (x, counters) -> y (a cooperative grid)."""
    blocks, per_row, _ = WARP_SHAPES[dtype][shape]
    return probe_model(dtype, warp_source(dtype, shape, gridsync), "stagger_warp", blocks, ROWS * per_row * 32,
                       16 * ROWS * blocks * per_row, cooperative=True)


# The stagger layout with the generated kernel's one exchange: every row's pair through the
# workspace, one grid.sync(), then each warp folds whole rows. The per-row code is kept small (the
# variants above unrolled a branchy pair merge per row and step into 5,000-11,000 instructions): a row's
# warp max, then its sum below that max, by plain shuffles; the folds loop over rows at run time.
STAGGER_SYNC_KERNEL = r"""
extern "C" __global__ void __launch_bounds__(THREADS, MINB)
stagger_sync(const E* __restrict__ in, int* cnt, E* __restrict__ out, float2* ws) {
  __shared__ float redm[ROWS][NW], reds[ROWS][NW], finm[ROWS], finr[ROWS];
  const int t = threadIdx.x, lane = t % 32, warp = t / 32;
  const long off = (long)blockIdx.x * S;
  V b[ROWS][NPR];
  load_rows(b, in, off);
  #pragma unroll
  for (int r = 0; r < ROWS; ++r) {
    float m = vectors_max(b[r]);
    #pragma unroll
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(~0u, m, o));
    float s = vectors_sum_below(b[r], m);
    #pragma unroll
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(~0u, s, o);
    if (lane == 0) { redm[r][warp] = m; reds[r][warp] = s; }
  }
  __syncthreads();
  for (int r = warp; r < ROWS; r += NW) {  // the block's pair of row r: its warps' pairs
    const float m = lane < NW ? redm[r][lane] : NEG_INF;
    float mx = m;
    #pragma unroll
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(~0u, mx, o));
    float s = lane < NW ? reds[r][lane] * ex2((m - mx) * L2E) : 0.f;
    #pragma unroll
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(~0u, s, o);
    if (lane == 0) ws[r * NB + blockIdx.x] = make_float2(mx, s);
  }
  cg::this_grid().sync();
  for (int r = warp; r < ROWS; r += NW) {  // the row's pair: every block's
    float m = NEG_INF, s = 0.f;
    for (int k = lane; k < NB; k += 32) {
      const float2 p = __ldcg(&ws[r * NB + k]);
      const float to = fmaxf(m, p.x);
      s = s * ex2((m - to) * L2E) + p.y * ex2((p.x - to) * L2E);
      m = to;
    }
    float mx = m;
    #pragma unroll
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(~0u, mx, o));
    s *= ex2((m - mx) * L2E);
    #pragma unroll
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(~0u, s, o);
    if (lane == 0) { finm[r] = mx; finr[r] = 1.0f / s; }
  }
  __syncthreads();
  #pragma unroll
  for (int r = 0; r < ROWS; ++r) {
    store_row(out, b[r], off, r, make_float2(finm[r], finr[r]));
  }
}
"""
# stagger variants: (blocks, threads, blocks an SM) by dtype and layout, then label: layout, defines
# (p, p2: threads a power of two, as the rows template's blocks have, so 96 or 192 blocks, not 128)
STAGGER_SHAPES = {"bf16": {"": (128, 384, 1), "2": (256, 192, 2), "w": (128, 192, 1), "p": (96, 512, 1),
                           "p2": (192, 256, 2)},
                  "fp32": {"": (128, 768, 1), "2": (256, 384, 2), "w": (128, 384, 1), "p": (96, 1024, 1),
                           "p2": (192, 512, 2)}}
STAGGER_VARIANTS = {"stagger-copy": ("", {"COPY": 1, "D": 0}), "stagger2-copy": ("2", {"COPY": 1, "D": 0}),
                    "stagger-copy-sync": ("", {"COPY": 1, "D": 0, "SYNC": 1}), "stagger-D8": ("", {"COPY": 0, "D": 8}),
                    "stagger-E8": ("", {"COPY": 0, "D": 8, "EPOCH": 1}),
                    **{f"stagger{layout}-G{g}D{d}": (layout, {"COPY": 0, "D": d, "EPOCH": 1, "G": g})
                       for layout in ("", "w") for g in (2, 4) for d in (1, 2)},
                    "stagger-G8D1": ("", {"COPY": 0, "D": 1, "EPOCH": 1, "G": 8}),
                    **{f"stagger{layout}-sync": (layout, {"COPY": 0, "D": 0, "SYNCK": 1})
                       for layout in ("", "w", "2", "p", "p2")},
                    "staggerp-copy-sync": ("p", {"COPY": 1, "D": 0, "SYNC": 1}),
                    **{f"stagger{layout}-G4D1-nowait": (layout, {"COPY": 0, "D": 1, "EPOCH": 1, "G": 4, "NOWAIT": 1})
                       for layout in ("", "w")}}


def kernel_of(extra: dict) -> str:
    """The kernel a stagger variant's defines run (STAGGER_VARIANTS)."""
    return ("stagger_group" if extra.get("G") else "stagger_epoch" if extra.get("EPOCH")
            else "stagger_sync" if extra.get("SYNCK") else "stagger")


def stagger_source(dtype: str, layout: str, **extra) -> str:
    """The variant's defines, the layout, and its kernel only (kernel_of)."""
    blocks, threads, per_sm = STAGGER_SHAPES[dtype][layout]
    values = {"E": "bf16" if dtype == "bf16" else "float", "VW": 8 if dtype == "bf16" else 4, "NB": blocks,
              "THREADS": threads, "MINB": per_sm, "ROWS": ROWS, "ROWLEN": ROW_LENGTH, "NOWAIT": 0, "SYNC": 0, **extra}
    kernels = {"stagger": STAGGER_COUNTER_KERNEL, "stagger_epoch": STAGGER_EPOCH_KERNEL,
               "stagger_group": STAGGER_GROUP_KERNEL, "stagger_sync": STAGGER_SYNC_KERNEL}
    return "".join(f"#define {k} {v}\n" for k, v in values.items()) + STAGGER_LAYOUT + kernels[kernel_of(extra)]


def stagger_model(dtype: str, layout: str, extra: dict):
    """A stagger variant as a launch-op model of (x, counters) -> y: a cooperative grid (so every
    block is resident while others wait on its rows)."""
    blocks, threads, _ = STAGGER_SHAPES[dtype][layout]
    return probe_model(dtype, stagger_source(dtype, layout, **extra), kernel_of(extra), blocks, threads,
                       16 * ROWS * blocks, cooperative=True)


def stagger_variants(dtype: str) -> dict:
    """label: (the kernel's kind for rows_phases.main's check, a function making its model)."""
    kinds = {k: "stagger-copy" if e["COPY"] else "stagger-unchecked" if e.get("NOWAIT") else "stagger"
             for k, (_, e) in STAGGER_VARIANTS.items()}
    return {**{k: (kinds[k], lambda lay=lay, e=extra: stagger_model(dtype, lay, e))
               for k, (lay, extra) in STAGGER_VARIANTS.items()},
            **{f"warp-{x}{shape}": ("stagger", lambda shape=shape, g=g: warp_model(dtype, shape, g))
               for shape in WARP_SHAPES[dtype] for x, g in WARP_EXCHANGES.items()}}
