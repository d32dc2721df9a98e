// benchmarks/rows_persistent.py's kernels (defines: E, VW, C, THREADS, MINB, ROWS, ROWLEN, HOLD,
// PREFETCH, NV, U, NOL1, STCS, STAGE, NBUF, NCH). Softmax over many long rows: each row over a
// cluster of C blocks, the grid persistent (NCL clusters, rows strided), the row's (max, sum)
// through distributed shared memory.
// HOLD 1: each thread's NV vectors of the slice in registers; the next row's vector e is loaded
//         into the register just stored from (PREFETCH 1), so one row's stores overlap the next
//         row's loads. HOLD 0: the slice streamed twice, the second pass hitting L2.
// (after rows_phases.COMMON: the types, tof/fromf, ex2, L2E, NEG_INF, V and merge)
#define SLICE (ROWLEN / C)  // elements a block
#define NVS (SLICE / VW)    // vectors a block
// N vectors into a running (max, sum of exp(x - max)): their max first, the sum rescaled to it
template <int N>
__device__ __forceinline__ void online(float& m, float& s, const V* x) {
  float vm = m;
  #pragma unroll
  for (int u = 0; u < N; ++u)
    #pragma unroll
    for (int v = 0; v < VW; ++v) vm = fmaxf(vm, tof(x[u].v[v]));
  s *= ex2((m - vm) * L2E);
  m = vm;
  const float mb = m * L2E;
  #pragma unroll
  for (int u = 0; u < N; ++u)
    #pragma unroll
    for (int v = 0; v < VW; ++v) s += ex2(fmaf(tof(x[u].v[v]), L2E, -mb));
}
// softmax of a vector: exp(x - max) / sum, given max * log2(e) (qb) and 1 / sum (rs)
__device__ __forceinline__ V softmax_vector(const V& x, float qb, float rs) {
  V y;
  #pragma unroll
  for (int v = 0; v < VW; ++v) fromf(ex2(fmaf(tof(x.v[v]), L2E, -qb)) * rs, y.v[v]);
  return y;
}
__device__ __forceinline__ V ld(const V* p) {
#if NOL1
  V r;
  static_assert(sizeof(V) == 16, "16-byte vectors");
  uint4 u;
  asm("ld.global.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(u.x), "=r"(u.y), "=r"(u.z), "=r"(u.w) : "l"(p));
  *reinterpret_cast<uint4*>(&r) = u;
  return r;
#else
  return *p;
#endif
}
__device__ __forceinline__ void st(V* p, V v) {
#if STCS
  __stcs(reinterpret_cast<float4*>(p), *reinterpret_cast<float4*>(&v));
#else
  *p = v;
#endif
}

// the row's (max, sum) from each thread's pair: warps, the block, then the cluster's slots
__device__ __forceinline__ float2 row_pair(float2 p, float2* red, float2* slot, cg::cluster_group& cluster) {
  const int t = threadIdx.x;
  #pragma unroll
  for (int k = 16; k > 0; k >>= 1)
    p = merge(p, make_float2(__shfl_xor_sync(~0u, p.x, k), __shfl_xor_sync(~0u, p.y, k)));
  if (t % 32 == 0) red[t / 32] = p;
  __syncthreads();
  if (t < 32) {
    p = t < THREADS / 32 ? red[t] : make_float2(NEG_INF, 0.f);
    #pragma unroll
    for (int k = 16; k > 0; k >>= 1)
      p = merge(p, make_float2(__shfl_xor_sync(~0u, p.x, k), __shfl_xor_sync(~0u, p.y, k)));
    if (t == 0) *slot = p;
  }
  asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
  asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
  float2 q = *cluster.map_shared_rank(slot, 0);
  #pragma unroll
  for (int c = 1; c < C; ++c) q = merge(q, *cluster.map_shared_rank(slot, c));
  return q;
}

extern "C" __global__ void __launch_bounds__(THREADS, MINB)
persist(const E* __restrict__ in, E* __restrict__ out) {
  cg::cluster_group cluster = cg::this_cluster();
  __shared__ float2 red[THREADS / 32];
  __shared__ float2 slots[2];
  const int t = threadIdx.x;
  const int ncl = gridDim.x / C;
  const long piece = (long)cluster.block_rank() * SLICE;
  int k = 0;
#if HOLD
  V b[NV];
  int row = blockIdx.x / C;
  if (row < ROWS) {
    #pragma unroll
    for (int e = 0; e < NV; ++e)
      b[e] = ld(reinterpret_cast<const V*>(in + row * (long)ROWLEN + piece) + e * THREADS + t);
  }
  for (; row < ROWS; row += ncl, ++k) {
#if !PREFETCH
    if (k > 0) {
      #pragma unroll
      for (int e = 0; e < NV; ++e)
        b[e] = ld(reinterpret_cast<const V*>(in + row * (long)ROWLEN + piece) + e * THREADS + t);
    }
#endif
    float m = NEG_INF, s = 0.f;  // online: a max of all first would hoist every exp (spills)
    #pragma unroll
    for (int e = 0; e < NV; ++e) online<1>(m, s, &b[e]);
    const float2 q = row_pair(make_float2(m, s), red, &slots[k & 1], cluster);
    const float qb = q.x * L2E, rs = 1.0f / q.y;
    V* dst = reinterpret_cast<V*>(out + row * (long)ROWLEN + piece);
    const int next = row + ncl;
    const V* src = reinterpret_cast<const V*>(in + next * (long)ROWLEN + piece);
    #pragma unroll
    for (int e = 0; e < NV; ++e) {
      st(dst + e * THREADS + t, softmax_vector(b[e], qb, rs));
#if PREFETCH
      if (next < ROWS) b[e] = ld(src + e * THREADS + t);
#endif
    }
  }
#else
  for (int row = blockIdx.x / C; row < ROWS; row += ncl, ++k) {
    const V* src = reinterpret_cast<const V*>(in + row * (long)ROWLEN + piece);
    V* dst = reinterpret_cast<V*>(out + row * (long)ROWLEN + piece);
    float m = NEG_INF, s = 0.f;
    for (int i = t; i < NVS; i += THREADS * U) {
      V x[U];
      #pragma unroll
      for (int u = 0; u < U; ++u) x[u] = src[i + u * THREADS];
      online<U>(m, s, x);
    }
    if (m == NEG_INF) s = 0.f;
    const float2 q = row_pair(make_float2(m, s), red, &slots[k & 1], cluster);
    const float qb = q.x * L2E, rs = 1.0f / q.y;
    for (int i = t; i < NVS; i += THREADS * U) {
      V x[U];
      #pragma unroll
      for (int u = 0; u < U; ++u) x[u] = src[i + u * THREADS];
      #pragma unroll
      for (int u = 0; u < U; ++u) st(dst + i + u * THREADS, softmax_vector(x[u], qb, rs));
    }
  }
#endif
  cluster.sync();  // no block leaves while another may read its slots
}

// the same grid moving the same bytes: each vector loaded and stored, no math, no barrier
extern "C" __global__ void __launch_bounds__(THREADS, MINB)
pcopy(const E* __restrict__ in, E* __restrict__ out) {
  const int ncl = gridDim.x / C;
  const long piece = (long)(blockIdx.x % C) * SLICE;
  for (int row = blockIdx.x / C; row < ROWS; row += ncl) {
    const V* src = reinterpret_cast<const V*>(in + row * (long)ROWLEN + piece);
    V* dst = reinterpret_cast<V*>(out + row * (long)ROWLEN + piece);
    for (int i = threadIdx.x; i < NVS; i += THREADS * 4) {
      V x[4];
      #pragma unroll
      for (int u = 0; u < 4; ++u) x[u] = src[i + u * THREADS];
      #pragma unroll
      for (int u = 0; u < 4; ++u) dst[i + u * THREADS] = x[u];
    }
  }
}

#if STAGE
// The persistent kernel with its rows staged in shared memory by the copy engine (STAGE 1):
// NBUF buffers of a block's slice (a row's 1/C), each filled by NCH bulk copies on one mbarrier.
// A row's slice goes from its buffer into registers (the online max and sum as above); once the
// row's pair is combined over the cluster (every thread of the block is past its reads), thread 0
// refills the buffer with the row NBUF rows on, so loads run on through the reduction and the
// stores. The epilogue stores from registers, as in `persist`.
#define CHUNK_BYTES (SLICE * (int)sizeof(E) / NCH)
static_assert(SLICE * (int)sizeof(E) % (NCH * 16) == 0, "bulk copies are whole multiples of 16 bytes");
__device__ __forceinline__ unsigned smem_at(const void* p) { return (unsigned)__cvta_generic_to_shared(p); }
// thread 0: the slice of `row` on its way into `buf`, completing `bar`'s current phase
__device__ __forceinline__ void stage_row(const E* in, long piece, int row, E* buf, unsigned long long* bar) {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // the block's reads of buf come first
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;"
               :: "r"(smem_at(bar)), "r"((unsigned)(SLICE * sizeof(E))) : "memory");
  const char* src = reinterpret_cast<const char*>(in + row * (long)ROWLEN + piece);
  for (int c = 0; c < NCH; ++c)
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                 :: "r"(smem_at(buf) + c * CHUNK_BYTES), "l"(src + c * CHUNK_BYTES), "r"((unsigned)CHUNK_BYTES),
                    "r"(smem_at(bar)) : "memory");
}
// until `bar`'s phase of this parity completes (a trap, not a hang, if it never does)
__device__ __forceinline__ void wait_parity(unsigned long long* bar, unsigned parity) {
  unsigned done = 0;
  for (long spins = 0; !done; ++spins) {
    asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
                 : "=r"(done) : "r"(smem_at(bar)), "r"(parity) : "memory");
    if (spins > (1L << 24)) __trap();
  }
}

extern "C" __global__ void __launch_bounds__(THREADS, 1)
persist_staged(const E* __restrict__ in, E* __restrict__ out) {
  cg::cluster_group cluster = cg::this_cluster();
  extern __shared__ __align__(128) unsigned char smem[];
  __shared__ __align__(8) unsigned long long bar[NBUF];
  __shared__ float2 red[THREADS / 32];
  __shared__ float2 slots[2];
  E* bufs = reinterpret_cast<E*>(smem);
  const int t = threadIdx.x;
  const int ncl = gridDim.x / C;
  const long piece = (long)cluster.block_rank() * SLICE;
  const int first = blockIdx.x / C;
  if (t == 0) {
    for (int b = 0; b < NBUF; ++b) asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"(smem_at(bar + b)));
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    for (int b = 0; b < NBUF && first + b * ncl < ROWS; ++b)
      stage_row(in, piece, first + b * ncl, bufs + b * SLICE, bar + b);
  }
  __syncthreads();  // the barriers are initialised before anyone waits on them
  int k = 0;
  for (int row = first; row < ROWS; row += ncl, ++k) {
    const int b = k % NBUF;
    E* buf = bufs + b * SLICE;
    wait_parity(bar + b, (unsigned)(k / NBUF) & 1u);
    V x[NV];
    float m = NEG_INF, s = 0.f;
    #pragma unroll
    for (int e = 0; e < NV; ++e) {
      x[e] = reinterpret_cast<const V*>(buf)[e * THREADS + t];
      online<1>(m, s, &x[e]);
    }
    const float2 q = row_pair(make_float2(m, s), red, &slots[k & 1], cluster);
    // every thread of the block has passed the cluster barrier in row_pair, so its reads of buf are done
    const int ahead = row + NBUF * ncl;
    if (t == 0 && ahead < ROWS) stage_row(in, piece, ahead, buf, bar + b);
    const float qb = q.x * L2E, rs = 1.0f / q.y;
    V* dst = reinterpret_cast<V*>(out + row * (long)ROWLEN + piece);
    #pragma unroll
    for (int e = 0; e < NV; ++e) st(dst + e * THREADS + t, softmax_vector(x[e], qb, rs));
  }
  cluster.sync();  // no block leaves while another may read its slots
}
#endif
