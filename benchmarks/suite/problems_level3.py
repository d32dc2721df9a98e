"""Level 3: small networks, in inference and (where they hold no batch norm, whose running
statistics a training step would change) one training step."""
from __future__ import annotations

import torch
import torch.nn as nn

from .problem import Problem
from .problems_level2 import LinearCrossEntropy
from .problems_rewrites import GPTBlock


class MLP(nn.Module):
    def __init__(self, dim: int, hidden: int, layers: int):
        super().__init__()
        widths = [dim] + [hidden] * (layers - 1) + [dim]
        blocks = []
        for i, (a, b) in enumerate(zip(widths, widths[1:])):
            blocks.append(nn.Linear(a, b))
            if i < layers - 1:
                blocks.append(nn.GELU())
        self.net = nn.Sequential(*blocks)

    def forward(self, x):
        return self.net(x)


class GPT(nn.Module):
    """Token and position embeddings, GPT blocks with hand-written causal attention, final norm."""

    def __init__(self, vocab: int, dim: int, heads: int, seq: int, layers: int):
        super().__init__()
        self.tokens, self.positions = nn.Embedding(vocab, dim), nn.Embedding(seq, dim)
        self.blocks = nn.ModuleList(GPTBlock(dim, heads, seq) for _ in range(layers))
        self.ln_f = nn.LayerNorm(dim)

    def forward(self, ids):
        x = self.tokens(ids) + self.positions(torch.arange(ids.shape[1], device=ids.device))
        for block in self.blocks:
            x = block(x)
        return self.ln_f(x)


def _conv_bn_relu(cin: int, cout: int) -> list[nn.Module]:
    bn = nn.BatchNorm2d(cout)
    bn.running_mean.copy_(0.1 * torch.randn(cout))
    bn.running_var.copy_(1.0 + torch.rand(cout))
    return [nn.Conv2d(cin, cout, 3, padding=1, bias=False), bn, nn.ReLU()]


class ConvBNReluStack(nn.Module):
    def __init__(self, channels: int, depth: int):
        super().__init__()
        self.net = nn.Sequential(*(m for _ in range(depth) for m in _conv_bn_relu(channels, channels)))

    def forward(self, x):
        return self.net(x)


class ResidualBlock(nn.Module):
    """A ResNet basic block in inference."""

    def __init__(self, channels: int):
        super().__init__()
        conv1, bn1, _ = _conv_bn_relu(channels, channels)
        conv2, bn2, _ = _conv_bn_relu(channels, channels)
        self.branch = nn.Sequential(conv1, bn1, nn.ReLU(), conv2, bn2)

    def forward(self, x):
        return torch.relu(self.branch(x) + x)


class SmallCNN(nn.Module):
    """Conv-ReLU-pool three times, then a linear classifier; no normalisation, no recurrence."""

    def __init__(self, channels: int, size: int, classes: int):
        super().__init__()
        widths = [3, channels, 2 * channels, 4 * channels]
        layers = []
        for a, b in zip(widths, widths[1:]):
            layers += [nn.Conv2d(a, b, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2)]
        self.features = nn.Sequential(*layers)
        self.head = nn.Linear(4 * channels * (size // 8) ** 2, classes)

    def forward(self, x):
        return self.head(self.features(x).flatten(1))


MLP_DIMS = {"rows": 4096, "dim": 2048, "hidden": 8192, "layers": 4}
MLP_SMALL = {"rows": 8, "dim": 16, "hidden": 32, "layers": 3}
GPT_DIMS = {"batch": 8, "seq": 512, "vocab": 8192, "dim": 768, "heads": 12, "layers": 4}
GPT_SMALL = {"batch": 2, "seq": 8, "vocab": 32, "dim": 16, "heads": 2, "layers": 2}
CNN_DIMS = {"batch": 64, "size": 128, "channels": 64, "classes": 1000}
CNN_SMALL = {"batch": 2, "size": 8, "channels": 4, "classes": 5}
CONV_DIMS = {"batch": 32, "channels": 64, "size": 56, "depth": 4}
CONV_SMALL = {"batch": 2, "channels": 4, "size": 6, "depth": 2}


def _mlp(name: str, train: bool) -> Problem:
    return Problem(name, 3, MLP, lambda d: [torch.randn(d.rows, d.dim)], MLP_DIMS, MLP_SMALL,
                   get_init_inputs=lambda d: [d.dim, d.hidden, d.layers], group="network", train=train,
                   tolerance=2.0)


def _gpt(name: str, train: bool) -> Problem:
    return Problem(name, 3, GPT, lambda d: [torch.randint(0, d.vocab, (d.batch, d.seq))], GPT_DIMS, GPT_SMALL,
                   get_init_inputs=lambda d: [d.vocab, d.dim, d.heads, d.seq, d.layers], group="network",
                   train=train, tolerance=5.0)


def _cnn(name: str, train: bool) -> Problem:
    return Problem(name, 3, SmallCNN, lambda d: [torch.randn(d.batch, 3, d.size, d.size)], CNN_DIMS, CNN_SMALL,
                   get_init_inputs=lambda d: [d.channels, d.size, d.classes], group="network", train=train,
                   tolerance=5.0)


def _images(d):
    return [torch.randn(d.batch, d.channels, d.size, d.size)]


def _padded_targets(d):
    """Hidden states and their next tokens, every eighth a padding position (-100, cross-entropy's
    ignore_index) as a language model's batches hold them."""
    target = torch.randint(0, d.features_out, (d.rows,))
    target[::8] = -100
    return [torch.randn(d.rows, d.features_in), target]


PROBLEMS = [
    _mlp("mlp", train=False),
    _mlp("mlp_train", train=True),
    _gpt("gpt_manual_attention", train=False),
    _gpt("gpt_manual_attention_train", train=True),
    Problem("conv_bn_relu_stack", 3, ConvBNReluStack, _images, CONV_DIMS, CONV_SMALL,
            get_init_inputs=lambda d: [d.channels, d.depth], group="network", tolerance=5.0),
    Problem("resnet_basic_block", 3, ResidualBlock, _images, CONV_DIMS, CONV_SMALL,
            get_init_inputs=lambda d: [d.channels], group="network", tolerance=5.0),
    _cnn("small_cnn", train=False),
    _cnn("small_cnn_train", train=True),
    # a language model's head and loss, one training step: cross-entropy's backward too
    Problem("lm_head_loss_train", 3, LinearCrossEntropy, _padded_targets,
            {"rows": 4096, "features_in": 1024, "features_out": 32000},
            {"rows": 16, "features_in": 16, "features_out": 12},
            get_init_inputs=lambda d: [d.features_in, d.features_out], group="network", train=True, tolerance=5.0),
]
