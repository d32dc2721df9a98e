"""One cache file: a SQLite database, read and written through sqlitedict.

- Values are JSON text (sqlitedict's encode/decode hooks), never pickle.
- Writes take a file lock (so many processes queue instead of failing on SQLite's busy
  errors, and a stuck writer shows up as a clear timeout naming the lock file) and run in one
  explicit transaction each, in rollback-journal mode with full syncs: a writer killed at any
  point leaves the last committed state, and the file works on network file systems.
- A failure of the file never raises out of this class. A corrupt file we own is moved aside
  and replaced by a fresh one; a file that is locked, full, read-only or unreadable stops being
  read or written for the rest of the process, with one warning.
"""
from __future__ import annotations

import json
import logging
import os
import sqlite3
import threading
import time
from pathlib import Path
from typing import Callable, Iterable, Mapping, TypeVar

import filelock
from sqlitedict import SqliteDict, SqliteMultithread

log = logging.getLogger("cuda_agent.cache")

ENTRIES_TABLE = "entries"  # key digest -> entry JSON
LAST_USED_TABLE = "last_used"  # key digest -> time of last use: kept apart so that recording a
# use rewrites a few bytes, not an entry with its binaries
META_TABLE = "meta"  # "nonce": made with the file; "generation": counts writes of entries

# SQLite's primary result codes (sqlite3 names them only from Python 3.11 on).
_CORRUPT_CODES = {11, 26}  # SQLITE_CORRUPT, SQLITE_NOTADB
_BUSY_CODES = {5, 6}  # SQLITE_BUSY, SQLITE_LOCKED
# What a damaged, locked, full or unreachable file can raise through sqlitedict; anything else
# is a bug and propagates.
_STORE_ERRORS = (sqlite3.Error, OSError, RuntimeError, filelock.Timeout)

T = TypeVar("T")


def _encode(value: dict) -> str:
    return json.dumps(value, separators=(",", ":"))


class Unreadable:
    """What a value that is not a JSON object (damage, or another program's data) reads as, so
    one bad row is reported and skipped, and never stops a scan of the others."""


def _decode(stored) -> dict | Unreadable:
    try:
        value = json.loads(stored)
    except (TypeError, ValueError):
        return Unreadable()
    return value if isinstance(value, dict) else Unreadable()


_quiet_log = logging.getLogger("cuda_agent.cache.sqlitedict")
_quiet_log.setLevel(logging.CRITICAL)


class _QuietConnection(SqliteMultithread):
    """sqlitedict's connection thread without its own error reports: it logs every failed
    statement at ERROR with stack traces, and a failed connect escapes its thread as an
    uncaught traceback. The error still reaches the caller (re-raised on the next call), which
    reports it once."""

    @property
    def log(self):
        return _quiet_log

    @log.setter
    def log(self, _ignored):
        pass

    def run(self):
        try:
            super().run()
        except Exception:  # already stored in self.exception for the caller
            pass


class _QuietSqliteDict(SqliteDict):
    def _new_conn(self):
        return _QuietConnection(self.filename, autocommit=self.autocommit,
                                journal_mode=self.journal_mode, outer_stack=self._outer_stack)


class Store:
    """A table of JSON values by key digest in one SQLite file.

    `owned` stores (the local cache, the imported layer, a bundle being written) may be created,
    written and, when corrupt, moved aside; other stores (team caches) are only read: never
    written, locked for writing or moved (SQLite itself may roll back a transaction its writer
    left half done, as any reader of a SQLite file does).
    """

    def __init__(self, path: Path, *, owned: bool, lock_timeout: float):
        self.path = Path(path)
        self.lock_path = self.path.with_name(self.path.name + ".lock")
        self.owned = owned
        self.lock_timeout = lock_timeout
        self.readable = True
        self.writable = owned
        self.problem: str | None = None  # why the store is not (fully) usable, once it is not
        self._db: SqliteDict | None = None
        self._lock: filelock.FileLock | None = None
        self._pid = os.getpid()
        self._inode: int | None = None  # of the file the connection opened
        self._mutex = threading.RLock()  # one operation at a time: recovery replaces the connection

    # -- reads ---------------------------------------------------------------------------------

    def get(self, digest: str) -> dict | Unreadable | None:
        """The value stored under `digest` (None when there is none); in a store we own, its
        `last_used` is the time of the last recorded use (see LAST_USED_TABLE)."""
        if self.owned:  # one query for both tables: each query is a round trip to sqlitedict's thread
            sql = (f'SELECT e.value, u.t FROM "{ENTRIES_TABLE}" e LEFT JOIN "{LAST_USED_TABLE}" u '
                   f'ON u.key = e.key WHERE e.key = ?')
        else:
            sql = f'SELECT value, NULL FROM "{ENTRIES_TABLE}" WHERE key = ?'

        def read(db):
            row = db.conn.select_one(sql, (digest,))
            if row is None:
                return None
            value, last_used = db.decode(row[0]), row[1]
            if isinstance(value, dict) and last_used is not None:
                value["last_used"] = last_used
            return value
        return self._read(read, None)

    def digests(self) -> list[str]:
        return self._read(lambda db: list(db.keys()), [])

    def value_sizes(self) -> dict[str, int]:
        """Stored bytes of each value (values are ASCII JSON, so characters are bytes)."""
        sql = f'SELECT key, length(value) FROM "{ENTRIES_TABLE}"'
        return self._read(lambda db: dict(db.conn.select(sql)), {})

    def last_used_times(self) -> dict[str, float]:
        if not self.owned:  # a team cache's uses are its owner's business
            return {}
        return self._read(lambda db: dict(db.conn.select(f'SELECT key, t FROM "{LAST_USED_TABLE}"')), {})

    def content_token(self) -> str | None:
        """Changes with every write or deletion of entries (not with a recorded use) and never
        comes back to an earlier value in the same file, a new file having a new nonce. "absent"
        when there is no file; None when unknown (a file written by an older version, or
        unreadable)."""
        if not self.readable:
            return None

        def read(db):
            exists = f"SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = '{META_TABLE}'"
            if db.conn.select_one(exists) is None:
                return None
            meta = dict(db.conn.select(f'SELECT key, v FROM "{META_TABLE}"'))
            return f"{meta['nonce']}:{meta['generation']}" if {"nonce", "generation"} <= set(meta) else None
        if not self.path.exists():
            return "absent"
        return self._read(read, None)

    def start_generations(self) -> bool:
        """Create the file (or its generation count) with no entries, so it has a content token;
        on a file that has one, count one more generation (KernelCache.retire_content_token)."""
        return self._write(self._count_generation)

    def file_bytes(self) -> int:
        try:
            return self.path.stat().st_size
        except OSError:
            return 0

    # -- writes (each one transaction; False when the store could not take it) ----------------

    def put(self, values: Mapping[str, dict], last_used: Mapping[str, float] | None = None) -> bool:
        def write(db):
            db.update(values)
            self._write_last_used(db, last_used or {})
            self._count_generation(db)
        return self._write(write)

    def set_last_used(self, times: Mapping[str, float]) -> bool:
        return self._write(lambda db: self._write_last_used(db, times))

    def delete(self, digests: Iterable[str]) -> bool:
        rows = [(d,) for d in digests]
        def write(db):
            for table in (ENTRIES_TABLE, LAST_USED_TABLE):
                db.conn.executemany(f'DELETE FROM "{table}" WHERE key = ?', rows)
            self._count_generation(db)
        return self._write(write)

    def clear(self) -> bool:
        def write(db):
            for table in (ENTRIES_TABLE, LAST_USED_TABLE):
                db.conn.execute(f'DELETE FROM "{table}"')
            self._count_generation(db)
        return self._write(write)

    def vacuum(self) -> bool:
        """Give the space of deleted rows back to the file system (outside any transaction)."""
        return self._write(lambda db: db.conn.select_one("VACUUM"), transaction=False)

    def check_directory(self) -> None:
        """Find out now, not at the first write (which may come after a long search), whether
        the directory of this owned store can be written; degrade with one warning if not."""
        directory = self.path.parent
        try:
            directory.mkdir(parents=True, exist_ok=True)
            writable = os.access(directory, os.W_OK)
        except OSError:
            writable = False
        if writable:
            return
        if self.path.exists():
            self._stop_writing(f"cache directory {directory} is read-only: reading {self.path} without writing to it")
        else:
            self._disable(f"cache directory {directory} cannot be written: continuing without a cache")

    def close(self) -> None:
        with self._mutex:
            self._forget_parent_connection()
            self._drop_connection(wait=True)

    @staticmethod
    def _count_generation(db: SqliteDict) -> None:
        """Inside a write of entries: one more generation (the table and nonce made on first use)."""
        db.conn.execute(f'CREATE TABLE IF NOT EXISTS "{META_TABLE}" (key TEXT PRIMARY KEY, v TEXT)')
        db.conn.execute(f'INSERT OR IGNORE INTO "{META_TABLE}" (key, v) VALUES (?, ?), (?, ?)',
                        ("nonce", os.urandom(8).hex(), "generation", "0"))
        db.conn.execute(f'UPDATE "{META_TABLE}" SET v = CAST(v AS INTEGER) + 1 WHERE key = ?', ("generation",))

    @staticmethod
    def _write_last_used(db: SqliteDict, times: Mapping[str, float]) -> None:
        db.conn.executemany(f'REPLACE INTO "{LAST_USED_TABLE}" (key, t) VALUES (?, ?)', list(times.items()))

    # -- the connection and its failures -------------------------------------------------------

    def _read(self, fn: Callable[[SqliteDict], T], default: T) -> T:
        with self._mutex:
            self._forget_parent_connection()
            for _attempt in range(2):  # a second try only after a corrupt file was replaced
                if not self.readable:
                    return default
                try:
                    db = self._connection(create=False)
                    return default if db is None else fn(db)
                except _STORE_ERRORS as exc:
                    if not self._recover(exc, writing=False):
                        return default
            return default

    def _write(self, fn: Callable[[SqliteDict], object], transaction: bool = True) -> bool:
        with self._mutex:
            self._forget_parent_connection()
            for _attempt in range(2):
                if not self.writable:
                    return False
                try:
                    with self._file_lock():
                        db = self._connection(create=True)
                        if transaction:
                            # sqlitedict's own commit() hangs its caller when COMMIT fails (the
                            # error kills its thread), so the transaction is plain SQL, whose
                            # errors come back to us.
                            db.conn.select_one("BEGIN IMMEDIATE")
                            fn(db)
                            db.conn.select_one("COMMIT")
                        else:
                            fn(db)
                    return True
                except _STORE_ERRORS as exc:
                    if not self._recover(exc, writing=True):
                        return False
                except BaseException:
                    self._drop_connection(wait=False)  # never leave a transaction open
                    raise
            return False

    def _forget_parent_connection(self) -> None:
        # A connection made before a fork belongs to the parent's sqlitedict thread, which the
        # child does not have (waiting on it would hang), and so does a held file lock.
        if self._pid != os.getpid():
            self._db, self._lock, self._pid = None, None, os.getpid()

    def _connection(self, create: bool) -> SqliteDict | None:
        if self._db is not None:
            return self._db
        if not self.path.exists():
            if not create:
                return None
            self.path.parent.mkdir(parents=True, exist_ok=True)
        # Taken before opening: a file that fails to open must still be recognised to be set aside.
        self._inode = _inode(self.path)
        if self._inode is not None:
            _probe(self.path, self.lock_timeout)
        db = _QuietSqliteDict(str(self.path), tablename=ENTRIES_TABLE, flag="c" if self.owned else "r",
                              journal_mode="DELETE", encode=_encode, decode=_decode, outer_stack=False)
        try:
            db.conn.select_one(f"PRAGMA busy_timeout = {int(self.lock_timeout * 1000)}")
            if self.owned:
                # sqlitedict turns syncing off; a cache that must survive power loss needs it.
                db.conn.select_one("PRAGMA synchronous = FULL")
                db.conn.select_one(f'CREATE TABLE IF NOT EXISTS "{LAST_USED_TABLE}" (key TEXT PRIMARY KEY, t REAL)')
        except BaseException:
            db.close(do_log=False, force=True)
            raise
        self._inode = self._inode or _inode(self.path)  # the file sqlitedict just created
        self._db = db
        return db

    def _file_lock(self) -> filelock.FileLock:
        if self._lock is None:
            self._lock = filelock.FileLock(str(self.lock_path), timeout=self.lock_timeout)
        return self._lock

    def _drop_connection(self, wait: bool) -> None:
        db, self._db = self._db, None
        if db is None:
            return
        # Only a live thread can be waited for; a dead one is told to close and left.
        alive = db.conn is not None and db.conn.is_alive()
        db.close(do_log=False, force=not (wait and alive))

    def _recover(self, exc: BaseException, writing: bool) -> bool:
        """Turn a failure into a state; True when the operation is worth one more try."""
        self._drop_connection(wait=False)
        code = getattr(exc, "sqlite_errorcode", 0) & 0xFF
        message = str(exc)
        if code in _CORRUPT_CODES or "not a database" in message or "malformed" in message:
            if self.owned and self._set_aside(message):
                return True
            self._disable(f"{self.path} is not a readable cache ({message}); not using it")
        elif isinstance(exc, filelock.Timeout):
            self._stop_writing(f"could not take the cache write lock {self.lock_path} within "
                               f"{self.lock_timeout:g} s: another process holds it (a hung cuda-agent "
                               f"process?); this process will not write to {self.path}")
        elif code in _BUSY_CODES or "locked" in message:
            what = f"{self.path} is locked by another process, which did not let go in time"
            if writing:
                self._stop_writing(f"{what}; this process will not write to it")
            else:
                self._disable(f"{what}; this process continues without it")
        elif writing:
            self._stop_writing(f"cannot write {self.path} ({message}); continuing without writing to it")
        else:
            self._disable(f"cannot read {self.path} ({message}); continuing without it")
        return False

    def _set_aside(self, why: str) -> bool:
        """Move a corrupt file (with its journal) out of the way so a fresh one takes its place.
        Another process may have done so already: then the path names a new file, kept as is."""
        try:
            with self._file_lock():
                if _inode(self.path) == self._inode:
                    aside = self.path.with_name(f"{self.path.name}.corrupt-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}")
                    for suffix in ("-journal", "-wal", "-shm", ""):
                        source = self.path.with_name(self.path.name + suffix)
                        if source.exists():
                            os.replace(source, aside.with_name(aside.name + suffix))
                    log.warning("cache file %s is damaged (%s): moved it to %s and started a fresh cache",
                                self.path, why, aside)
        except (OSError, filelock.Timeout):
            return False
        return True

    def _disable(self, why: str) -> None:
        self.readable = self.writable = False
        self._report(why)

    def _stop_writing(self, why: str) -> None:
        self.writable = False
        self._report(why)

    def _report(self, why: str) -> None:
        if self.problem is None:  # one warning per store: what follows from it is implied
            log.warning("%s", why)
        self.problem = self.problem or why


def _probe(path: Path, lock_timeout: float) -> None:
    """Read the schema once with our timeout: sqlitedict connects with sqlite3's fixed 5 s, so a
    file locked by a stuck process, or not a database at all, is caught here instead."""
    probe = sqlite3.connect(path, timeout=lock_timeout)
    try:
        probe.execute("SELECT count(*) FROM sqlite_master").fetchone()
    finally:
        probe.close()


def _inode(path: Path) -> int | None:
    try:
        return path.stat().st_ino
    except OSError:
        return None
