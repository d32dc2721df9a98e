"""Pruning: so that a cache never grows without bound.

Entries unused for longer than a maximum age go first; then, while the values still take more
than a maximum size, the least recently used ones. The file is then compacted (VACUUM), since
SQLite otherwise keeps the space of deleted rows.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

from .store import Store


@dataclass
class PruneReport:
    path: str
    removed: int
    kept: int
    bytes_before: int  # of the stored values
    bytes_after: int
    file_bytes_after: int

    def to_json(self) -> dict:
        return dict(self.__dict__)


def prune(store: Store, *, max_age_s: float | None = None, max_bytes: int | None = None,
          dry_run: bool = False, now: float | None = None) -> PruneReport:
    now = time.time() if now is None else now
    sizes = store.value_sizes()
    used = store.last_used_times()
    # An entry with no recorded use (written by an older version) counts as used never.
    by_recency = sorted(sizes, key=lambda d: used.get(d, 0.0), reverse=True)
    doomed = set()
    if max_age_s is not None:
        doomed.update(d for d in by_recency if now - used.get(d, 0.0) > max_age_s)
    if max_bytes is not None:
        total = 0
        for digest in (d for d in by_recency if d not in doomed):
            total += sizes[digest]
            if total > max_bytes:
                doomed.add(digest)
    # Uses recorded for keys that have no entry (touched, never stored) go too.
    orphans = used.keys() - sizes.keys()
    deleted = not dry_run and bool(doomed or orphans) and store.delete(doomed | orphans)
    if deleted:
        store.vacuum()
    removed = doomed if dry_run or deleted else set()
    bytes_before = sum(sizes.values())
    return PruneReport(str(store.path), len(removed), len(sizes) - len(removed), bytes_before,
                       bytes_before - sum(sizes[d] for d in removed), store.file_bytes())
