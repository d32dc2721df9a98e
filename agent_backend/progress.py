"""One line on the terminal for a blocking search (mode "search", `cuda-agent warm`): which
subgraph of the graph is being searched, how far its search is, the best speedup found so far,
rewritten in place on stderr. Silent when stderr is not a terminal (a log file, CI, a pipe) and
while nothing is being searched (cache hits are instant)."""
from __future__ import annotations

import shutil
import sys
from typing import TextIO

from .specs import Task


def _is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # no isatty, or closed
        return False


class SearchProgress:
    def __init__(self, stream: TextIO | None = None):
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = _is_terminal(self.stream)
        self.graph_index, self.total, self.number = 0, 0, 0
        self.task: Task | None = None
        self.stage = ""
        self.best: float | None = None  # best verified speedup over Inductor in this graph
        self.won = 0
        self._shown = False

    def start_graph(self, graph_index: int, total: int) -> None:
        self.graph_index, self.total, self.number, self.best, self.won = graph_index, total, 0, None, 0

    def next_subgraph(self) -> None:
        self.number += 1

    def searching(self, task: Task, stage: str) -> None:
        """A search of `task` began (or moved on to `stage`)."""
        self.task, self.stage = task, stage
        self._show()

    def search_round(self, stage: str, speedup: float | None) -> None:
        """search_task's report of a round: what it is doing, the best speedup it has so far."""
        if speedup is not None:
            self.best = speedup if self.best is None else max(self.best, speedup)
        self.stage = stage
        self._show()

    def finished(self, speedup: float | None, won: bool) -> None:
        """The search of the current subgraph ended (`speedup`: its best candidate's, if any)."""
        if speedup is not None:
            self.best = speedup if self.best is None else max(self.best, speedup)
        self.won += int(won)
        self._show()

    def end_graph(self) -> None:
        """Clear the line, so the next output starts on a clean one."""
        if self._shown:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
            self._shown = False

    def line(self) -> str:
        task = self.task
        what = f"{task.hash[:12]} ({task.kind}, {len(task.ops)} ops)" if task else ""
        best = f"best {self.best:.2f}x Inductor" if self.best is not None else "no verified candidate yet"
        return (f"cuda_agent: graph {self.graph_index}, subgraph {self.number}/{self.total} {what}: {self.stage}; "
                f"{best}; {self.won} won")

    def _show(self) -> None:
        if not self.enabled:
            return
        width = shutil.get_terminal_size((100, 20)).columns - 1
        self.stream.write("\r" + self.line()[:width] + "\x1b[K")
        self.stream.flush()
        self._shown = True
