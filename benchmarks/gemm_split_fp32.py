"""Whether an fp32 GEMM can run on tensor cores at fp32's accuracy: cuBLAS's SGEMM (what Inductor
calls with TF32 off) against products of split operands, each timed in interleaved rounds with
the worker's timer (env/profile.CudaTimer) and its error measured against a float64 product.

- bf16x6: each operand split exactly into three bf16 parts (the top 8 significant bits, the next 8,
  the rest), the six products that matter as one bf16 GEMM over a K six times longer, fp32 out
  (`torch.mm(..., out_dtype=torch.float32)`), eager and compiled;
- bf16x6 separate: the same six products as six GEMMs, small ones added first;
- 3xtf32: two-part tf32 splits, three products as one GEMM over 3K with TF32 on.

    python benchmarks/gemm_split_fp32.py

On an H100 (2026-11-25, benchmarks/results/gemm_split_fp32-*-thirteenth.txt) the one-GEMM forms
ran 1.2-1.9x SGEMM at 4096-sized shapes, but their max error was 4.5-30x SGEMM's (the tensor
cores' accumulation), so the verifier (at most 2x the reference's error) would refuse them; the
separate products kept 0.6-5.9x the error and ran 0.11-1.12x. No rewrite was built.
"""
from __future__ import annotations

import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

from agent_backend.env.profile import CudaTimer  # noqa: E402
from agent_backend.env.verify import sleep_cycles_per_ms  # noqa: E402

ROUNDS = 7
SHAPES = [(4096, 4096, 4096, False), (4096, 4096, 4096, True), (4096, 2048, 5632, False),
          (4096, 1024, 8192, False), (256, 4096, 4096, False), (4096, 64, 4096, False)]


def truncated(x: torch.Tensor, mask: int) -> torch.Tensor:
    """x with the low mantissa bits cleared: exactly representable in the narrower format."""
    return (x.view(torch.int32) & mask).view(torch.float32)


def split3(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    high = truncated(x, -65536)
    rest = torch.where(torch.isinf(x), 0.0, x - high)
    mid = truncated(rest, -65536)
    return high.bfloat16(), mid.bfloat16(), (rest - mid).bfloat16()


def bf16x6(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    a1, a2, a3 = split3(a)
    b1, b2, b3 = split3(b)
    return torch.mm(torch.cat([a1, a1, a2, a1, a2, a3], dim=-1), torch.cat([b1, b2, b1, b3, b2, b1], dim=-2),
                    out_dtype=torch.float32)


def bf16x6_separate(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    a1, a2, a3 = split3(a)
    b1, b2, b3 = split3(b)

    def mm(x, y):
        return torch.mm(x, y, out_dtype=torch.float32)
    return ((mm(a3, b1) + mm(a2, b2) + mm(a1, b3)) + (mm(a2, b1) + mm(a1, b2))) + mm(a1, b1)


def tf32x3(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    a_high, b_high = truncated(a, -8192), truncated(b, -8192)
    joined_a = torch.cat([a_high, a - a_high, a_high], dim=-1)
    joined_b = torch.cat([b_high, b_high, b - b_high], dim=-2)
    torch.backends.cuda.matmul.allow_tf32 = True
    try:
        return joined_a @ joined_b
    finally:
        torch.backends.cuda.matmul.allow_tf32 = False


def run(timer: CudaTimer, m: int, k: int, n: int, wide_range: bool) -> None:
    a, b = torch.randn(m, k, device="cuda"), torch.randn(k, n, device="cuda")
    if wide_range:
        a = a * torch.logspace(-8, 8, k, device="cuda")
    exact = a.double() @ b.double()
    named = {"sgemm": lambda: a @ b, "bf16x6": lambda: bf16x6(a, b),
             "bf16x6 compiled": torch.compile(lambda: bf16x6(a, b)), "bf16x6 separate": lambda: bf16x6_separate(a, b),
             "3xtf32": lambda: tf32x3(a, b), "sgemm compiled": torch.compile(lambda: a @ b)}
    print(f"## {m}x{k} @ {k}x{n}{' (columns of a scaled 1e-8..1e8)' if wide_range else ''}", flush=True)
    errors = {}
    for name, f in named.items():
        error = (f().double() - exact).abs()
        errors[name] = (error.max().item(), error.pow(2).mean().sqrt().item())
        for _ in range(2):
            timer.time_call(f)
    timer.fit_cover(0.2)
    times = {name: [] for name in named}
    for _ in range(ROUNDS):
        for name, f in named.items():
            times[name].append(timer.time_call(f).ms)
    base = statistics.median(times["sgemm compiled"])
    for name in named:
        ms = statistics.median(times[name])
        print(f"  {name:18s} {ms:8.3f} ms  {base / ms:5.2f}x  max err {errors[name][0]:.3g}  rms {errors[name][1]:.3g}"
              f"  ({errors[name][0] / errors['sgemm'][0]:.2f} of sgemm's)", flush=True)


def main() -> None:
    torch.backends.cuda.matmul.allow_tf32 = False
    device = torch.device("cuda:0")
    timer = CudaTimer(device, sleep_cycles_per_ms(device))
    for shape in SHAPES:
        run(timer, *shape)


if __name__ == "__main__":
    main()
