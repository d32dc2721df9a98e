"""Row-reduction tasks on the GPU (softmax, norms, sums): our best verified kernel vs Inductor vs
eager, searched and timed as benchmarks/pointwise.py does (same pool, verifier and profiler).

    python benchmarks/rows.py [--only softmax] [-v] [--out benchmarks/results/rows-<gpu>-<date>.json]
"""
from __future__ import annotations

import sys

import torch
import torch.nn.functional as F

from pointwise import main


def cases():
    """name -> (function, inputs); each function's forward graph has one reduction task."""
    def r(*shape, dtype=torch.float32):
        return torch.randn(*shape, device="cuda", dtype=dtype)
    bf16 = torch.bfloat16

    def rmsnorm(x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w

    return {
        "softmax_bf16_4kx4k": (lambda x: torch.softmax(x, -1), (r(4096, 4096, dtype=bf16),)),
        "softmax_f32_4kx4k": (lambda x: torch.softmax(x, -1), (r(4096, 4096),)),
        "softmax_f32_16x393216": (lambda x: torch.softmax(x, -1), (r(16, 393216),)),  # KernelBench level 1
        "softmax_bf16_16x393216": (lambda x: torch.softmax(x, -1), (r(16, 393216, dtype=bf16),)),
        "log_softmax_bf16_4kx32000": (lambda x: torch.log_softmax(x, -1), (r(4096, 32000, dtype=bf16),)),
        "layernorm_bf16_8kx4k": (lambda x, w, b: F.layer_norm(x, (4096,), w, b),
                                 (r(8192, 4096, dtype=bf16), r(4096, dtype=bf16), r(4096, dtype=bf16))),
        "rmsnorm_bf16_8kx4k": (rmsnorm, (r(8192, 4096, dtype=bf16), r(4096, dtype=bf16))),
        "residual_layernorm_f16_8kx1k": (lambda x, y, w, b: F.layer_norm(x + y, (1024,), w, b),
                                         tuple(r(*s, dtype=torch.float16) for s in ((8192, 1024), (8192, 1024),
                                                                                    (1024,), (1024,)))),
        "sum_f32_4kx4k": (lambda x: x.sum(-1), (r(4096, 4096),)),
        "sum_f32_1x16M": (lambda x: x.sum(-1), (r(1, 1 << 24),)),
        "mean_dim1_f32_64x512x256": (lambda x: x.mean(1), (r(64, 512, 256),)),
        "logsumexp_f32_4kx4k": (lambda x: torch.logsumexp(x, -1), (r(4096, 4096),)),
        "logsumexp_bf16_4kx8k": (lambda x: torch.logsumexp(x, -1), (r(4096, 8192, dtype=bf16),)),  # the suite's
        # column sums: a bias's gradient in a transformer's training step (batch x sequence rows,
        # hidden or MLP columns), and the suite's tall one
        "bias_grad_bf16_4096x768": (lambda x: x.sum(0), (r(4096, 768, dtype=bf16),)),
        "bias_grad_bf16_4096x3072": (lambda x: x.sum(0), (r(4096, 3072, dtype=bf16),)),
        "bias_grad_f32_4096x768": (lambda x: x.sum(0), (r(4096, 768),)),
        "sum_columns_bf16_16kx4k": (lambda x: x.sum(0), (r(16384, 4096, dtype=bf16),)),
        "sum_columns_f32_16kx4k": (lambda x: x.sum(0), (r(16384, 4096),)),
    }


if __name__ == "__main__":
    sys.exit(main(cases, "reduction"))
