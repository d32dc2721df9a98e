"""What one benchmark problem is, how it is built on a device in a dtype, and called.

A problem is written the KernelBench way: a `Model` class, `get_init_inputs(d)` (the Model's
constructor arguments) and `get_inputs(d)` (the forward's arguments), where `d` holds the
problem's sizes: `dims` at full scale, with `small` laid over them for the CPU dry run and tests.
Models and inputs are built in fp32 under a seeded generator, then cast to the dtype asked for
(integer inputs such as token ids or class targets stay as they are).
"""
from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Callable

import torch

from . import correctness

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def no_init_inputs(d: SimpleNamespace) -> list:
    return []


def io_bytes(inputs: list, outputs: list[torch.Tensor]) -> int:
    """Bytes a memory-bound problem must move at least: every input tensor read once, every
    output written once (parameters, small next to the activations here, are not counted)."""
    tensors = [t for t in inputs if isinstance(t, torch.Tensor)] + list(outputs)
    return sum(t.numel() * t.element_size() for t in tensors)


@dataclass(frozen=True)
class Problem:
    name: str
    level: int
    model: type[torch.nn.Module]
    get_inputs: Callable[[SimpleNamespace], list]
    dims: dict
    small: dict
    get_init_inputs: Callable[[SimpleNamespace], list] = no_init_inputs
    dtypes: tuple[str, ...] = ("fp32", "bf16")
    group: str = ""  # e.g. "single-op", "fusion", "rewrites", "network", "transformers"
    train: bool = False  # one training step (forward + backward) instead of inference
    floor_bytes: Callable[[list, list[torch.Tensor]], int] | None = None
    needs: tuple[str, ...] = ()  # modules it imports; the problem is skipped where one is missing
    tolerance: float = 1.0  # times the dtype's tolerance, for deep networks where errors add up
    note: str = field(default="", compare=False)

    def sizes(self, small: bool) -> SimpleNamespace:
        return SimpleNamespace(**{**self.dims, **(self.small if small else {})})

    def missing(self) -> list[str]:
        """Modules this problem needs that are not installed."""
        return [m for m in self.needs if importlib.util.find_spec(m) is None]


def build(problem: Problem, dtype: str, device: str, small: bool, seed: int = 0):
    """(model, inputs) on `device` in `dtype`, the same for the same seed."""
    d = problem.sizes(small)
    torch.manual_seed(seed)
    with torch.device(device):
        model = problem.model(*problem.get_init_inputs(d))
        inputs = problem.get_inputs(d)
    model = model.to(device=device, dtype=DTYPES[dtype])
    model.train(problem.train)
    inputs = [t.to(DTYPES[dtype]) if isinstance(t, torch.Tensor) and t.is_floating_point() else t for t in inputs]
    return model, inputs


def _cotangent(out: torch.Tensor, index: int) -> torch.Tensor:
    """A fixed random gradient for output `index`, the same for every contender. Not ones (the
    gradient of a plain sum): a network ending in LayerNorm gives every earlier layer a zero
    gradient for that, leaving only rounding noise to compare."""
    generator = torch.Generator(out.device).manual_seed(1000 + index)
    return torch.randn(out.shape, generator=generator, device=out.device).to(out.dtype)


def make_call(model: torch.nn.Module, fn: Callable, inputs: list, train: bool) -> Callable[[], list[torch.Tensor]]:
    """One inference call (under no_grad), or one training step: forward, then backward from
    fixed random output gradients. Returns the outputs, and for a step the parameters' gradients."""
    if not train:
        def infer():
            with torch.no_grad():
                return correctness.tensors(fn(*inputs))
        return infer
    params = [p for p in model.parameters() if p.requires_grad]
    cotangents: list[torch.Tensor] = []  # drawn on the first step, outside every timed one after it

    def step():
        model.zero_grad(set_to_none=True)
        outs = [o for o in correctness.tensors(fn(*inputs)) if o.is_floating_point()]
        if not cotangents:
            cotangents.extend(_cotangent(o, i) for i, o in enumerate(outs))
        torch.autograd.backward(outs, cotangents)
        return [o.detach() for o in outs] + [p.grad for p in params if p.grad is not None]
    return step
