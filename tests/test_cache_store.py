"""The cache API never raises for a broken cache: damaged files are set aside, locks time out
with a clear message, and a cache that cannot be written degrades to not writing."""
import logging
import os
import sqlite3
import tempfile
import time
from pathlib import Path

import pytest
from cache_helpers import finish, is_whole, make_test_entry, make_test_key, run_helper

from kernel_cache import KernelCache

LOG = "cuda_agent.cache"


def _fill(cache_dir: Path, count: int, binary_bytes: int = 4096) -> list:
    keys = [make_test_key(i) for i in range(count)]
    with KernelCache.open(cache_dir) as cache:
        for key in keys:
            assert cache.put(key, make_test_entry(key, binary_bytes=binary_bytes))
    return keys


def _set_aside(cache_dir: Path) -> list[Path]:
    return sorted(cache_dir.glob("cache.sqlite.corrupt-*"))


def test_put_get_touch_items(cache_dir):
    key, missing = make_test_key("a"), make_test_key("b")
    with KernelCache.open() as cache:
        assert cache.get(key) is None
        assert cache.put(key, make_test_entry(key, last_used=0.0))
        lookup = cache.get(key)
        assert (lookup.layer, lookup.trusted) == ("local", True)
        assert is_whole(key.digest, lookup.entry)
        first_use = lookup.entry.last_used
        time.sleep(0.01)
        cache.touch(key)
        cache.touch(missing)
    with KernelCache.open() as cache:  # touches are written by close
        assert cache.get(key).entry.last_used > first_use
        assert [digest for digest, _ in cache.items()] == [key.digest]
        assert cache.get(missing) is None


def test_put_refuses_an_entry_made_for_another_key(cache_dir):
    with KernelCache.open() as cache, pytest.raises(ValueError):
        cache.put(make_test_key("a"), make_test_entry(make_test_key("b")))


def test_garbage_file_is_set_aside_and_a_fresh_cache_used(cache_dir, caplog):
    cache_dir.mkdir()
    garbage = os.urandom(50_000)
    (cache_dir / "cache.sqlite").write_bytes(garbage)
    key = make_test_key()
    with caplog.at_level(logging.WARNING, LOG), KernelCache.open() as cache:
        assert cache.get(key) is None
        assert cache.put(key, make_test_entry(key))
        assert cache.get(key) is not None
    [aside] = _set_aside(cache_dir)
    assert aside.read_bytes() == garbage
    assert "damaged" in caplog.text and str(aside) in caplog.text


def test_truncated_file_never_raises_and_is_set_aside(cache_dir, caplog):
    keys = _fill(cache_dir, 60, binary_bytes=20_000)
    path = cache_dir / "cache.sqlite"
    with open(path, "r+b") as f:
        f.truncate(path.stat().st_size // 3)
    with caplog.at_level(logging.WARNING, LOG), KernelCache.open() as cache:
        for key in keys:
            found = cache.get(key)
            assert found is None or is_whole(key.digest, found.entry)  # what still reads is right
        list(cache.items())
        assert cache.put(keys[0], make_test_entry(keys[0]))
        assert cache.get(keys[0]) is not None
    assert len(_set_aside(cache_dir)) == 1 and "damaged" in caplog.text


def test_unreadable_row_is_a_miss_and_the_others_still_read(cache_dir, caplog):
    keys = _fill(cache_dir, 3)
    with sqlite3.connect(cache_dir / "cache.sqlite") as db:
        db.execute("UPDATE entries SET value = ? WHERE key = ?", ("{not json", keys[0].digest))
        # A whole entry copied under another key must not answer for that key.
        db.execute("UPDATE entries SET value = (SELECT value FROM entries WHERE key = ?) WHERE key = ?",
                   (keys[2].digest, keys[1].digest))
    with caplog.at_level(logging.WARNING, LOG), KernelCache.open() as cache:
        assert cache.get(keys[0]) is None and cache.get(keys[1]) is None
        assert is_whole(keys[2].digest, cache.get(keys[2]).entry)
        assert [d for d, _ in cache.items()] == [keys[2].digest]
    assert "not a JSON object" in caplog.text and "not made for" in caplog.text
    assert not _set_aside(cache_dir)  # a bad row is not a bad file


def test_file_locked_forever_times_out_with_a_clear_message(cache_dir, caplog):
    keys = _fill(cache_dir, 2)
    locker = run_helper("hold-sqlite-lock", str(cache_dir / "cache.sqlite"))
    try:
        assert locker.stdout.readline().strip() == "locked"
        start = time.monotonic()
        with caplog.at_level(logging.WARNING, LOG):
            cache = KernelCache.open(lock_timeout=0.5)
            assert cache.get(keys[0]) is None
            assert cache.get(keys[1]) is None  # the store gave up on the file: no second wait
            assert not cache.put(keys[0], make_test_entry(keys[0]))
            cache.close()
        assert time.monotonic() - start < 3
    finally:
        locker.kill()
        locker.communicate()
    [warning] = [r.getMessage() for r in caplog.records]
    assert "locked by another process" in warning and str(cache_dir / "cache.sqlite") in warning


def test_write_lock_held_forever_times_out_naming_the_lock_file(cache_dir, caplog):
    keys = _fill(cache_dir, 1)
    lock_file = cache_dir / "cache.sqlite.lock"
    locker = run_helper("hold-file-lock", str(lock_file))
    try:
        assert locker.stdout.readline().strip() == "locked"
        with caplog.at_level(logging.WARNING, LOG), KernelCache.open(lock_timeout=0.5) as cache:
            new = make_test_key("new")
            assert not cache.put(new, make_test_entry(new))
            assert cache.get(keys[0]) is not None  # reading needs no write lock
            start = time.monotonic()
            assert not cache.put(new, make_test_entry(new))
            assert time.monotonic() - start < 0.2  # the timeout is paid once
    finally:
        locker.kill()
        locker.communicate()
    [warning] = [r.getMessage() for r in caplog.records]
    assert str(lock_file) in warning and "0.5 s" in warning


@pytest.fixture
def shared_dir():
    """A directory an unprivileged user can reach (pytest's tmp_path is private to root)."""
    with tempfile.TemporaryDirectory(prefix="cuda-agent-test-") as d:
        os.chmod(d, 0o755)
        yield Path(d)


@pytest.mark.skipif(not hasattr(os, "geteuid"), reason="POSIX permissions")
def test_read_only_directory_reads_but_never_writes(shared_dir):
    cache_dir = shared_dir / "cache"
    existing = make_test_key("existing")
    with KernelCache.open(cache_dir) as cache:
        assert cache.put(existing, make_test_entry(existing))
    cache_dir.chmod(0o555)  # the worker drops root, which writes through permission bits
    try:
        report = finish(run_helper("degraded", str(cache_dir), "read-only"))
    finally:
        cache_dir.chmod(0o755)
    assert report["found_existing"] and report["puts"] == [False, False, False] and not report["found_new"]
    [warning] = report["warnings"]
    assert "read-only" in warning


def test_unwritable_cache_directory_means_no_cache(shared_dir):
    shared_dir.chmod(0o555)
    try:
        report = finish(run_helper("degraded", str(shared_dir / "cache"), "read-only"))
    finally:
        shared_dir.chmod(0o755)
    assert report["puts"] == [False, False, False] and not report["found_existing"]
    [warning] = report["warnings"]
    assert "cannot be written" in warning


def test_full_disk_degrades_to_not_writing_and_keeps_the_file(cache_dir):
    existing = make_test_key("existing")
    with KernelCache.open() as cache:
        assert cache.put(existing, make_test_entry(existing))
    report = finish(run_helper("degraded", str(cache_dir), "disk-full"))
    assert report["found_existing"] and report["puts"] == [False, False, False] and not report["found_new"]
    [warning] = report["warnings"]
    assert "cannot write" in warning
    with KernelCache.open() as cache:  # the failed writes left the file whole
        assert is_whole(existing.digest, cache.get(existing).entry)
        assert cache.put(make_test_key("after"), make_test_entry(make_test_key("after")))


@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded")  # forking one is the point
def test_a_forked_child_uses_the_cache_without_hanging(cache_dir):
    key, child_key = make_test_key("parent"), make_test_key("child")
    cache = KernelCache.open()
    assert cache.put(key, make_test_entry(key))
    pid = os.fork()
    if pid == 0:  # the child: its copy of the parent's connection has no thread behind it
        ok = cache.get(key) is not None and cache.put(child_key, make_test_entry(child_key))
        os._exit(0 if ok else 1)
    deadline = time.monotonic() + 20
    while (waited := os.waitpid(pid, os.WNOHANG)) == (0, 0) and time.monotonic() < deadline:
        time.sleep(0.05)
    if waited == (0, 0):
        os.kill(pid, 9)
        pytest.fail("the forked child hung on the inherited cache")
    assert os.waitstatus_to_exitcode(waited[1]) == 0
    assert cache.get(child_key) is not None
    cache.close()


def test_content_token_follows_writes_of_entries_not_uses(cache_dir):
    key, other = make_test_key("a"), make_test_key("b")
    with KernelCache.open() as cache:
        tokens = [cache.content_token()]
        assert cache.put(key, make_test_entry(key))
        tokens.append(cache.content_token())
        cache.touch(key)
        cache.flush()
        assert cache.content_token() == tokens[-1], "recording a use is not a change of content"
        assert cache.put(other, make_test_entry(other))
        tokens.append(cache.content_token())
        assert cache.local.store.delete([other.digest])
        tokens.append(cache.content_token())
        assert cache.local.store.clear()
        tokens.append(cache.content_token())
    assert None not in tokens and len(set(tokens)) == len(tokens), tokens


def test_content_token_never_repeats_in_a_new_file(cache_dir):
    with KernelCache.open() as cache:
        before = cache.content_token()
    for path in cache_dir.iterdir():
        path.unlink()
    with KernelCache.open() as cache:
        assert cache.content_token() not in (None, before)


def test_file_without_a_generation_count_gets_one(cache_dir):
    _fill(cache_dir, 1)
    with sqlite3.connect(cache_dir / "cache.sqlite") as db:  # as a file of an older version has it
        db.execute("DROP TABLE meta")
    with KernelCache.open() as cache:
        assert cache.local.store.content_token() is None
        assert cache.content_token() is not None and cache.local.store.content_token() is not None


def test_no_content_token_where_results_would_not_persist(cache_dir):
    with KernelCache.open() as cache:
        cache.local.store.writable = False  # what a read-only or full cache degrades to
        assert cache.content_token() is None
