"""Evidence the verifier keeps from earlier calls (their outputs, alive; their inputs' address
ranges), within a memory budget: a task of 6 GB tensors (KernelBench's softmax over 4096 x
393216 fp32) did not fit an H100 when every call's outputs stayed alive."""
from __future__ import annotations

from typing import Callable, Generic, Iterator, TypeVar

import torch

T = TypeVar("T")

# Each kind of evidence may hold up to this share of the device's free memory at the start of a
# verification: with the latest trial's inputs, outputs, copies and reference outputs, a task whose
# inputs and outputs take a twelfth of the memory each still fits.
RETAINED_SHARE = 1 / 8


def retention_budget(device: torch.device) -> int | None:
    """Bytes each kind of evidence may hold on `device`; None (no bound) off the GPU, where the
    tasks verified are small."""
    if device.type != "cuda":
        return None
    free, _ = torch.cuda.mem_get_info(device)
    return int(free * RETAINED_SHARE)


class Retained(Generic[T]):
    """Groups of items (one call's outputs, one trial's address ranges), oldest first, kept while
    together they take at most `budget` bytes: the oldest groups go first, and the newest stays
    whatever it takes, so a call is always checked against the one before it."""

    def __init__(self, budget: int | None, size: Callable[[T], int]):
        self.budget, self.size = budget, size
        self._groups: list[list[T]] = []

    def add(self, group: list[T]) -> None:
        self._groups.append(group)
        if self.budget is None:
            return
        sizes = [sum(map(self.size, g)) for g in self._groups]
        while len(self._groups) > 1 and sum(sizes) > self.budget:
            self._groups.pop(0)
            sizes.pop(0)

    def __iter__(self) -> Iterator[T]:
        return (item for group in self._groups for item in group)


def tensor_bytes(t: torch.Tensor) -> int:
    return t.untyped_storage().nbytes()


def span_bytes(span: tuple[str, int, int]) -> int:
    _, start, end = span
    return end - start
