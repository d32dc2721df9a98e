"""How far a split fp32 softmax's outputs stray when its kept terms are taken against each
thread's first value (floor of its first element; codegen._terms_against_a_first_value) rather
than against its max (the max taken first), emulated in float32 on the CPU: each term exp(x - r)
and its rescale exp(r - row max) rounded to fp32, times the reciprocal of the row's sum, against
the softmax in float64. Relative errors, the largest over all outputs and over those above 1% of
the row's largest. The layout is the split kernel's (16 x 393216 fp32: 32 blocks of 128 threads a
row, vectors of 4, each block a slice of the row).

    python benchmarks/rows_first_value_error.py
"""
from __future__ import annotations

import torch

LENGTH, THREADS, BLOCKS, WIDTH = 393216, 128, 32, 4


def references(x: torch.Tensor, threads: int, blocks: int, width: int) -> dict[str, torch.Tensor]:
    """Each element's reference value, per form: its thread's first element's floor, its thread's
    max (the max taken first), the row's max (as Inductor's kernel takes it)."""
    per_thread = x.view(blocks, -1, threads, width).permute(0, 2, 1, 3).reshape(blocks * threads, -1)
    thread = torch.arange(blocks)[:, None, None, None] * threads + torch.arange(threads)[None, None, :, None]
    owner = thread.expand(blocks, x.numel() // (blocks * threads * width), threads, width).reshape(-1)
    return {"first value": torch.floor(per_thread[:, 0])[owner], "thread max": per_thread.max(1).values[owner],
            "row max": x.max().expand(x.numel())}


def errors(x: torch.Tensor, threads: int = THREADS, blocks: int = BLOCKS, width: int = WIDTH) -> dict:
    """form -> (largest relative error over all outputs, over those above 1% of the largest)."""
    exact = torch.softmax(x.double(), 0)
    large = exact > exact.max() * 0.01
    out = {}
    for form, r in references(x, threads, blocks, width).items():
        product = torch.exp(x - r) * torch.exp(r - x.max())  # each factor rounded to fp32
        y = product * (1 / product.double().sum()).float()
        relative = (y.double() - exact).abs() / exact
        out[form] = (relative.max().item(), relative[large].max().item())
    return out


def main() -> None:
    torch.manual_seed(0)
    for scale in (1.0, 2.0, 10.0):
        found = errors((torch.randn(LENGTH) * scale).float())
        print(f"randn x {scale}: " + " | ".join(f"{form} {a:.2e} (outputs > 1% of the largest: {b:.2e})"
                                               for form, (a, b) in found.items()))


if __name__ == "__main__":
    main()
