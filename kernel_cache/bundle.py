"""Bundles: one portable file of entries, to hand results to another machine or a team.

A bundle is a cache file like any other (SQLite, JSON values), so it can also be named directly
as a team layer. Export signs what it writes when a trust key is set: the local cache holds
only verified results, and the signature lets a teammate with the same key use them without
verifying again. Import and merge keep, per key, the best entry (see `Contender.rank`) and report every
key where entries that differ in substance met. An entry whose signature claims our key but
does not match is refused: it was changed after it was signed.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Sequence

from .entry import Entry
from .filters import EntryFilter, matches_all
from .layers import DEFAULT_LOCK_TIMEOUT, LOCAL_FILE, KernelCache, Layer, Row
from .store import Store
from .trust import Signature, check_signature, sign


class BundleError(Exception):
    """A bundle that cannot be read or written."""


@dataclass(frozen=True)
class Contender:
    """One entry competing for a key, with where it came from and whether we trust it."""

    entry: Entry
    came_from: str  # the file or layer
    trusted: bool

    def rank(self) -> tuple:
        """Higher is better: trusted first; then a verified kernel, Inductor's win, a failed
        search, an unverified kernel; then the fastest measured time; then the newest."""
        usefulness = {"kernel": 3 if self.entry.verified else 0, "inductor": 2, "context": 2,
                      "failed": 1}[self.entry.outcome]
        return (self.trusted, usefulness, -self.entry.measured_ms, self.entry.created)

    def describe(self) -> dict:
        ms = self.entry.measured_ms
        return {"from": self.came_from, "outcome": self.entry.outcome, "origin": self.entry.origin,
                "ms": None if math.isinf(ms) else ms, "verified": self.entry.verified,
                "trusted": self.trusted}


@dataclass
class Report:
    """What an import or a merge did."""

    written: int = 0
    refused: list[dict] = field(default_factory=list)  # signature claims our key, content differs
    unreadable: list[dict] = field(default_factory=list)
    conflicts: list[dict] = field(default_factory=list)  # differing entries met; `kept` won
    trusted: int = 0  # entries that went to the local cache (import only)
    untrusted: int = 0  # entries that went to the imported layer, to verify before use

    def to_json(self) -> dict:
        return dict(self.__dict__)


def choose(digest: str, contenders: Sequence[Contender]) -> tuple[Contender, dict | None]:
    """The best contender, and a conflict record when the others differ from it in substance
    (outcome, source or binaries), not just in timings or provenance."""
    best = max(contenders, key=Contender.rank)
    others = [c for c in contenders if c is not best]
    if all(_substance(c.entry) == _substance(best.entry) for c in others):
        return best, None
    return best, {"key": digest, "kept": best.describe(), "dropped": [c.describe() for c in others]}


def _substance(entry: Entry) -> tuple:
    return entry.outcome, entry.source, sorted(entry.binaries.items())


def read_bundle(path: str | os.PathLike) -> list[Row]:
    """Every row of a bundle or cache file (a cache directory means its cache file)."""
    path = Path(path)
    if path.is_dir():
        path = path / LOCAL_FILE
    if not path.is_file():
        raise BundleError(f"{path} does not exist")
    store = Store(path, owned=False, lock_timeout=DEFAULT_LOCK_TIMEOUT)
    try:
        rows = list(Layer(str(path), store).rows())
    finally:
        store.close()
    if store.problem:
        raise BundleError(store.problem)
    return rows


def write_bundle(path: str | os.PathLike, values: dict[str, dict]) -> None:
    """Write a new bundle next to `path`, then move it into place: readers of `path` see the
    old file or the new one, never half of one."""
    path = Path(path)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    store = Store(temporary, owned=True, lock_timeout=DEFAULT_LOCK_TIMEOUT)
    try:
        written = store.put(values, last_used={d: v["last_used"] for d, v in values.items()})
        store.close()
        if not written:
            raise BundleError(store.problem or f"could not write {temporary}")
        os.replace(temporary, path)
    finally:
        for leftover in (temporary, store.lock_path):
            leftover.unlink(missing_ok=True)


def export_bundle(cache: KernelCache, out: str | os.PathLike, filters: list[EntryFilter] = ()) -> int:
    """Write the local cache's entries that pass `filters` to `out`; returns how many."""
    values = {}
    for digest, entry in cache.items():
        if matches_all(entry, filters):
            if cache.trust_key:
                entry = replace(entry, signature=sign(entry, cache.trust_key))
            values[digest] = entry.to_json()
    write_bundle(out, values)
    return len(values)


def import_bundle(cache: KernelCache, path: str | os.PathLike) -> Report:
    """Add a bundle to the cache: entries signed with our key to the local cache, the others to
    the imported layer, where lookups find them untrusted (to verify before use)."""
    report = Report()
    updates: dict[str, dict[str, Entry]] = {cache.local.name: {}, cache.imported.name: {}}
    for row in read_bundle(path):
        contender = _contender(row, str(path), cache.trust_key, report)
        if contender is None:
            continue
        layer = cache.local if contender.trusted else cache.imported
        contenders = [contender]
        existing = layer.read(row.digest)
        if existing is not None:
            trusted = layer.is_local or check_signature(existing, cache.trust_key) is Signature.VALID
            contenders.insert(0, Contender(existing, layer.name, trusted))
        best, conflict = choose(row.digest, contenders)
        if conflict:
            report.conflicts.append(conflict)
        if best is contender:
            updates[layer.name][row.digest] = contender.entry
    for layer in (cache.local, cache.imported):
        entries = updates[layer.name]
        if entries and not layer.store.put({d: e.to_json() for d, e in entries.items()},
                                           last_used={d: e.last_used for d, e in entries.items()}):
            raise BundleError(layer.store.problem or f"could not write {layer.store.path}")
    report.trusted, report.untrusted = len(updates[cache.local.name]), len(updates[cache.imported.name])
    report.written = report.trusted + report.untrusted
    return report


def merge_bundles(paths: Sequence[str | os.PathLike], out: str | os.PathLike,
                  trust_key: bytes | None = None) -> Report:
    """Combine bundles (or cache files) into one, keeping per key the best entry."""
    report = Report()
    by_digest: dict[str, list[Contender]] = {}
    for path in paths:
        for row in read_bundle(path):
            contender = _contender(row, str(path), trust_key, report)
            if contender is not None:
                by_digest.setdefault(row.digest, []).append(contender)
    values = {}
    for digest, contenders in by_digest.items():
        best, conflict = choose(digest, contenders)
        if conflict:
            report.conflicts.append(conflict)
        values[digest] = best.entry.to_json()
    write_bundle(out, values)
    report.written = len(values)
    return report


def _contender(row: Row, came_from: str, trust_key: bytes | None, report: Report) -> Contender | None:
    if row.entry is None:
        report.unreadable.append({"key": row.digest, "from": came_from, "why": row.problem})
        return None
    signature = check_signature(row.entry, trust_key)
    if signature is Signature.INVALID:
        report.refused.append({"key": row.digest, "from": came_from,
                               "why": "signed with the trust key, but changed since it was signed"})
        return None
    return Contender(row.entry, came_from, trusted=signature is Signature.VALID)
