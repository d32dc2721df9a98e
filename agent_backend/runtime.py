"""Runtime dispatch: one custom op that runs a verified winner in place of a subgraph.

The graph pass replaces a winning subgraph with `torch.ops.cuda_agent.run_winner(key, inputs)`.
Inductor sees an opaque extern kernel whose output shapes come from the fake implementation, and
compiles everything around it. The winner itself lives in this process's registry, loaded only
after it passed verification (or came from a trusted cache layer).
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Callable

import torch

from .specs import TensorSpec


@dataclass
class Winner:
    """A loaded, verified kernel for one task signature."""

    key: str
    forward: Callable[..., object]  # ModelNew().forward
    outputs: tuple[TensorSpec, ...]
    origin: str
    calls: int = 0


_registry: dict[str, Winner] = {}
_lock = threading.Lock()


def register(winner: Winner) -> None:
    with _lock:
        _registry[winner.key] = winner


def registered(key: str) -> Winner | None:
    return _registry.get(key)


def load_winner(key: str, source: str, outputs: tuple[TensorSpec, ...], origin: str) -> Winner:
    """Execute a verified candidate's source in this process and register its ModelNew."""
    namespace: dict = {"__name__": f"cuda_agent_winner_{key[:12]}"}
    exec(compile(source, f"<winner {key[:12]} {origin}>", "exec"), namespace)
    module = namespace["ModelNew"]()
    winner = Winner(key=key, forward=module.forward, outputs=outputs, origin=origin)
    register(winner)
    return winner


def _conform(out: torch.Tensor, spec: TensorSpec) -> torch.Tensor:
    """Give the output the strides Inductor planned for (its fake tensor had them)."""
    if tuple(out.stride()) == spec.stride or out.numel() <= 1:
        return out
    fixed = torch.empty_strided(spec.shape, spec.stride, dtype=out.dtype, device=out.device)
    return fixed.copy_(out)


@torch.library.custom_op("cuda_agent::run_winner", mutates_args=())
def run_winner(key: str, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    winner = _registry.get(key)
    if winner is None:
        raise RuntimeError(
            f"cuda_agent: no kernel is loaded for {key!r} in this process; this graph was compiled "
            "in another process. Re-run torch.compile (the cache makes it fast).")
    winner.calls += 1
    result = winner.forward(*inputs)
    outs = [result] if isinstance(result, torch.Tensor) else list(result)
    return [_conform(o, s) for o, s in zip(outs, winner.outputs)]


@run_winner.register_fake
def _run_winner_fake(key: str, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    winner = _registry.get(key)
    if winner is None:
        raise RuntimeError(f"cuda_agent: no kernel registered for {key!r}")
    device = inputs[0].device if inputs else torch.device("cpu")
    return [torch.empty_strided(s.shape, s.stride, dtype=s.torch_dtype, device=device) for s in winner.outputs]
