"""The model set every backend test runs: small enough for Inductor's C++ compile on 2 cores.

Each factory takes a device and dtype and returns (model, inputs); KernelBench-style modules
are written as such (a Model class with get_inputs-like factories).
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(32, 64), nn.Linear(64, 16)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))


class ConvBN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv, self.bn = nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8)
        self.head = nn.Linear(8, 4)

    def forward(self, x):
        h = torch.relu(self.bn(self.conv(x)))
        return self.head(h.mean((2, 3)))


# KernelBench-style single-op and fused-op modules.
class Softmax(nn.Module):
    def forward(self, x):
        return torch.softmax(x, dim=-1)


class GemmBiasReLU(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight, self.bias = nn.Parameter(torch.randn(24, 16) * 0.1), nn.Parameter(torch.randn(24))

    def forward(self, x):
        return torch.relu(x @ self.weight.t() + self.bias)


class SwishBiasScale(nn.Module):
    """A pointwise chain with a broadcast bias and scalar constants."""

    def __init__(self):
        super().__init__()
        self.bias = nn.Parameter(torch.randn(48))

    def forward(self, x, y):
        h = x * torch.sigmoid(x) + self.bias
        return torch.tanh(h * 0.5 - y) * 2.0


class LayerNormGelu(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(40)

    def forward(self, x):
        return F.gelu(self.norm(x), approximate="tanh")


class ConvScaleSigmoid(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(4, 6, 3)

    def forward(self, x):
        return torch.sigmoid(self.conv(x) * 1.5)


class RowSum(nn.Module):
    def forward(self, x):
        return (x * x).sum(dim=1) + 1.0


class BmmResidual(nn.Module):
    def forward(self, a, b, r):
        return torch.relu(torch.bmm(a, b) + r)


def transformer_block():
    """One GPT-2 block from a transformers config with random weights (no download)."""
    from transformers import GPT2Config, GPT2Model

    config = GPT2Config(n_layer=1, n_embd=32, n_head=2, n_positions=16, vocab_size=64,
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    return GPT2Model(config)


def _rand(device, dtype, *shape):
    return torch.randn(*shape, device=device, dtype=dtype)


def model_set(device: str = "cpu", dtype: torch.dtype = torch.float32) -> dict:
    """name -> factory() returning (model, float inputs); models in train mode for backward."""
    def simple(cls, *shapes):
        def make():
            torch.manual_seed(0)
            return cls().to(device, dtype), tuple(_rand(device, dtype, *s) for s in shapes)
        return make

    def gpt2():
        torch.manual_seed(0)
        model = transformer_block().to(device, dtype)
        return model, (torch.randint(0, 64, (2, 8), device=device),)

    return {
        "mlp": simple(MLP, (8, 32)),
        "conv_bn": simple(ConvBN, (2, 3, 8, 8)),
        "gpt2_block": gpt2,
        "softmax": simple(Softmax, (8, 64)),
        "gemm_bias_relu": simple(GemmBiasReLU, (8, 16)),
        "swish_bias_scale": simple(SwishBiasScale, (16, 48), (16, 48)),
        "layernorm_gelu": simple(LayerNormGelu, (6, 40)),
        "conv_scale_sigmoid": simple(ConvScaleSigmoid, (2, 4, 8, 8)),
        "row_sum": simple(RowSum, (8, 24)),
        "bmm_residual": simple(BmmResidual, (2, 8, 12), (2, 12, 8), (2, 8, 8)),
    }
