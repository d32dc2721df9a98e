"""Where every value of a row task lives on the iteration space.

The iteration space is the shape S the reductions read, split into the reduced dims D (a row)
and the others (which row), refined where an input that S is a reshape of splits S's dims further
(GroupNorm reads x of shape (N, C, H, W) as (N, G, C/G, H*W): the space is then (N, G, C/G, H, W),
and S's last dim is the run of the last two). Each node gets its `axes`: for each of its own dims,
the run of space dims it runs along (None for a size-1 dim). Reductions fix the first axes: their
input runs along all of S, their result along S less D (at D's places when kept). Every other
node is placed from its neighbours, forwards and backwards, the way broadcasting lines dims up
(from the right), so a weight of shape (C,) used with an (N, C) value runs along S's last dim, and
a prologue that reads two inputs is placed from the reduction it feeds. Views of computed values
add or drop size-1 dims, or merge and split runs of space dims (a reshape); views of inputs are
read through their strides (see plan.py).
"""
from __future__ import annotations

import math

import torch
from torch.fx import Node

from skills.pointwise.errors import Unsupported

Run = tuple  # tuple[int, ...]: consecutive dims of the space, outermost first
Axes = tuple  # tuple[Run | None, ...]: one entry per dim of a node's value


def _suffix_products(shape: tuple[int, ...]) -> set[int]:
    products, p = set(), 1
    for n in reversed(shape):
        p *= n
        products.add(p)
    return products


def refine(shape: tuple[int, ...], others: list[tuple[int, ...]]) -> tuple[int, ...] | None:
    """The coarsest space whose dims split `shape`'s and each of `others`' (all of one size, in
    row-major order: reshapes of one another); None where none exists (6 as 2 x 3 and 3 x 2)."""
    sizes, prev = [], 1
    for bound in sorted(set().union(_suffix_products(shape), *map(_suffix_products, others)) - {1}):
        if bound % prev:
            return None
        sizes.append(bound // prev)
        prev = bound
    return tuple(reversed(sizes))


def runs(space: tuple[int, ...], shape: tuple[int, ...]) -> Axes:
    """The run of `space` dims each dim of `shape` spans, `shape` being a reshape of `space`."""
    upper = [math.prod(space[k:]) for k in range(len(space))]  # row-major extent of dim k and inner ones
    axes, p = [], 1
    for n in reversed(shape):
        low, p = p, p * n
        axes.append(tuple(k for k in range(len(space)) if space[k] != 1 and low < upper[k] <= p) if n != 1 else None)
    return tuple(reversed(axes))


def reduced_axes(axes: Axes, dims: tuple[int, ...], keepdim: bool) -> Axes:
    """Axes of a reduction's result over `dims` of a value placed at `axes`."""
    if keepdim:
        return tuple(None if d in dims else a for d, a in enumerate(axes))
    return tuple(a for d, a in enumerate(axes) if d not in dims)


def space_dims(axes: Axes) -> list[int]:
    """The space dims a value placed at `axes` runs along."""
    return [d for run in axes if run is not None for d in run]


class Placement:
    """Axes for every node of one task graph, found by propagation to a fixed point."""

    def __init__(self, space: tuple[int, ...], read: tuple[tuple[int, ...], Axes], shapes: dict[Node, tuple[int, ...]]):
        self.space = space
        self.read_shape, self.read_axes = read  # S, the shape the reductions read, and its runs
        self.shapes = shapes
        self.axes: dict[Node, Axes] = {}

    def fix(self, node: Node, axes: Axes) -> bool:
        """Record `node`'s axes; False if already known (and equal), raises if they differ."""
        known = self.axes.get(node)
        if known is not None:
            if known != axes:
                raise Unsupported(f"{node.name} would run along dims {space_dims(known)} and {space_dims(axes)} "
                                  f"of {list(self.space)}")
            return False
        self.axes[node] = axes
        return True

    def propagate_broadcast(self, node: Node, operands: list[Node]) -> bool:
        """One step for an op whose result broadcasts its tensor operands: place the result from
        placed operands (or the output from its users), then unplaced operands from the result."""
        shape = self.shapes[node]
        out = self.axes.get(node)
        if out is None:
            out = self._broadcast_result(shape, [o for o in operands if o in self.axes])
            if out is None:
                return False
        changed = self.fix(node, out)
        for o in operands:
            changed |= self.fix(o, _right_aligned(out, shape, self.shapes[o], o.name))
        return changed

    def propagate_view(self, node: Node, source: Node) -> bool:
        """A view of a computed value: the same axes on its dims larger than 1."""
        if source in self.axes:
            return self.fix(node, self._relabel(self.axes[source], self.shapes[source], self.shapes[node], node.name))
        if node in self.axes:
            return self.fix(source, self._relabel(self.axes[node], self.shapes[node], self.shapes[source], node.name))
        return False

    def _broadcast_result(self, shape: tuple[int, ...], placed: list[Node]) -> Axes | None:
        """The result's axes from its placed operands. A dim of the result no placed operand
        runs along (a weight's, say) is S's dim at the same place from the right, if the sizes
        agree. None while no operand is placed: the result's users will place it."""
        if not placed:
            return None
        axes: list = []
        for p, n in enumerate(shape):
            found = set()
            for o in placed:
                k = p - (len(shape) - len(self.shapes[o]))
                if k >= 0 and self.shapes[o][k] != 1:
                    found.add(self.axes[o][k])
            if len(found) > 1:
                raise Unsupported(f"operands broadcast dims {sorted(found)} of {list(self.space)} together")
            if found:
                axes.append(found.pop())
            elif n == 1:
                axes.append(None)
            else:
                d = p + len(self.read_shape) - len(shape)
                if d < 0 or self.read_shape[d] != n:
                    raise Unsupported(f"a dim of size {n} that no reduced value runs along: not a row computation")
                axes.append(self.read_axes[d])
        if len(set(space_dims(axes))) != len(space_dims(axes)):
            raise Unsupported(f"a value runs twice along one dim of {list(self.space)}")
        return tuple(axes)

    def _relabel(self, axes: Axes, shape: tuple[int, ...], new_shape: tuple[int, ...], name: str) -> Axes:
        """Axes of a reshape of a computed value: its dims take consecutive space dims in order."""
        carried = space_dims(axes)
        new_axes, k = [], 0
        for n in new_shape:
            if n == 1:
                new_axes.append(None)
                continue
            start, size = k, 1
            while k < len(carried) and size < n:
                size *= self.space[carried[k]]
                k += 1
            if size != n:
                raise Unsupported(f"view {name} regroups the dims of a computed value "
                                  f"({list(shape)} -> {list(new_shape)}) across dims of the space {list(self.space)}")
            new_axes.append(tuple(carried[start:k]))
        if k != len(carried):
            raise Unsupported(f"view {name} of a computed value drops dims ({list(shape)} -> {list(new_shape)})")
        return tuple(new_axes)


def _right_aligned(out: Axes, out_shape: tuple[int, ...], shape: tuple[int, ...], name: str) -> Axes:
    """Axes of an operand of `shape` broadcast (from the right) into a result placed at `out`."""
    lead = len(out_shape) - len(shape)
    if lead < 0:
        raise Unsupported(f"{name} has more dims than the result it broadcasts into")
    axes = []
    for k, n in enumerate(shape):
        if n == 1:
            axes.append(None)
        elif n == out_shape[lead + k]:
            axes.append(out[lead + k])
        else:
            raise Unsupported(f"{name} of shape {list(shape)} does not broadcast to {list(out_shape)}")
    return tuple(axes)


def meta_shape(value) -> tuple[int, ...]:
    if not isinstance(value, torch.Tensor):
        raise Unsupported("a node does not produce one tensor")
    return tuple(value.shape)
