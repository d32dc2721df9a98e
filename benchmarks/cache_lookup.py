"""Kernel cache lookup latency with many entries, and the size of one entry with its binaries.

    python benchmarks/cache_lookup.py                  # 10,000 entries, 32 KiB cubin each
    python benchmarks/cache_lookup.py --binary-kib 128 --json

Fills a fresh cache in a temporary directory (signed, as a team would), then times `get` for
hits and misses in the local cache, and for hits that fall through to a team layer. CPU only:
the cache never touches the GPU.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from kernel_cache import CacheKey, Entry, KernelCache
from kernel_cache.keys import canonical_json

TRUST_KEY = "benchmark key"
PRECISION = {"allow_reduced_precision": False, "allow_tf32": False, "matmul_precision": "highest"}


def key_for(i: int) -> CacheKey:
    return CacheKey(task_hash=f"{i:064x}", inputs=(f"float16[{i % 64 + 1},4096]/[4096,1]@cuda", "float16[4096]/[1]@cuda"),
                    gpu="NVIDIA H100 80GB HBM3", capability="9.0", sm_count=132, torch="2.11.0+cu128",
                    cuda="12.8", compiler="nvrtc 12.8", precision=canonical_json(PRECISION))


def entry_for(key: CacheKey, binary_bytes: int, source_bytes: int) -> Entry:
    # A KernelBench-style ModelNew with its CUDA source inline, and one cubin.
    return Entry(
        outcome="kernel", reason="1.42x over Inductor", source="#" * source_bytes, origin="builtin:pointwise:b256v4",
        binaries={"sm_90": os.urandom(binary_bytes)},
        launch={"kernel": "fused_bias_gelu", "grid": [1024, 1, 1], "block": [256, 1, 1], "shared_mem": 0,
                "arg_types": ["ptr", "ptr", "ptr", "i64"]},
        timings={"ours_ms": 0.0213, "inductor_ms": 0.0302, "eager_ms": 0.0811,
                 "trials": {"ours": 200, "inductor": 200, "eager": 200}},
        verification={"passed": True, "trials": 5, "max_error": 3.1e-3, "value_ranges": [1, 10, 100]},
        provenance={"policy": "builtin", "model": None, "host": "bench", "time": time.time(),
                    "project_version": "0.1.0"},
        task={"hash": key.task_hash, "program": "#" * 1500, "inputs": [], "outputs": [],
              "ops": ["aten.add.Tensor", "aten.gelu.default"], "kind": "pointwise"},
    )


def fill(cache_dir: Path, entries: int, binary_bytes: int, source_bytes: int) -> float:
    start = time.perf_counter()
    with KernelCache.open(cache_dir, team=[], trust_key=TRUST_KEY) as cache:
        for first in range(0, entries, 500):  # one transaction per 500, as a warm run would batch
            batch = [(key_for(i), entry_for(key_for(i), binary_bytes, source_bytes))
                     for i in range(first, min(first + 500, entries))]
            if not cache.put_many(batch):
                sys.exit(f"could not fill the cache: {cache.local.store.problem}")
    return time.perf_counter() - start


def time_gets(cache: KernelCache, keys: list[CacheKey]) -> dict:
    """Microseconds per `get`, key digest included (a caller computes it once per lookup)."""
    samples = []
    for key in keys:
        key = replace(key)  # a fresh object, whose digest is not cached yet
        start = time.perf_counter()
        cache.get(key)
        samples.append((time.perf_counter() - start) * 1e6)
    samples.sort()
    return {"n": len(samples), "mean_us": round(statistics.fmean(samples), 1),
            "p50_us": round(samples[len(samples) // 2], 1), "p90_us": round(samples[int(len(samples) * 0.9)], 1),
            "p99_us": round(samples[int(len(samples) * 0.99)], 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--entries", type=int, default=10_000)
    parser.add_argument("--binary-kib", type=float, default=32, help="cubin size per entry")
    parser.add_argument("--source-kib", type=float, default=4, help="candidate source size per entry")
    parser.add_argument("--lookups", type=int, default=2_000)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    binary_bytes, source_bytes = int(args.binary_kib * 1024), int(args.source_kib * 1024)
    rng = random.Random(0)
    results = {"entries": args.entries, "binary_bytes": binary_bytes, "source_bytes": source_bytes}
    with tempfile.TemporaryDirectory() as tmp:
        local_dir, team_dir = Path(tmp) / "local", Path(tmp) / "team"
        results["fill_s"] = round(fill(local_dir, args.entries, binary_bytes, source_bytes), 2)
        start = time.perf_counter()
        cache = KernelCache.open(local_dir, team=[], trust_key=TRUST_KEY)
        cache.get(key_for(0))
        results["open_and_first_get_us"] = round((time.perf_counter() - start) * 1e6, 1)
        hits = [key_for(rng.randrange(args.entries)) for _ in range(args.lookups)]
        misses = [key_for(args.entries + i) for i in range(args.lookups)]
        results["local_hit"] = time_gets(cache, hits)
        results["miss"] = time_gets(cache, misses)
        sizes = cache.local.store.value_sizes()
        results["entry_bytes_mean"] = round(statistics.fmean(sizes.values()))
        results["file_bytes"] = cache.local.store.file_bytes()
        start = time.perf_counter()
        scanned = sum(1 for _ in cache.items())
        results["scan_all_s"] = round(time.perf_counter() - start, 2)
        assert scanned == args.entries
        cache.close()
        # The same file as a teammate's cache: an empty local cache falls through to it, and with
        # no trust key every hit there is untrusted (checked, not copied), so each lookup walks
        # all layers.
        (local_dir / "cache.sqlite").rename(team_dir.with_suffix(".sqlite"))
        with KernelCache.open(Path(tmp) / "empty", team=[team_dir.with_suffix(".sqlite")], trust_key=None) as team:
            results["team_hit_untrusted"] = time_gets(team, hits)
    if args.json:
        print(json.dumps(results, indent=2))
        return
    print(f"{args.entries} entries, {binary_bytes} B cubin + {source_bytes} B source each: "
          f"filled in {results['fill_s']} s, file {results['file_bytes'] / 1e6:.1f} MB")
    print(f"one entry as stored: {results['entry_bytes_mean']} B (binaries are base64 inside the JSON)")
    print(f"open + first get: {results['open_and_first_get_us']} us; scan of all entries: {results['scan_all_s']} s")
    for name in ("local_hit", "miss", "team_hit_untrusted"):
        r = results[name]
        print(f"get, {name:18}: mean {r['mean_us']:7} us  p50 {r['p50_us']:7}  p90 {r['p90_us']:7}  p99 {r['p99_us']:7}")


if __name__ == "__main__":
    main()
