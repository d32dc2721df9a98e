"""Tensor comparisons of verification: values within tolerance, bitwise equality, memory overlap.

Pure functions of tensors, so they are tested in-process on the CPU. Messages are written for
a model to act on: which output, how many elements, the worst one with its index and values.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from agent_backend.env.results import fp32_reduced

# allclose-style atol = rtol by dtype: fp32 as KernelBench uses today; fp16/bf16 are looser
# because one ulp of bf16 is already 0.4%.
_TOLERANCE = {torch.float64: 1e-7, torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 1e-2}
# fp32 where the user allows TF32 (10-bit mantissa, like fp16) for the task's matmuls or convolutions.
_REDUCED_FP32_TOLERANCE = 1e-2


def tolerance(dtype: torch.dtype, precision: dict, ops=()) -> float:
    """atol = rtol for an output of `dtype` from a task made of `ops`."""
    if dtype == torch.float32 and fp32_reduced(precision, ops):
        return _REDUCED_FP32_TOLERANCE
    return _TOLERANCE.get(dtype, 0.0)  # bool: exact


@dataclass
class ValueCheck:
    problem: str | None  # None when every element is within tolerance
    max_abs_err: float
    max_rel_err: float


def _fmt(x: float) -> str:
    return f"{x:.6g}"


# Elements per chunk where outputs are compared in float64: the temporaries then take a few
# chunks' memory (128 MiB each), not several float64 copies of an output that may itself fill
# a good part of the GPU (checking a softmax over 1.6G bf16 elements ran out of an H200's).
CHUNK_ELEMENTS = 2 ** 24


def chunk_slices(numel: int) -> list[slice]:
    """Consecutive slices of a flat view of `numel` elements, CHUNK_ELEMENTS each."""
    return [slice(start, start + CHUNK_ELEMENTS) for start in range(0, numel, CHUNK_ELEMENTS)]


def _scale(expected_flat: torch.Tensor) -> float:
    """The root-mean-square of the reference's finite values, at least 1; summed in float64."""
    total, count = 0.0, 0
    for part in chunk_slices(expected_flat.numel()):
        b = expected_flat[part].to(torch.float64)
        finite = b[torch.isfinite(b)]
        total += float(finite.square().sum())
        count += finite.numel()
    return max(1.0, math.sqrt(total / count)) if count else 1.0


def _bool_chunk(got: torch.Tensor, expected: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, float, float]:
    """(bad, err, max abs err, max rel err) of one chunk of bool outputs: any difference is an error of 1."""
    bad = got != expected
    err = bad.to(torch.float64)
    worst = float(err.max())
    return bad, err, worst, worst


def _value_chunk(got: torch.Tensor, expected: torch.Tensor, tol: float,
                 scale: float) -> tuple[torch.Tensor, torch.Tensor, float, float]:
    """(bad, err, max abs err, max rel err) of one chunk of numeric outputs, in float64."""
    a, b = got.to(torch.float64), expected.to(torch.float64)
    err = (a - b).abs()
    both_finite = torch.isfinite(a) & torch.isfinite(b)
    within = both_finite & (err <= tol * scale + tol * b.abs())
    same_non_finite = ~torch.isfinite(b) & ((torch.isnan(a) & torch.isnan(b)) | (a == b))
    bad = ~(within | same_non_finite)
    max_abs = float(torch.where(both_finite, err, torch.zeros_like(err)).max())
    # Relative error only where the reference is not tiny, where it would say nothing.
    large = both_finite & (b.abs() >= max(tol, 1e-12))
    max_rel = float(torch.where(large, err / b.abs(), torch.zeros_like(err)).max())
    return bad, err, max_abs, max_rel


@dataclass
class _Tally:
    """What compare_values gathers chunk by chunk: counts, maxima and the worst bad element."""

    n_bad: int = 0
    max_abs_err: float = 0.0  # every error is >= 0, so 0 is also the answer for no elements
    max_rel_err: float = 0.0
    worst_score: float = -1.0  # below any bad element's
    worst: int = 0  # flat index of the worst bad element
    worst_err: float = 0.0

    def add(self, start: int, bad: torch.Tensor, err: torch.Tensor, max_abs: float, max_rel: float) -> None:
        """One chunk, whose first element has flat index `start`."""
        self.max_abs_err, self.max_rel_err = max(self.max_abs_err, max_abs), max(self.max_rel_err, max_rel)
        n_bad = int(bad.sum())
        if n_bad == 0:
            return
        self.n_bad += n_bad
        # A non-finite error counts as the worst. argmax takes the first maximum, and a later
        # chunk takes over only with a larger one: the first worst in flat order, as one argmax.
        score = torch.where(bad, err.nan_to_num(nan=float("inf")), torch.full_like(err, -1.0))
        local = int(score.argmax())
        worst_here = float(score[local])
        if worst_here > self.worst_score:
            self.worst_score, self.worst, self.worst_err = worst_here, start + local, float(err[local])


def compare_values(index: int, got: torch.Tensor, expected: torch.Tensor, tol: float) -> ValueCheck:
    """Elementwise |got - expected| <= tol * scale + tol * |expected|, where scale is the
    root-mean-square of the reference's finite values, at least 1: an output whose values are
    in the thousands (a long sum) has rounding errors in proportion, also where one element
    happens to be near 0. A non-finite value where the reference is finite never passes; where
    the reference is non-finite, the same value (NaN, +Inf or -Inf) is required. Shapes and
    dtypes must already agree. Works through flat views in chunks (reshape copies a
    non-contiguous output, in its own dtype), so float64 temporaries stay a few chunks' size."""
    numel = expected.numel()
    is_bool = expected.dtype == torch.bool
    got_flat, exp_flat = got.reshape(-1), expected.reshape(-1)
    scale = 1.0 if is_bool else _scale(exp_flat)
    tally = _Tally()
    for part in chunk_slices(numel):
        g, e = got_flat[part], exp_flat[part]
        bad, err, max_abs, max_rel = _bool_chunk(g, e) if is_bool else _value_chunk(g, e, tol, scale)
        tally.add(part.start, bad, err, max_abs, max_rel)
    if tally.n_bad == 0:
        return ValueCheck(None, tally.max_abs_err, tally.max_rel_err)
    flat = tally.worst
    where = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), expected.shape))
    g, e = got_flat[flat].item(), exp_flat[flat].item()
    worst = "" if is_bool else f", max abs err {_fmt(tally.worst_err)}"
    got_s, exp_s = (str(g), str(e)) if is_bool else (_fmt(g), _fmt(e))
    problem = (f"output {index}: {tally.n_bad} of {numel} elements differ{worst} at index {where}: "
               f"got {got_s}, expected {exp_s}")
    if not is_bool:
        problem += f" (rtol = {tol:g}, atol = {tol:g} x {scale:.3g}, the reference's scale)"
    return ValueCheck(problem, tally.max_abs_err, tally.max_rel_err)


def layout_problem(index: int, got: torch.Tensor, expected: torch.Tensor) -> str | None:
    """Device, shape or dtype differences, which make values incomparable."""
    if got.device != expected.device:
        return f"output {index} is on {got.device}, expected {expected.device}"
    if got.shape != expected.shape:
        return f"output {index} has shape {tuple(got.shape)}, expected {tuple(expected.shape)}"
    if got.dtype != expected.dtype:
        return f"output {index} has dtype {got.dtype}, expected {expected.dtype}"
    return None


def stride_note(index: int, got: torch.Tensor, expected: torch.Tensor) -> str | None:
    if got.dim() and got.stride() != expected.stride():
        return f"output {index} has strides {got.stride()}, the reference {expected.stride()}"
    return None


_SAME_SIZE_INT = {8: torch.int64, 4: torch.int32, 2: torch.int16, 1: torch.uint8}


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(_SAME_SIZE_INT[t.element_size()])


def differing_elements(a: torch.Tensor, b: torch.Tensor) -> int:
    """How many elements of two tensors of one shape and dtype differ in their bits (NaN equals
    NaN, -0.0 differs from 0.0). Counted a chunk at a time: a bool tensor's sum takes an int64
    copy of it (12 GiB for an input of 4096 x 393216, which ran timing's last check out of memory
    on an H200)."""
    flat_a, flat_b = _bits(a).reshape(-1), _bits(b).reshape(-1)
    return int(sum((flat_a[part] != flat_b[part]).sum() for part in chunk_slices(flat_a.numel())))


def bitwise_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and differing_elements(a, b) == 0


def memory_span(t: torch.Tensor) -> tuple[str, int, int]:
    """The device and the address range of the storage behind `t`."""
    storage = t.untyped_storage()
    return str(t.device), storage.data_ptr(), storage.data_ptr() + storage.nbytes()


def spans_overlap(a: tuple[str, int, int], b: tuple[str, int, int]) -> bool:
    (dev_a, start_a, end_a), (dev_b, start_b, end_b) = a, b
    return dev_a == dev_b and start_a < end_a and start_b < end_b and start_a < end_b and start_b < end_a


def share_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether the storages behind two tensors overlap (a view, or the same buffer)."""
    return spans_overlap(memory_span(a), memory_span(b))


def overlapping_pairs(tensors: list[torch.Tensor]) -> set[tuple[int, int]]:
    return {(i, j) for i in range(len(tensors)) for j in range(i + 1, len(tensors))
            if share_memory(tensors[i], tensors[j])}
