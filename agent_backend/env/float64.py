"""The accuracy check against float64: a candidate may round differently from the reference (a
rewrite sums in another order), but it may not be less accurate than the reference by more than
ACCURACY_FACTOR, both measured against the task evaluated in float64 throughout.

"Throughout" matters: a bf16 program rounds where it converts (x.to(bf16)), and a float64
evaluation that rounded there too would call the reference's own rounding exact. So every
floating dtype an op is asked for (convert_element_type's target, full's dtype=...) becomes
float64 while the reference runs on upcast inputs.
"""
from __future__ import annotations

import math

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map

ACCURACY_FACTOR = 2.0


def _to_float64(value):
    if isinstance(value, torch.dtype) and value.is_floating_point:
        return torch.float64
    return value


class Float64Mode(TorchDispatchMode):
    """Every floating dtype named in an op's arguments becomes float64."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*tree_map(_to_float64, args), **tree_map(_to_float64, kwargs or {}))


def upcast(t: torch.Tensor) -> torch.Tensor:
    return t.to(torch.float64) if t.is_floating_point() else t


def evaluate(model: torch.nn.Module, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    """The task's outputs in float64 (raises what the model raises, e.g. an op with no float64
    kernel on this device)."""
    with torch.no_grad(), Float64Mode():
        out = model(*[upcast(t) for t in inputs])
    return list(out) if isinstance(out, (tuple, list)) else [out]


def relative_error(got: torch.Tensor, exact: torch.Tensor) -> float:
    """||got - exact|| / ||exact|| over the elements where `exact` is finite (0 for bool)."""
    if not exact.is_floating_point():
        return 0.0
    finite = torch.isfinite(exact)
    diff = torch.where(finite, got.to(torch.float64) - exact, torch.zeros_like(exact))
    norm = float(torch.where(finite, exact, torch.zeros_like(exact)).norm())
    err = float(diff.norm())
    if math.isnan(err):
        return math.inf
    return err / norm if norm > 0 else err


def unit_roundoff(dtype: torch.dtype) -> float:
    return torch.finfo(dtype).eps / 2 if dtype.is_floating_point else 0.0


def accuracy_problem(index: int, candidate_err: float, reference_err: float, dtype: torch.dtype) -> str | None:
    """Why output `index` is too inaccurate, or None. The bar is ACCURACY_FACTOR times the
    reference's error, and never below the output dtype's own rounding."""
    bar = ACCURACY_FACTOR * max(reference_err, unit_roundoff(dtype))
    if candidate_err <= bar:
        return None
    return (f"output {index} is less accurate than the reference: its relative error against a float64 "
            f"evaluation of the task is {candidate_err:.3g}, the reference's own {reference_err:.3g} "
            f"(at most {ACCURACY_FACTOR:g}x that is allowed)")
