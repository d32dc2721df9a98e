"""Level 2: an anchor op (GEMM, convolution, norm, softmax) with the pointwise work around it,
and pointwise chains with broadcasts and scalar constants."""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from .problem import Problem, io_bytes
from .problems_level1 import SMALL_ROWS, images, rows


class LinearBiasGelu(nn.Module):
    def __init__(self, features_in: int, features_out: int):
        super().__init__()
        self.linear = nn.Linear(features_in, features_out)

    def forward(self, x):
        return F.gelu(self.linear(x))


class LinearReluScaleClamp(nn.Module):
    def __init__(self, features_in: int, features_out: int):
        super().__init__()
        self.linear = nn.Linear(features_in, features_out)

    def forward(self, x):
        return torch.clamp(torch.relu(self.linear(x)) * 2.0, max=6.0)


class SwiGLU(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.gate = nn.Linear(dim, hidden, bias=False)
        self.up = nn.Linear(dim, hidden, bias=False)

    def forward(self, x):
        return F.silu(self.gate(x)) * self.up(x)


class DecodeMLP(nn.Module):
    """A Llama-style MLP (SwiGLU) at a decoding step's few rows: every weight read once a step,
    the gate's product with its SiLU and the up projection's output as its epilogue."""

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.gate = nn.Linear(dim, hidden, bias=False)
        self.up = nn.Linear(dim, hidden, bias=False)
        self.down = nn.Linear(hidden, dim, bias=False)

    def forward(self, x):
        return self.down(F.silu(self.gate(x)) * self.up(x))


class LinearSoftmax(nn.Module):
    def __init__(self, features_in: int, features_out: int):
        super().__init__()
        self.linear = nn.Linear(features_in, features_out)

    def forward(self, x):
        return torch.softmax(self.linear(x), dim=-1)


class ConvBiasRelu(nn.Module):
    def __init__(self, cin: int, cout: int):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, 3, padding=1)

    def forward(self, x):
        return torch.relu(self.conv(x))


class ConvScaleSigmoid(nn.Module):
    def __init__(self, cin: int, cout: int):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, 3, padding=1)
        self.shift = nn.Parameter(0.1 * torch.randn(cout, 1, 1))

    def forward(self, x):
        return torch.sigmoid(self.conv(x) * 1.5 + self.shift)


class ConvGroupNormSilu(nn.Module):
    """The convolution block of a diffusion UNet."""

    def __init__(self, cin: int, cout: int, groups: int):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, 3, padding=1)
        self.norm = nn.GroupNorm(groups, cout)

    def forward(self, x):
        return F.silu(self.norm(self.conv(x)))


class ResidualLayerNorm(nn.Module):
    def __init__(self, features: int):
        super().__init__()
        self.norm = nn.LayerNorm(features)

    def forward(self, x, residual):
        return self.norm(x + residual)


class ResidualRMSNorm(nn.Module):
    def __init__(self, features: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(features) + 0.1 * torch.randn(features))
        self.eps = eps

    def forward(self, x, residual):
        h = x + residual
        return h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class LayerNormGelu(nn.Module):
    def __init__(self, features: int):
        super().__init__()
        self.norm = nn.LayerNorm(features)

    def forward(self, x):
        return F.gelu(self.norm(x), approximate="tanh")


class BiasGeluMul(nn.Module):
    def __init__(self, features: int):
        super().__init__()
        self.bias = nn.Parameter(0.1 * torch.randn(features))

    def forward(self, x, y):
        return F.gelu(x + self.bias) * y


class ScaleShiftTanh(nn.Module):
    """A modulation as in adaptive norms: per-feature scale and shift, then a gated residual."""

    def __init__(self, features: int):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(features) + 0.1 * torch.randn(features))
        self.shift = nn.Parameter(0.1 * torch.randn(features))

    def forward(self, x):
        return torch.tanh(x * self.scale + self.shift) * 0.5 + x


class ScalarChain(nn.Module):
    def forward(self, x, y):
        return x * 0.125 * 4.0 + y * 2.0 / 3.0 - 1.0


class MaskedScaledSoftmax(nn.Module):
    """Attention scores: scaled, plus an additive mask broadcast over the batch, then softmax."""

    def __init__(self, seq: int, head_dim: int):
        super().__init__()
        self.scale = 1.0 / math.sqrt(head_dim)
        self.register_buffer("mask", torch.randn(seq, seq).clamp(max=0.0) * 1e4)

    def forward(self, scores):
        return torch.softmax(scores * self.scale + self.mask, dim=-1)


class BmmResidualRelu(nn.Module):
    def forward(self, a, b, residual):
        return torch.relu(torch.bmm(a, b) + residual)


class LinearCrossEntropy(nn.Module):
    """A language model's head and loss: logits over the vocabulary, then cross-entropy."""

    def __init__(self, features_in: int, vocab: int):
        super().__init__()
        self.head = nn.Linear(features_in, vocab, bias=False)

    def forward(self, x, target):
        return F.cross_entropy(self.head(x), target)


def _linear(d):
    return [torch.randn(d.rows, d.features_in)]


LINEAR = {"rows": 4096, "features_in": 4096, "features_out": 4096}
SMALL_LINEAR = {"rows": 8, "features_in": 16, "features_out": 12}
CONV = {"batch": 32, "channels": 64, "size": 56, "out": 128, "groups": 32}
SMALL_CONV = {"batch": 2, "channels": 3, "size": 6, "out": 4, "groups": 2}
NORM_ROWS = {"rows": 8192, "cols": 4096}


def _fusion(name, model, get_inputs, dims, small, init=None, **kw) -> Problem:
    kw.setdefault("group", "fusion")
    if init is not None:
        kw["get_init_inputs"] = init
    return Problem(name, 2, model, get_inputs, dims, small, **kw)


def _in_out(d):
    return [d.features_in, d.features_out]


def _conv_init(d):
    return [d.channels, d.out]


PROBLEMS = [
    _fusion("linear_bias_gelu", LinearBiasGelu, _linear, LINEAR, SMALL_LINEAR, _in_out),
    _fusion("linear_relu_scale_clamp", LinearReluScaleClamp, _linear, LINEAR, SMALL_LINEAR, _in_out),
    _fusion("swiglu", SwiGLU, _linear, {"rows": 4096, "features_in": 2048, "features_out": 5632}, SMALL_LINEAR,
            _in_out),
    _fusion("mlp_decode", DecodeMLP, _linear, {"rows": 4, "features_in": 4096, "features_out": 14336}, SMALL_LINEAR,
            _in_out),
    _fusion("linear_softmax", LinearSoftmax, _linear, {"rows": 4096, "features_in": 1024, "features_out": 8192},
            SMALL_LINEAR, _in_out),
    _fusion("linear_cross_entropy", LinearCrossEntropy,
            lambda d: [torch.randn(d.rows, d.features_in), torch.randint(0, d.features_out, (d.rows,))],
            {"rows": 4096, "features_in": 1024, "features_out": 32000}, SMALL_LINEAR, _in_out),
    _fusion("conv_bias_relu", ConvBiasRelu, images, CONV, SMALL_CONV, _conv_init, tolerance=5.0),
    _fusion("conv_scale_sigmoid", ConvScaleSigmoid, images, CONV, SMALL_CONV, _conv_init, tolerance=5.0),
    _fusion("conv_groupnorm_silu", ConvGroupNormSilu, images, CONV, SMALL_CONV,
            lambda d: [d.channels, d.out, d.groups], tolerance=5.0),
    _fusion("residual_layernorm", ResidualLayerNorm, lambda d: rows(d) + rows(d), NORM_ROWS, SMALL_ROWS,
            lambda d: [d.cols], floor_bytes=io_bytes),
    _fusion("residual_rmsnorm", ResidualRMSNorm, lambda d: rows(d) + rows(d), NORM_ROWS, SMALL_ROWS,
            lambda d: [d.cols], floor_bytes=io_bytes),
    _fusion("layernorm_gelu", LayerNormGelu, rows, NORM_ROWS, SMALL_ROWS, lambda d: [d.cols], floor_bytes=io_bytes),
    _fusion("bias_gelu_mul", BiasGeluMul, lambda d: rows(d) + rows(d), NORM_ROWS, SMALL_ROWS, lambda d: [d.cols],
            floor_bytes=io_bytes),
    _fusion("scale_shift_tanh", ScaleShiftTanh, rows, NORM_ROWS, SMALL_ROWS, lambda d: [d.cols],
            floor_bytes=io_bytes),
    _fusion("scalar_chain", ScalarChain, lambda d: rows(d) + rows(d), NORM_ROWS, SMALL_ROWS, floor_bytes=io_bytes),
    _fusion("masked_scaled_softmax", MaskedScaledSoftmax, lambda d: [torch.randn(d.batch, d.heads, d.seq, d.seq)],
            {"batch": 8, "heads": 12, "seq": 1024, "head_dim": 64}, {"batch": 1, "heads": 2, "seq": 8, "head_dim": 4},
            lambda d: [d.seq, d.head_dim], floor_bytes=io_bytes),
    _fusion("bmm_residual_relu", BmmResidualRelu,
            lambda d: [torch.randn(d.batch, d.n, d.n), torch.randn(d.batch, d.n, d.n), torch.randn(d.batch, d.n, d.n)],
            {"batch": 64, "n": 512}, {"batch": 2, "n": 8}),
]
