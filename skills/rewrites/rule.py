"""A rewrite rule: a name, what it does, and `apply(graph)`, which changes the graph in place
and returns None, or leaves it unchanged and returns why the rule does not apply."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch.fx as fx


@dataclass(frozen=True)
class Rule:
    name: str
    summary: str
    apply: Callable[[fx.Graph], str | None]
