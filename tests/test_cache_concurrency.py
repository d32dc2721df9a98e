"""Many processes share one cache file: nothing is lost, nothing is torn, and a writer killed
mid-write leaves every committed entry intact."""
import os
import signal
import time

from cache_helpers import finish, is_whole, make_test_entry, make_test_key, run_helper

from kernel_cache import KernelCache

WORKERS, PER_WORKER = 8, 25


def test_eight_processes_writing_and_reading_lose_nothing(cache_dir):
    workers = [run_helper("write-and-read", str(cache_dir), str(w), str(PER_WORKER), str(WORKERS))
               for w in range(WORKERS)]
    reports = [finish(w, timeout=120) for w in workers]
    assert sum(r["torn"] for r in reports) == 0
    assert sum(r["reads"] for r in reports) > 0, "the workers never saw each other's entries"
    with KernelCache.open() as cache:
        stored = dict(cache.items())
    expected = {make_test_key(f"{w}-{i}").digest for w in range(WORKERS) for i in range(PER_WORKER)}
    assert stored.keys() == expected
    assert all(is_whole(digest, entry) for digest, entry in stored.items())


def test_writer_killed_mid_write_leaves_every_committed_entry(cache_dir):
    journal = cache_dir / "cache.sqlite-journal"
    writer = run_helper("commit-then-write-forever", str(cache_dir), "20")
    committed = []
    try:
        while (line := writer.stdout.readline().strip()) != "batch":
            assert line.startswith("committed "), line + writer.stderr.read()
            committed.append(line.split()[1])
        deadline = time.monotonic() + 30
        while not journal.exists():  # the batch's transaction is open and writing
            assert time.monotonic() < deadline and writer.poll() is None, "the batch never started writing"
            time.sleep(0.002)
        writer.send_signal(signal.SIGKILL)
    finally:
        writer.kill()
        writer.communicate()
    assert writer.returncode == -signal.SIGKILL
    assert journal.exists(), "killed outside the transaction: this run proves nothing"
    assert len(committed) == 20
    with KernelCache.open() as cache:
        stored = dict(cache.items())
        assert set(committed) <= stored.keys()
        assert all(is_whole(digest, entry) for digest, entry in stored.items())
        batch = stored.keys() - set(committed)
        assert len(batch) in (0, 200), "the killed transaction was applied in part"
        after = make_test_key("after the kill")
        assert cache.put(after, make_test_entry(after))  # the dead writer's lock went with it
    assert not journal.exists() and not list(cache_dir.glob("*.corrupt-*"))
    assert os.path.getsize(cache_dir / "cache.sqlite") > 0
