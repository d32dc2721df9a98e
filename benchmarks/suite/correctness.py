"""Is a compiled contender's result eager's result? Tolerances by dtype, scaled per problem.

A result is every output tensor (and, for a training step, every parameter gradient). A
contender passes when each element is within tol * (peak + |eager|), peak being the largest
|eager| in that tensor (a sum reordered over a long row errs in proportion to the row's
magnitude, not to the one element's), or else when its largest error is no more than twice
Inductor's: in deep bf16 networks both compilers drift from eager by reordering sums, and that
drift is not ours to fix; a wrong kernel is far further off.
"""
from __future__ import annotations

import math

import torch

from agent_backend.env.compare import chunk_slices

TOLERANCES = {"fp32": 1e-3, "bf16": 2e-2}


def tensors(out) -> list[torch.Tensor]:
    """The tensors in a nested output (a tensor, tuples and lists, a transformers ModelOutput)."""
    if isinstance(out, torch.Tensor):
        return [out]
    if hasattr(out, "to_tuple"):
        out = out.to_tuple()
    if isinstance(out, (list, tuple)):
        return [t for o in out for t in tensors(o)]
    return []


def compare(got: list[torch.Tensor], expected: list[torch.Tensor], dtype: str, scale: float = 1.0) -> dict:
    """{"max_err": largest |got - expected| (None where shapes differ or got is not finite where
    expected is), "within_tol": bool}. Worked out a chunk at a time (chunk_slices): in float64,
    whole tensors of 4096 x 393216 took 12 GiB each and ran the suite out of an H100's memory."""
    if len(got) != len(expected) or any(g.shape != e.shape for g, e in zip(got, expected)):
        return {"max_err": None, "within_tol": False}
    tol = TOLERANCES[dtype] * scale
    max_err, within = 0.0, True
    for g, e in zip(got, expected):
        g, e = g.detach().reshape(-1), e.detach().reshape(-1)
        parts = chunk_slices(e.numel())
        peaks = [e[part].abs().max() for part in parts]  # exact in e's dtype: no float64 copy needed
        peak = torch.stack(peaks).max().item() if peaks else 0.0  # a NaN anywhere leaves nothing within tolerance
        for part in parts:
            worst, part_within = _chunk_error(g[part].double(), e[part].double(), tol, peak)
            if not math.isfinite(worst):
                return {"max_err": None, "within_tol": False}
            max_err, within = max(max_err, worst), within and part_within
    return {"max_err": max_err, "within_tol": within}


def _chunk_error(g: torch.Tensor, e: torch.Tensor, tol: float, peak: float) -> tuple[float, bool]:
    both_nan = g.isnan() & e.isnan()
    err = torch.where(both_nan | (g == e), torch.zeros_like(g), (g - e).abs())  # equal infinities: no error
    return err.max().item(), bool((err <= tol * (peak + e.abs())).all())


def verdict(ours: dict, inductor: dict) -> str:
    """"ok", "ok (as close as Inductor)" or "MISMATCH" for our result against eager."""
    if ours["within_tol"]:
        return "ok"
    if ours["max_err"] is not None and inductor["max_err"] is not None and ours["max_err"] <= 2 * inductor["max_err"]:
        return "ok (as close as Inductor)"
    return "MISMATCH"
