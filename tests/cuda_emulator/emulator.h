// A CPU stand-in for the CUDA features generated row kernels use, so their logic can be checked
// on a machine without a GPU: every CUDA thread is an OS thread; __syncthreads, warp shuffles
// and cluster.sync() are barriers; each block has its own shared-memory arena, and a cluster's
// blocks run together, so map_shared_rank reaches a neighbour's arena; a cooperative launch runs
// all its blocks together (so blocks may wait for each other on atomics: atomicAdd,
// emu::load_acquire). Not a GPU: no timing, no memory model beyond what the barriers and the
// atomics order, no alignment faults.
//
// tests/cuda_emulation.py rewrites a kernel's `__shared__` declarations into emu::shared<...>
// lookups, swaps its inline-asm helpers for the functions below, and calls emu::launch.
#pragma once

#include <math.h>
#include <pthread.h>
#include <sched.h>

#include <atomic>
#include <barrier>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <vector>

#define __global__
#define __device__
#define __forceinline__ inline
#define __restrict__ __restrict
#define __launch_bounds__(...)
#define __align__(n) alignas(n)

struct emu_dim3 {
  unsigned x = 0, y = 0, z = 0;
};
thread_local emu_dim3 threadIdx, blockIdx, gridDim;

inline float __uint_as_float(unsigned u) { float f; std::memcpy(&f, &u, 4); return f; }
inline unsigned __float_as_uint(float f) { unsigned u; std::memcpy(&u, &f, 4); return u; }
inline double __longlong_as_double(long long u) { double d; std::memcpy(&d, &u, 8); return d; }
inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
inline double rsqrt(double x) { return 1.0 / sqrt(x); }

namespace emu {

constexpr size_t kArenaBytes = 256 * 1024;  // static + dynamic shared memory of one block

using Barrier = std::barrier<>;

struct Cluster;

struct Warp {
  unsigned long long slots[32];
  std::unique_ptr<Barrier> barrier;
};

struct Block {
  std::vector<unsigned char> arena = std::vector<unsigned char>(kArenaBytes);
  std::unique_ptr<Barrier> barrier;
  std::vector<Warp> warps;
  Cluster* cluster = nullptr;
  unsigned rank = 0;
};

struct Cluster {
  std::vector<Block*> blocks;
  std::unique_ptr<Barrier> barrier;
};

// Offsets of static shared variables, the same in every block (so a cluster can map them).
struct Layout {
  std::mutex mutex;
  std::map<int, size_t> offsets;
  size_t next = 0;
};

inline Layout layout;
thread_local Block* block = nullptr;
thread_local unsigned linear = 0;

inline size_t static_offset(int id, size_t bytes, size_t dynamic_bytes) {
  std::lock_guard<std::mutex> lock(layout.mutex);
  auto found = layout.offsets.find(id);
  if (found != layout.offsets.end()) return found->second;
  if (layout.next < dynamic_bytes) layout.next = (dynamic_bytes + 15) / 16 * 16;
  const size_t offset = layout.next;
  layout.next = (offset + bytes + 15) / 16 * 16;
  if (layout.next > kArenaBytes) throw std::runtime_error("shared memory arena exhausted");
  layout.offsets[id] = offset;
  return offset;
}

inline size_t dynamic_bytes = 0;

// A `__shared__ T name;` of the kernel, declaration number `id`.
template <typename T>
T* shared(int id) {
  return reinterpret_cast<T*>(block->arena.data() + static_offset(id, sizeof(T), dynamic_bytes));
}

inline unsigned char* dynamic_shared() { return block->arena.data(); }

inline void sync_block() { block->barrier->arrive_and_wait(); }

inline unsigned lane() { return linear % 32; }

// `value` of lane `source` of this thread's warp (every lane of the warp takes part).
template <typename T>
T shuffle_from(T value, unsigned source) {
  static_assert(sizeof(T) <= 8, "shuffled values are at most 8 bytes");
  Warp& warp = block->warps[linear / 32];
  std::memcpy(&warp.slots[lane()], &value, sizeof(T));
  warp.barrier->arrive_and_wait();
  T other;
  std::memcpy(&other, &warp.slots[source], sizeof(T));
  warp.barrier->arrive_and_wait();
  return other;
}

struct ThreadStart {
  Block* block;
  unsigned block_index, linear, block_x, grid_x;
  const std::function<void()>* kernel;
};

// An acquiring load of global memory (ld.acquire.gpu), for threads that wait on each other's
// atomics (a cooperative launch's blocks): a waiting thread yields its core, since there are far
// more threads than cores.
inline unsigned load_acquire(const unsigned* address) {
  sched_yield();
  return std::atomic_ref<unsigned>(*const_cast<unsigned*>(address)).load(std::memory_order_acquire);
}

inline void* run_thread(void* arg) {
  const ThreadStart& start = *static_cast<ThreadStart*>(arg);
  block = start.block;
  linear = start.linear;
  blockIdx = {start.block_index, 0, 0};
  gridDim = {start.grid_x, 1, 1};
  threadIdx = {start.linear % start.block_x, start.linear / start.block_x, 0};
  (*start.kernel)();
  return nullptr;
}

// Runs `kernel` as a grid of `blocks` blocks of block_x * block_y threads, `cluster` blocks at a
// time, or all of them at once for a cooperative launch.
inline void launch(unsigned blocks_in_grid, unsigned block_x, unsigned block_y, size_t shared_bytes, unsigned cluster,
                   bool cooperative, const std::function<void()>& kernel) {
  if (blocks_in_grid % cluster) throw std::runtime_error("grid is not a whole number of clusters");
  dynamic_bytes = shared_bytes;
  const unsigned threads = block_x * block_y;
  const unsigned together = cooperative ? blocks_in_grid : cluster;
  for (unsigned first = 0; first < blocks_in_grid; first += together) {
    std::vector<std::unique_ptr<Cluster>> groups;
    std::vector<std::unique_ptr<Block>> blocks;
    for (unsigned r = 0; r < together; ++r) {
      if (r % cluster == 0) {
        groups.push_back(std::make_unique<Cluster>());
        groups.back()->barrier = std::make_unique<Barrier>(static_cast<std::ptrdiff_t>(threads * cluster));
      }
      auto b = std::make_unique<Block>();
      b->barrier = std::make_unique<Barrier>(static_cast<std::ptrdiff_t>(threads));
      b->warps = std::vector<Warp>((threads + 31) / 32);
      for (unsigned w = 0; w < b->warps.size(); ++w) {
        const unsigned lanes = threads - w * 32 < 32 ? threads - w * 32 : 32;
        b->warps[w].barrier = std::make_unique<Barrier>(static_cast<std::ptrdiff_t>(lanes));
      }
      b->cluster = groups.back().get();
      b->rank = r % cluster;
      groups.back()->blocks.push_back(b.get());
      blocks.push_back(std::move(b));
    }
    std::vector<ThreadStart> starts;
    starts.reserve(threads * together);
    for (unsigned r = 0; r < together; ++r) {
      for (unsigned t = 0; t < threads; ++t) {
        starts.push_back({blocks[r].get(), first + r, t, block_x, blocks_in_grid, &kernel});
      }
    }
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, 512 * 1024);
    std::vector<pthread_t> handles(starts.size());
    for (size_t i = 0; i < starts.size(); ++i) {
      if (pthread_create(&handles[i], &attr, run_thread, &starts[i]) != 0) throw std::runtime_error("pthread_create");
    }
    for (pthread_t h : handles) pthread_join(h, nullptr);
    pthread_attr_destroy(&attr);
  }
}

}  // namespace emu

inline void __syncthreads() { emu::sync_block(); }

inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }

inline unsigned atomicAdd(unsigned* address, unsigned value) {
  return std::atomic_ref<unsigned>(*address).fetch_add(value);
}

template <typename T>
T __shfl_xor_sync(unsigned, T value, int mask) {
  return emu::shuffle_from(value, emu::lane() ^ mask);
}

// Lanes in segments of `width`: lane - delta of the same segment, or the lane's own value.
template <typename T>
T __shfl_up_sync(unsigned, T value, int delta, int width = 32) {
  const unsigned lane = emu::lane();
  return emu::shuffle_from(value, lane % width >= static_cast<unsigned>(delta) ? lane - delta : lane);
}

template <typename T>
T __shfl_sync(unsigned, T value, int source, int width = 32) {
  const unsigned lane = emu::lane();
  return emu::shuffle_from(value, lane / width * width + source % width);
}

template <typename T>
T __ldcg(const T* address) {
  return *address;
}

namespace cooperative_groups {
struct cluster_group {
  unsigned block_rank() const { return emu::block->rank; }
  unsigned num_blocks() const { return static_cast<unsigned>(emu::block->cluster->blocks.size()); }
  void sync() const { emu::block->cluster->barrier->arrive_and_wait(); }
  template <typename T>
  T* map_shared_rank(T* address, unsigned rank) const {
    const auto offset = reinterpret_cast<unsigned char*>(address) - emu::block->arena.data();
    return reinterpret_cast<T*>(emu::block->cluster->blocks[rank]->arena.data() + offset);
  }
};
inline cluster_group this_cluster() { return {}; }
}  // namespace cooperative_groups
