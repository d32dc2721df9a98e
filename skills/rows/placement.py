"""Where every value of a row task lives on the iteration space.

The iteration space is the shape S the reductions read, split into the reduced dims D (a row)
and the others (which row). Each node gets its `axes`: for each of its own dims, the dim of S it
runs along (None for a size-1 dim). Reductions fix the first axes: their input runs along all of
S, their result along S less D (at D's places when kept). Every other node is placed from its
neighbours, forwards and backwards, the way broadcasting lines dims up (from the right), so a
weight of shape (C,) used with an (N, C) value runs along S's last dim, and a prologue that reads
two inputs is placed from the reduction it feeds. Views of computed values may only add or drop
size-1 dims; views of inputs are read through their strides (see plan.py).
"""
from __future__ import annotations

import torch
from torch.fx import Node

from skills.pointwise.errors import Unsupported

Axes = tuple  # tuple[int | None, ...]: one entry per dim of a node's value


def identity_axes(shape: tuple[int, ...]) -> Axes:
    return tuple(d if n != 1 else None for d, n in enumerate(shape))


def reduced_axes(shape: tuple[int, ...], dims: tuple[int, ...], keepdim: bool) -> Axes:
    """Axes of a reduction's result over `dims` of `shape`."""
    if keepdim:
        return tuple(None if d in dims or n == 1 else d for d, n in enumerate(shape))
    return tuple(d if n != 1 else None for d, n in enumerate(shape) if d not in dims)


class Placement:
    """Axes for every node of one task graph, found by propagation to a fixed point."""

    def __init__(self, space: tuple[int, ...], shapes: dict[Node, tuple[int, ...]]):
        self.space = space
        self.shapes = shapes
        self.axes: dict[Node, Axes] = {}

    def fix(self, node: Node, axes: Axes) -> bool:
        """Record `node`'s axes; False if already known (and equal), raises if they differ."""
        known = self.axes.get(node)
        if known is not None:
            if known != axes:
                raise Unsupported(f"{node.name} would run along dims {_show(known)} and {_show(axes)} of {list(self.space)}")
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
            return self.fix(node, _relabel(self.axes[source], self.shapes[source], self.shapes[node], node.name))
        if node in self.axes:
            return self.fix(source, _relabel(self.axes[node], self.shapes[node], self.shapes[source], node.name))
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
                d = p + len(self.space) - len(shape)
                if d < 0 or self.space[d] != n:
                    raise Unsupported(f"a dim of size {n} that no reduced value runs along: not a row computation")
                axes.append(d)
        if len({a for a in axes if a is not None}) != sum(a is not None for a in axes):
            raise Unsupported(f"a value runs twice along one dim of {list(self.space)}")
        return tuple(axes)


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


def _relabel(axes: Axes, shape: tuple[int, ...], new_shape: tuple[int, ...], name: str) -> Axes:
    """Axes of a view that only adds or drops size-1 dims."""
    sizes = [n for n in shape if n != 1]
    if sizes != [n for n in new_shape if n != 1]:
        raise Unsupported(f"view {name} regroups the dims of a computed value ({list(shape)} -> {list(new_shape)})")
    carried = iter(a for a, n in zip(axes, shape) if n != 1)
    return tuple(next(carried) if n != 1 else None for n in new_shape)


def _show(axes: Axes) -> list:
    return [a for a in axes if a is not None]


def meta_shape(value) -> tuple[int, ...]:
    if not isinstance(value, torch.Tensor):
        raise Unsupported("a node does not produce one tensor")
    return tuple(value.shape)
