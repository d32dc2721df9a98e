"""The cache a process uses: the local store, then the layers it reads from other machines.

Lookup order: the local cache (trusted: only verified results are written to it), then the
imported layer (bundles imported without a trusted signature), then the team caches named by
CUDA_AGENT_TEAM_CACHE or the `team` option. An entry from any layer but the local one was
written elsewhere: it is trusted only when its signature checks with our trust key, and only
then copied to the local cache. Otherwise it is handed back untrusted, for the caller to
verify on this GPU and `put` if it passes.
"""
from __future__ import annotations

import logging
import os
import time
import weakref
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Iterable, Iterator, Sequence

from cuda_agent_core.paths import default_cache_dir

from .entry import Entry, EntryFormatError
from .keys import CacheKey, key_digest
from .store import Store, Unreadable
from .trust import Signature, check_signature, resolve_trust_key, sign

log = logging.getLogger("cuda_agent.cache")

TEAM_CACHE_ENV = "CUDA_AGENT_TEAM_CACHE"
LOCAL_FILE = "cache.sqlite"
IMPORTED_FILE = "imported.sqlite"
# Long enough to wait out another process's import or prune; short enough that a stuck one
# costs a compile only this once (the store then stops using the file).
DEFAULT_LOCK_TIMEOUT = 10.0
_TOUCH_BATCH = 64


def team_paths(team: str | os.PathLike | Sequence[str | os.PathLike] | None) -> list[Path]:
    """The team layers: a list, or one string of paths separated by os.pathsep; None reads
    CUDA_AGENT_TEAM_CACHE. A directory means its cache file; a file is a bundle or cache file."""
    if team is None:
        team = os.environ.get(TEAM_CACHE_ENV, "")
    if isinstance(team, (str, os.PathLike)):
        team = os.fspath(team).split(os.pathsep)
    paths = [Path(p).expanduser() for p in map(os.fspath, team) if p]
    return [p / LOCAL_FILE if p.is_dir() else p for p in paths]


@dataclass(frozen=True)
class Lookup:
    entry: Entry
    layer: str  # "local" or "team:<path>"
    trusted: bool  # False: written elsewhere and not signed with our key; verify before use


@dataclass(frozen=True)
class Row:
    """One stored value as a layer reads it: an entry, or why it is not one."""

    digest: str
    entry: Entry | None
    problem: str | None = None


class Layer:
    """A store seen as entries: decodes each value and checks it belongs to the key it is under."""

    def __init__(self, name: str, store: Store):
        self.name = name
        self.store = store
        self._reported: set[str] = set()

    @property
    def is_local(self) -> bool:
        return self.name == "local"

    def read(self, digest: str) -> Entry | None:
        raw = self.store.get(digest)
        if raw is None:
            return None
        row = self._row(digest, raw)
        if row.problem:
            self.report(digest, row.problem)
        return row.entry

    def report(self, digest: str, problem: str) -> None:
        """Warn about an entry this layer cannot give, once per process."""
        if digest not in self._reported:
            self._reported.add(digest)
            log.warning("ignoring cache entry %s in %s: %s", digest[:16], self.store.path, problem)

    def row(self, digest: str) -> Row:
        return self._row(digest, self.store.get(digest))

    def rows(self) -> Iterator[Row]:
        for digest in self.store.digests():
            yield self.row(digest)

    def _row(self, digest: str, raw: dict | Unreadable | None) -> Row:
        if raw is None:
            return Row(digest, None, "the entry was removed while being read")
        if isinstance(raw, Unreadable):
            return Row(digest, None, "the stored value is not a JSON object")
        try:
            entry = Entry.from_json(raw)
        except EntryFormatError as exc:
            return Row(digest, None, str(exc))
        if key_digest(entry.key) != digest:
            return Row(digest, None, "the entry is stored under a key it was not made for")
        return Row(digest, entry)


class KernelCache:
    """Open with `KernelCache.open()`; see the module docstring for the layers."""

    def __init__(self, cache_dir: Path, layers: list[Layer], trust_key: bytes | None):
        self.cache_dir = cache_dir
        self.layers = layers  # local first, then the imported layer, then team layers
        self.trust_key = trust_key
        self._pending_touches: dict[str, float] = {}
        # Touches not yet written are written when the cache is closed or the process exits.
        self._finalizer = weakref.finalize(self, _flush_and_close, self.local.store, self._pending_touches,
                                           [layer.store for layer in layers])

    @classmethod
    def open(cls, cache_dir: str | os.PathLike | None = None,
             team: str | os.PathLike | Sequence[str | os.PathLike] | None = None,
             trust_key: str | bytes | None = None, *,
             lock_timeout: float = DEFAULT_LOCK_TIMEOUT) -> "KernelCache":
        """Never raises for a missing, damaged, locked or read-only cache: it degrades with a
        warning. Opening creates the cache directory but no file: the first write does."""
        cache_dir = Path(cache_dir).expanduser() if cache_dir else default_cache_dir()
        local = Store(cache_dir / LOCAL_FILE, owned=True, lock_timeout=lock_timeout)
        local.check_directory()
        imported = Store(cache_dir / IMPORTED_FILE, owned=local.writable, lock_timeout=lock_timeout)
        layers = [Layer("local", local), Layer(f"team:{imported.path}", imported)]
        for path in team_paths(team):
            if not path.is_file():
                log.warning("team cache %s does not exist; not using it", path)
                continue
            layers.append(Layer(f"team:{path}", Store(path, owned=False, lock_timeout=lock_timeout)))
        return cls(cache_dir, layers, resolve_trust_key(trust_key))

    @property
    def local(self) -> Layer:
        return self.layers[0]

    @property
    def imported(self) -> Layer:
        return self.layers[1]

    def get(self, key: CacheKey) -> Lookup | None:
        """The best entry for `key`: a local one, else the first trusted one from another
        layer (copied to the local cache), else the first untrusted one (not copied)."""
        entry = self.local.read(key.digest)
        if entry is not None:
            return Lookup(entry, self.local.name, trusted=True)
        shared = self.shared(key)
        if shared is not None and shared.trusted:
            self.adopt(key, shared.entry)
        return shared

    def adopt(self, key: CacheKey, entry: Entry) -> None:
        """Copy a trusted entry of another layer to the local cache as it is (signature kept)."""
        self.local.store.put({key.digest: entry.to_json()}, last_used={key.digest: time.time()})

    def shared(self, key: CacheKey) -> Lookup | None:
        """The best entry for `key` in the layers other than the local one: the first signed with
        our key, else the first other one not refused for its signature (to verify before use);
        nothing is copied."""
        untrusted = None
        for layer in self.layers[1:]:
            entry = layer.read(key.digest)
            if entry is None:
                continue
            signature = check_signature(entry, self.trust_key)
            if signature is Signature.VALID:
                return Lookup(entry, layer.name, trusted=True)
            if signature is Signature.INVALID:
                layer.report(key.digest, "its signature does not match its content: refused")
            elif untrusted is None:
                untrusted = Lookup(entry, layer.name, trusted=False)
        return untrusted

    def content_token(self) -> str | None:
        """Changes whenever an entry of any layer is written or deleted, and never returns to an
        earlier value (see Store.content_token). None when that cannot be told, or when the local
        cache cannot be written: then results found now would not be there next time."""
        local = self.local.store
        if not local.writable:
            return None
        token = local.content_token()
        # A local cache with no token yet gets one: an "absent" file could be deleted and come
        # back with other entries under the same token.
        if token in (None, "absent"):
            if not local.start_generations():
                return None
            token = local.content_token()
        tokens = [(self.local.name, token)] + [(layer.name, layer.store.content_token()) for layer in self.layers[1:]]
        if any(token is None for _, token in tokens):
            return None
        return " ".join(f"{name}={token}" for name, token in tokens)

    def retire_content_token(self) -> bool:
        """Move the content token on without changing an entry, so that whatever was keyed
        under the current token (a graph in Inductor's cache) is never looked up again."""
        return self.local.store.start_generations()  # each call counts one generation

    def put(self, key: CacheKey, entry: Entry) -> bool:
        """Store a verified result in the local cache, signed when a trust key is set. Fills in
        the key, and `created`/`last_used` when unset. False when the cache could not take it."""
        return self.put_many([(key, entry)])

    def put_many(self, results: Iterable[tuple[CacheKey, Entry]]) -> bool:
        """`put` for many results in one transaction (one sync to disk instead of one each)."""
        now = time.time()
        values, last_used = {}, {}
        for key, entry in results:
            key_json = key.to_json()
            if entry.key and entry.key != key_json:
                raise ValueError("entry.key names another key than the one it is put under")
            entry = replace(entry, key=key_json, created=entry.created or now, last_used=entry.last_used or now,
                            signature=None)
            if self.trust_key:
                entry.signature = sign(entry, self.trust_key)
            values[key.digest], last_used[key.digest] = entry.to_json(), entry.last_used
        return self.local.store.put(values, last_used)

    def touch(self, key: CacheKey | str) -> None:
        """Record a use of `key`'s entry (a key or its digest), for least-recently-used pruning
        (written in batches, and at close or exit)."""
        self._pending_touches[key if isinstance(key, str) else key.digest] = time.time()
        if len(self._pending_touches) >= _TOUCH_BATCH:
            self.flush()

    def flush(self) -> None:
        _flush(self.local.store, self._pending_touches)

    def items(self) -> Iterator[tuple[str, Entry]]:
        """(key digest, entry) for every readable entry of the local cache."""
        for row in self.local.rows():
            if row.entry is not None:
                yield row.digest, row.entry

    def close(self) -> None:
        self._finalizer()

    def __enter__(self) -> "KernelCache":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


def _flush(store: Store, pending: dict[str, float]) -> None:
    if pending:
        store.set_last_used(dict(pending))
        pending.clear()


def _flush_and_close(local: Store, pending: dict[str, float], stores: list[Store]) -> None:
    _flush(local, pending)
    for store in stores:
        store.close()
