"""Whether wider tiles would let a 16-bit transposing copy reach the copy rate (issue 8's
transpose_copy bf16: Inductor and the pointwise template's 32 x 32 tiled kernel both ran at 81-83%
of the copy on an H100). Hand-written kernels, checked against x.t().contiguous(), timed
interleaved with Inductor, eager and a clone of the same bytes (the suite's timing: the worker's
timer, the first contender moving on by one each round).

    python benchmarks/transpose_probe.py [--rows 8192] [--cols 8192]

Kernels (2-byte elements; tile edge x tile edge through shared memory, one tile a block):
  t32e1  32 x 32, one element an access (the template's t32r4: 32 x 8 threads)
  t64e2  64 x 64, two elements an access (4 bytes), 32 x 8 threads; the tile's rows padded to an
         odd number of 2-byte elements, so a warp reading a column pair hits 32 banks
  t64e4  64 x 64, four elements an access (8 bytes), 16 x 16 threads
"""
from __future__ import annotations

import argparse
import functools
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

from agent_backend.env.fast_kernel import load_kernel  # noqa: E402
from benchmarks.suite.timing import time_interleaved  # noqa: E402

ROUNDS = 30

# in: rows x cols, row-major; out: cols x rows. E elements an access, T x T tiles, blockDim (T / E, R).
SOURCE = r"""
template <int T, int E, int R>
__device__ __forceinline__ void transpose_tile(const unsigned short* __restrict__ in, unsigned short* __restrict__ out,
                                               int rows, int cols) {
  __shared__ unsigned short tile[T][T + 1];  // odd row length: column reads spread over the banks
  const int col0 = blockIdx.x * T, row0 = blockIdx.y * T;
  const int tx = threadIdx.x, ty = threadIdx.y;
  #pragma unroll
  for (int r = ty; r < T; r += R) {  // read: E consecutive elements of an input row an access
    const int row = row0 + r, col = col0 + tx * E;
    if (row < rows && col + E <= cols && (cols % E) == 0) {
      if (E == 1) tile[r][tx] = in[(long long)row * cols + col];
      if (E == 2) {
        const unsigned int v = *reinterpret_cast<const unsigned int*>(in + (long long)row * cols + col);
        tile[r][tx * 2] = v & 0xffffu; tile[r][tx * 2 + 1] = v >> 16;
      }
      if (E == 4) {
        const uint2 v = *reinterpret_cast<const uint2*>(in + (long long)row * cols + col);
        tile[r][tx * 4] = v.x & 0xffffu; tile[r][tx * 4 + 1] = v.x >> 16;
        tile[r][tx * 4 + 2] = v.y & 0xffffu; tile[r][tx * 4 + 3] = v.y >> 16;
      }
    } else {
      for (int e = 0; e < E; ++e)
        if (row < rows && col + e < cols) tile[r][tx * E + e] = in[(long long)row * cols + col + e];
    }
  }
  __syncthreads();
  #pragma unroll
  for (int c = ty; c < T; c += R) {  // write: E consecutive elements of an output row (an input column)
    const int orow = col0 + c, ocol = row0 + tx * E;
    if (orow < cols && ocol + E <= rows && (rows % E) == 0) {
      if (E == 1) out[(long long)orow * rows + ocol] = tile[tx][c];
      if (E == 2)
        *reinterpret_cast<unsigned int*>(out + (long long)orow * rows + ocol) =
            (unsigned int)tile[tx * 2][c] | ((unsigned int)tile[tx * 2 + 1][c] << 16);
      if (E == 4) {
        uint2 v;
        v.x = (unsigned int)tile[tx * 4][c] | ((unsigned int)tile[tx * 4 + 1][c] << 16);
        v.y = (unsigned int)tile[tx * 4 + 2][c] | ((unsigned int)tile[tx * 4 + 3][c] << 16);
        *reinterpret_cast<uint2*>(out + (long long)orow * rows + ocol) = v;
      }
    } else {
      for (int e = 0; e < E; ++e)
        if (orow < cols && ocol + e < rows) out[(long long)orow * rows + ocol + e] = tile[tx * E + e][c];
    }
  }
}

extern "C" __global__ void t32e1(const unsigned short* in, unsigned short* out, int rows, int cols) {
  transpose_tile<32, 1, 8>(in, out, rows, cols);
}
extern "C" __global__ void t64e2(const unsigned short* in, unsigned short* out, int rows, int cols) {
  transpose_tile<64, 2, 8>(in, out, rows, cols);
}
extern "C" __global__ void t64e4(const unsigned short* in, unsigned short* out, int rows, int cols) {
  transpose_tile<64, 4, 16>(in, out, rows, cols);
}
"""
KERNELS = {"t32e1": (32, (32, 8)), "t64e2": (64, (32, 8)), "t64e4": (64, (16, 16))}  # name: (tile, block)


def kernel_call(name: str, x: torch.Tensor):
    """A call running kernel `name` on x (2-byte elements), returning a new cols x rows tensor."""
    tile, block = KERNELS[name]
    kernel = load_kernel(SOURCE, name, ["ptr", "ptr", "i32", "i32"])
    rows, cols = x.shape
    grid = (-(-cols // tile), -(-rows // tile), 1)

    def call(x):
        out = torch.empty(cols, rows, dtype=x.dtype, device=x.device)
        kernel.launch(grid, (*block, 1), [x.data_ptr(), out.data_ptr(), rows, cols])
        return out
    return call


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=8192)
    parser.add_argument("--cols", type=int, default=8192)
    args = parser.parse_args(argv)
    device = torch.device("cuda:0")
    x = torch.randn(args.rows, args.cols, device=device, dtype=torch.bfloat16)
    expected = x.t().contiguous()
    named = {name: kernel_call(name, x) for name in KERNELS}
    named |= {"inductor": torch.compile(lambda x: x.t().contiguous()), "eager": lambda x: x.t().contiguous(),
              "clone (copy)": lambda x: x.clone()}
    for name, call in list(named.items()):
        if name != "clone (copy)" and not torch.equal(call(x), expected):
            print(f"  {name:14s} left out: its result differs from x.t().contiguous()")
            del named[name]
    medians = {name: stats["median"] * 1000 for name, stats in time_interleaved(
        {name: functools.partial(call, x) for name, call in named.items()}, ROUNDS, 1, "cuda").items()}
    nbytes = 2 * x.numel() * x.element_size()  # read and written
    print(f"## transpose {args.rows} x {args.cols} bf16 on {torch.cuda.get_device_name(0)}, torch {torch.__version__}")
    for name, m in medians.items():
        print(f"  {name:14s} {m:8.2f} us  vs Inductor {medians['inductor'] / m:5.2f}x  "
              f"{medians['clone (copy)'] / m:6.1%} of the copy  {nbytes / m / 1e3:7.0f} GB/s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
