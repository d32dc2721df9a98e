"""Index-space arithmetic for one pointwise kernel: broadcasting, dimension coalescing, and how
wide a vector every operand can be read and written with."""
from __future__ import annotations

import math

from .errors import Unsupported

# 16-byte accesses are the widest a thread can issue; 8 elements keeps the unrolled body small.
MAX_VECTOR_BYTES = 16
MAX_VECTOR_ELEMENTS = 8


def broadcast_strides(shape: tuple[int, ...], stride: tuple[int, ...],
                      iter_shape: tuple[int, ...]) -> tuple[int, ...]:
    """Strides that read a tensor of `shape` broadcast to `iter_shape` (0 where it repeats)."""
    lead = len(iter_shape) - len(shape)
    if lead < 0:
        raise Unsupported(f"input shape {shape} has more dims than the outputs {iter_shape}")
    out = [0] * lead
    for n, st, m in zip(shape, stride, iter_shape[lead:]):
        if n != m and n != 1:
            raise Unsupported(f"input shape {shape} does not broadcast to the outputs' {iter_shape}")
        out.append(st if n == m and n != 1 else 0)
    return tuple(out)


def memory_order(stride: tuple[int, ...]) -> list[int]:
    """Dims from outermost to innermost in memory: iterating in this order walks a tensor with
    these strides (e.g. channels-last) as one contiguous run."""
    return sorted(range(len(stride)), key=lambda d: -stride[d])


def coalesce(iter_shape: tuple[int, ...],
             strides: list[tuple[int, ...]]) -> tuple[tuple[int, ...], list[tuple[int, ...]]]:
    """Drop size-1 dims and merge neighbours that every operand walks as one, so index math has
    as few divisions as possible. Returns (sizes, per-operand strides), outermost dim first,
    with at least one dim."""
    sizes: list[int] = []
    merged: list[list[int]] = [[] for _ in strides]
    for k, n in enumerate(iter_shape):
        if n == 1:
            continue
        if sizes and all(m[-1] == st[k] * n for m, st in zip(merged, strides)):
            sizes[-1] *= n
            for m, st in zip(merged, strides):
                m[-1] = st[k]
            continue
        sizes.append(n)
        for m, st in zip(merged, strides):
            m.append(st[k])
    if not sizes:  # one element: any stride reads index 0
        return (1,), [(1,) for _ in strides]
    return tuple(sizes), [tuple(m) for m in merged]


def is_dense(shape: tuple[int, ...], stride: tuple[int, ...]) -> bool:
    """Whether the strides lay the elements out with no overlap and no gap (any dim order)."""
    expected = 1
    for st, n in sorted((st, n) for n, st in zip(shape, stride) if n != 1):
        if st != expected:
            return False
        expected *= n
    return True


def vector_width(sizes: tuple[int, ...], inputs: list[tuple[tuple[int, ...], int]],
                 outputs: list[tuple[tuple[int, ...], int]]) -> int:
    """Elements per vector access, for operands given as (coalesced strides, itemsize).

    An operand is accessed as a vector when its innermost stride is 1 (a contiguous run; its
    outer strides must keep every run aligned); an input whose innermost stride is 0 is read as
    one element serving the whole vector. Any other layout, or an innermost dim the width does
    not divide (unless it is the only dim: a scalar tail takes the rest), gives width 1.
    The width is the widest that fits in 16 bytes for the widest vector operand, halved until
    the layout allows it.
    """
    widest = max((size for st, size in inputs + outputs if st[-1] != 0), default=1)
    width = min(MAX_VECTOR_ELEMENTS, MAX_VECTOR_BYTES // widest)
    while width > 1 and (width > math.prod(sizes) or not _fits(sizes, inputs, outputs, width)):
        width //= 2
    return width


def _fits(sizes: tuple[int, ...], inputs: list[tuple[tuple[int, ...], int]],
          outputs: list[tuple[tuple[int, ...], int]], width: int) -> bool:
    def runs_aligned(st: tuple[int, ...]) -> bool:
        return st[-1] == 1 and all(s % width == 0 for s in st[:-1])

    if len(sizes) > 1 and sizes[-1] % width:
        return False
    return (all(st[-1] == 0 or runs_aligned(st) for st, _ in inputs)
            and all(runs_aligned(st) for st, _ in outputs))
