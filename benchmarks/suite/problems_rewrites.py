"""Rewrites: structure as it appears in real code, where computing less is the win (a GEMM whose
output is only summed, hand-written attention, a batch norm in inference after a convolution or a
linear layer, reductions over a size-1 dim, redundant reductions, chains of scale factors)."""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from .problem import Problem, io_bytes


class GemmReduce(nn.Module):
    """x @ W, then a reduction over the output features: the GEMM's result is never kept."""

    def __init__(self, k: int, n: int, reduction: str, scale: float = 1.0):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(k, n) / math.sqrt(k))
        self.reduction, self.scale = reduction, scale

    def forward(self, x):
        h = x @ self.weight
        if self.scale != 1.0:
            h = h * self.scale
        return getattr(torch, self.reduction)(h, dim=-1)


class LinearBiasMean(nn.Module):
    def __init__(self, k: int, n: int):
        super().__init__()
        self.linear = nn.Linear(k, n)

    def forward(self, x):
        return self.linear(x).mean(dim=1)


class ScaledMatmulChain(nn.Module):
    """Scale factors scattered around a matmul, as they pile up through refactors."""

    def __init__(self, k: int, n: int):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(k, n) / math.sqrt(k))

    def forward(self, x):
        return ((x * 0.5) @ self.weight * 2.0) / 3.0


class CausalSelfAttention(nn.Module):
    """Attention written by hand, nanoGPT style: scores, a causal mask from a buffer, softmax, @ v."""

    def __init__(self, dim: int, heads: int, max_seq: int):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.register_buffer("bias", torch.tril(torch.ones(max_seq, max_seq)).view(1, 1, max_seq, max_seq))

    def forward(self, x):
        batch, seq, dim = x.shape
        q, k, v = self.qkv(x).split(dim, dim=2)
        q, k, v = (t.view(batch, seq, self.heads, dim // self.heads).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.bias[:, :, :seq, :seq] == 0, float("-inf"))
        att = F.softmax(att, dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(batch, seq, dim)
        return self.proj(y)


class GPTBlock(nn.Module):
    def __init__(self, dim: int, heads: int, max_seq: int):
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = CausalSelfAttention(dim, heads, max_seq)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(approximate="tanh"), nn.Linear(4 * dim, dim))

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class Attention(nn.Module):
    """Unmasked attention over given q, k, v (an encoder's, or cross-attention)."""

    def forward(self, q, k, v):
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
        return torch.softmax(scores, dim=-1) @ v


class ConvBatchNormRelu(nn.Module):
    def __init__(self, cin: int, cout: int):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(cout)
        self.bn.running_mean.copy_(0.1 * torch.randn(cout))
        self.bn.running_var.copy_(1.0 + torch.rand(cout))

    def forward(self, x):
        return torch.relu(self.bn(self.conv(x)))


class LinearBatchNorm1d(nn.Module):
    def __init__(self, k: int, n: int):
        super().__init__()
        self.linear = nn.Linear(k, n)
        self.bn = nn.BatchNorm1d(n)
        self.bn.running_mean.copy_(0.1 * torch.randn(n))
        self.bn.running_var.copy_(1.0 + torch.rand(n))

    def forward(self, x):
        return self.bn(self.linear(x))


class Size1Reduction(nn.Module):
    """A reduction over a dim of size 1 (a singleton head or channel axis), then used with x."""

    def __init__(self, op: str):
        super().__init__()
        self.op = op

    def forward(self, x):
        keep = {} if self.op == "softmax" else {"keepdim": True}
        return getattr(torch, self.op)(x, dim=1, **keep) * x


class RedundantReductions(nn.Module):
    """A row sum kept with keepdim, then reduced again over the now size-1 dim, twice."""

    def forward(self, x):
        s = x.sum(dim=-1, keepdim=True)
        return s.amax(dim=-1) + s.mean(dim=-1)


SMALL_GEMM = {"m": 8, "k": 16, "n": 12}
GEMM_4K = {"m": 2048, "k": 4096, "n": 4096}


def _gemm_reduce(name: str, reduction: str, dims: dict, scale: float = 1.0) -> Problem:
    return Problem(name, 2, GemmReduce, lambda d: [torch.randn(d.m, d.k)], dims, SMALL_GEMM,
                   get_init_inputs=lambda d: [d.k, d.n, reduction, scale], group="rewrites")


def _gpt_block(name: str, seq: int, batch: int) -> Problem:
    return Problem(name, 2, GPTBlock, lambda d: [torch.randn(d.batch, d.seq, d.dim)],
                   {"batch": batch, "seq": seq, "dim": 768, "heads": 12},
                   {"batch": 2, "seq": 8, "dim": 16, "heads": 2},
                   get_init_inputs=lambda d: [d.dim, d.heads, d.seq], group="rewrites", tolerance=2.0)


def _size1(name: str, op: str) -> Problem:
    return Problem(name, 2, Size1Reduction, lambda d: [torch.randn(d.rows, 1, d.cols)], {"rows": 4096, "cols": 4096},
                   {"rows": 4, "cols": 8}, get_init_inputs=lambda d: [op], group="rewrites", floor_bytes=io_bytes)


PROBLEMS = [
    _gemm_reduce("gemm_sum_features_8k", "sum", {"m": 1024, "k": 8192, "n": 8192}),
    _gemm_reduce("gemm_mean_features", "mean", GEMM_4K),
    _gemm_reduce("gemm_scaled_sum_features", "sum", GEMM_4K, scale=0.5),
    _gemm_reduce("gemm_amax_features", "amax", GEMM_4K),
    Problem("linear_bias_mean", 2, LinearBiasMean, lambda d: [torch.randn(d.m, d.k)], GEMM_4K, SMALL_GEMM,
            get_init_inputs=lambda d: [d.k, d.n], group="rewrites"),
    Problem("scaled_matmul_chain", 2, ScaledMatmulChain, lambda d: [torch.randn(d.m, d.k)], GEMM_4K, SMALL_GEMM,
            get_init_inputs=lambda d: [d.k, d.n], group="rewrites"),
    _gpt_block("gpt_block_causal_1024", seq=1024, batch=8),
    _gpt_block("gpt_block_causal_2048", seq=2048, batch=4),
    Problem("attention_no_mask", 2, Attention, lambda d: [torch.randn(d.batch, d.heads, d.seq, d.head_dim)
                                                          for _ in range(3)],
            {"batch": 8, "heads": 12, "seq": 1024, "head_dim": 64}, {"batch": 1, "heads": 2, "seq": 8, "head_dim": 4},
            group="rewrites"),
    Problem("conv_bn_relu_eval", 2, ConvBatchNormRelu, lambda d: [torch.randn(d.batch, d.channels, d.size, d.size)],
            {"batch": 32, "channels": 64, "size": 56, "out": 128}, {"batch": 2, "channels": 3, "size": 6, "out": 4},
            get_init_inputs=lambda d: [d.channels, d.out], group="rewrites", tolerance=5.0),
    Problem("linear_bn1d_eval", 2, LinearBatchNorm1d, lambda d: [torch.randn(d.m, d.k)],
            {"m": 8192, "k": 2048, "n": 2048}, SMALL_GEMM, get_init_inputs=lambda d: [d.k, d.n], group="rewrites"),
    _size1("softmax_size1_dim", "softmax"),
    _size1("logsumexp_size1_dim", "logsumexp"),
    _size1("sum_size1_dim", "sum"),
    Problem("redundant_reductions", 2, RedundantReductions, lambda d: [torch.randn(d.rows, d.cols)],
            {"rows": 4096, "cols": 8192}, {"rows": 4, "cols": 8}, group="rewrites", floor_bytes=io_bytes),
]
