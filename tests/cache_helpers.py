"""Shared by the test_cache_* files: keys and entries whose content can be checked for
wholeness, and worker programs the tests run as real, separate processes
(`python tests/cache_helpers.py WORKER ARGS...`)."""
from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import subprocess
import sys
import time
from pathlib import Path

from kernel_cache import CacheKey, Entry, KernelCache
from kernel_cache.keys import canonical_json

HELPERS = Path(__file__).resolve()
REPO = HELPERS.parents[1]
PRECISION = {"allow_reduced_precision": False, "allow_tf32": False, "matmul_precision": "highest"}


def make_test_key(name: str | int = 0, **changes) -> CacheKey:
    parts = dict(task_hash=f"task-{name}", inputs=("float32[64,64]/[64,1]@cuda", "float32[64]/[1]@cuda"),
                 gpu="NVIDIA H100 80GB HBM3", capability="9.0", sm_count=132, torch="2.11.0+cu128",
                 cuda="12.8", compiler="nvrtc 12.8", precision=canonical_json(PRECISION))
    return CacheKey(**{**parts, **changes})


def make_test_entry(for_key: CacheKey, *, binary_bytes: int = 4096, ours_ms: float = 1.0, **changes) -> Entry:
    """A verified kernel for `for_key` whose source and binary are derived from the key, so a
    reader can tell a whole entry from a torn or mixed-up one (`is_whole`)."""
    key = for_key
    fields = dict(key=key.to_json(),
        outcome="kernel", reason="1.50x over Inductor", source=_source_for(key.digest), origin="test:template",
        binaries={"sm_90": _binary_for(key.digest, binary_bytes)},
        launch={"grid": [64, 1, 1], "block": [256, 1, 1], "shared_mem": 0, "kernel": "fused_add_relu"},
        timings={"ours_ms": _stats(ours_ms), "inductor_ms": _stats(1.5), "eager_ms": _stats(3.0),
                 "speedup_vs_inductor": 1.5 / ours_ms},
        verification={"passed": True, "trials": 5, "max_error": 1.2e-6},
        provenance={"policy": "builtin", "model": None, "host": "test-host", "time": 1700000000.0,
                    "project_version": "0.1.0"},
        task={"hash": key.task_hash, "program": "class Model: ...", "inputs": [], "outputs": [], "ops": [],
              "kind": "pointwise"},
        created=1700000000.0, last_used=1700000000.0,
    )
    return Entry(**{**fields, **changes})


def _stats(median_ms: float) -> dict:
    """Timing stats as a search stores them (env/profile.summarize)."""
    return {"median": median_ms, "p10": 0.9 * median_ms, "p90": 1.1 * median_ms, "trials": 100,
            "host_median": 0.01}


def is_whole(digest: str, entry: Entry) -> bool:
    binary = entry.binaries.get("sm_90", b"")
    return entry.source == _source_for(digest) and binary == _binary_for(digest, len(binary)) and len(binary) > 0


def _source_for(digest: str) -> str:
    return f"// kernel for {digest}\n" + "".join(f"// line {i} {digest[i % 64]}\n" for i in range(50))


def _binary_for(digest: str, size: int) -> bytes:
    block = hashlib.sha256(digest.encode()).digest()
    return (block * (size // len(block) + 1))[:size]


def run_helper(*args: str, env: dict | None = None, cwd: Path | None = None) -> subprocess.Popen:
    """Start a worker below in a fresh Python process, with `env` added to ours."""
    env = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
    return subprocess.Popen([sys.executable, str(HELPERS), *args], env=env, cwd=cwd, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def finish(process: subprocess.Popen, timeout: float = 60) -> dict:
    """Wait for a worker; its last stdout line is a JSON report."""
    out, err = process.communicate(timeout=timeout)
    assert process.returncode == 0, f"worker failed ({process.returncode}):\n{out}\n{err}"
    return json.loads(out.strip().splitlines()[-1])


# -- workers ------------------------------------------------------------------------------------

class _Warnings(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages: list[str] = []
        logging.getLogger("cuda_agent.cache").addHandler(self)

    def emit(self, record):
        self.messages.append(record.getMessage())


def write_and_read(cache_dir: str, worker: str, count: str, workers: str) -> None:
    """Write `count` entries, and after each, read one another worker may have written."""
    rng = random.Random(worker)
    reads = torn = 0
    with KernelCache.open(cache_dir, lock_timeout=30) as cache:
        for i in range(int(count)):
            key = make_test_key(f"{worker}-{i}")
            assert cache.put(key, make_test_entry(key, binary_bytes=rng.randrange(1_000, 60_000)))
            other = make_test_key(f"{rng.randrange(int(workers))}-{rng.randrange(i + 1)}")
            found = cache.get(other)
            if found is not None:
                reads += 1
                torn += not is_whole(other.digest, found.entry)
    print(json.dumps({"reads": reads, "torn": torn}))


def commit_then_write_forever(cache_dir: str, committed: str) -> None:
    """Commit entries one by one (saying so after each), then write a huge batch in one
    transaction, to be killed in the middle of it."""
    with KernelCache.open(cache_dir) as cache:
        for i in range(int(committed)):
            key = make_test_key(f"committed-{i}")
            assert cache.put(key, make_test_entry(key))
            print(f"committed {key.digest}", flush=True)
        batch = [(key, make_test_entry(key, binary_bytes=300_000))
                 for key in (make_test_key(f"batch-{i}") for i in range(200))]
        print("batch", flush=True)
        cache.put_many(batch)
        print("batch committed", flush=True)
        time.sleep(60)


def degraded(cache_dir: str, condition: str) -> None:
    """Use a cache that cannot be written: `read-only` runs as an unprivileged user when we are
    root (root writes through permission bits), `disk-full` caps the size of files we write."""
    if condition == "read-only" and os.geteuid() == 0:
        os.setgid(65534)
        os.setuid(65534)
    if condition == "disk-full":
        import resource
        import signal
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # fail the write with EFBIG, not the process
        resource.setrlimit(resource.RLIMIT_FSIZE, (256 * 1024, 256 * 1024))
    warnings = _Warnings()
    with KernelCache.open(cache_dir) as cache:
        found = cache.get(make_test_key("existing")) is not None
        puts = []
        for i in range(3):
            key = make_test_key(f"new-{i}")
            puts.append(cache.put(key, make_test_entry(key, binary_bytes=1_000_000)))
            cache.touch(key)
        new_found = cache.get(make_test_key("new-0")) is not None
    print(json.dumps({"found_existing": found, "puts": puts, "found_new": new_found,
                      "warnings": warnings.messages}))


def hold_sqlite_lock(path: str) -> None:
    import sqlite3
    connection = sqlite3.connect(path)
    connection.execute("BEGIN EXCLUSIVE")
    print("locked", flush=True)
    time.sleep(120)


def hold_file_lock(path: str) -> None:
    import filelock
    lock = filelock.FileLock(path)
    lock.acquire()
    print("locked", flush=True)
    time.sleep(120)
    lock.release()


def print_key(task_hash: str) -> None:
    from agent_backend.specs import TensorSpec
    from kernel_cache import make_key
    inputs = [TensorSpec((8, 16), (16, 1), "float16", "cpu"), TensorSpec((16,), (1,), "float16", "cpu")]
    print(json.dumps({"digest": make_key(task_hash, inputs, "cpu", PRECISION).digest}))


WORKERS = {"write-and-read": write_and_read, "commit-then-write-forever": commit_then_write_forever,
           "degraded": degraded, "hold-sqlite-lock": hold_sqlite_lock, "hold-file-lock": hold_file_lock,
           "print-key": print_key}

if __name__ == "__main__":
    WORKERS[sys.argv[1]](*sys.argv[2:])
