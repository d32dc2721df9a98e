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

from agent_backend.env.compare import chunk_slices

ACCURACY_FACTOR = 2.0
# A result computed in fp32 passes through several fp32 roundings (log-softmax's backward: an exp,
# a product, a difference), and two correct kernels that round in another order differ by a few
# fp32 ulps: on an H200 a reference that landed at 1.2 ulps made a bar of 2.4 that a kernel at 3
# refused or passed by the draw of its inputs. So no bar is below this many fp32 unit roundoffs
# (a bf16 or fp16 output's own rounding is far above it; TF32 or bf16 arithmetic in an fp32
# task, at 1e-4 to 1e-2, far above too).
FP32_ROUNDINGS = 4


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
    """||got - exact|| / ||exact|| over the elements where `exact` is finite (0 for bool, inf
    where `got` has a NaN among them). The sums of squares run in float64 over chunks of flat
    views, so the temporaries stay a few chunks' size whatever the output's."""
    if not exact.is_floating_point():
        return 0.0
    got_flat, exact_flat = got.reshape(-1), exact.reshape(-1)
    diff_squares = exact_squares = 0.0
    for part in chunk_slices(exact_flat.numel()):
        e = exact_flat[part].to(torch.float64)
        finite = torch.isfinite(e)
        diff = torch.where(finite, got_flat[part].to(torch.float64) - e, 0.0)
        diff_squares += float(diff.square().sum())
        exact_squares += float(torch.where(finite, e, 0.0).square().sum())
    err, norm = math.sqrt(diff_squares), math.sqrt(exact_squares)
    if math.isnan(err):
        return math.inf
    return err / norm if norm > 0 else err


def unit_roundoff(dtype: torch.dtype) -> float:
    return torch.finfo(dtype).eps / 2 if dtype.is_floating_point else 0.0


def accuracy_problem(index: int, candidate_err: float, reference_err: float, dtype: torch.dtype) -> str | None:
    """Why output `index` is too inaccurate, or None. The bar is ACCURACY_FACTOR times the
    reference's error, never below the output dtype's own rounding, nor, for outputs no wider
    than fp32, below FP32_ROUNDINGS fp32 roundings."""
    floor = unit_roundoff(dtype)
    if dtype.is_floating_point and dtype.itemsize <= 4:
        floor = max(floor, FP32_ROUNDINGS * unit_roundoff(torch.float32))
    bar = ACCURACY_FACTOR * max(reference_err, floor)
    if candidate_err <= bar:
        return None
    return (f"output {index} is less accurate than the reference: its relative error against a float64 "
            f"evaluation of the task is {candidate_err:.3g}, the reference's own {reference_err:.3g} "
            f"(at most {ACCURACY_FACTOR:g}x that is allowed)")
