"""`cuda-agent cache ...`: look into, share and trim the kernel cache.

The project's CLI adds these commands with `add_cache_parser(subparsers)` and runs them with
`run_cache_command(args, verifier)`; `python -m kernel_cache.cli cache ...` runs them alone.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import re
import sys
import time
from collections import Counter
from typing import Callable

from .bundle import BundleError, export_bundle, import_bundle, merge_bundles
from .entry import Entry
from .filters import FIELDS, parse_filter
from .keys import CacheKey
from .layers import KernelCache, Layer, Row
from .prune import prune
from .trust import Signature, check_signature

# verifier(entry) -> (passed, why); it may record what it ran in entry.verification (the rules it
# verified under: a compile verifies again an entry recorded under other rules), which a pass keeps.
Verifier = Callable[[Entry], "tuple[bool, str]"]


def add_cache_parser(subparsers) -> argparse.ArgumentParser:
    """Add the `cache` command and its sub-commands to an argparse subparsers object."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--cache-dir", help="the local cache (default: $CUDA_AGENT_CACHE_DIR, "
                                            "else $XDG_CACHE_HOME/cuda_agent, else ~/.cache/cuda_agent)")
    common.add_argument("--team", help="team caches or bundles, separated by ':' (default: $CUDA_AGENT_TEAM_CACHE)")
    common.add_argument("--json", action="store_true", help="print JSON for a program to read")
    filters = argparse.ArgumentParser(add_help=False)
    filters.add_argument("--filter", action="append", default=[], metavar="FIELD=TEXT",
                         help=f"only entries whose FIELD contains TEXT; FIELD is one of {', '.join(FIELDS)}; repeatable")

    cache = subparsers.add_parser("cache", help="inspect, share and prune the kernel cache",
                                  description="Inspect, share and prune the kernel cache (docs/CACHE.md).")
    commands = cache.add_subparsers(dest="cache_command", required=True, metavar="COMMAND")
    commands.add_parser("ls", parents=[common, filters], help="list entries of every layer")
    show = commands.add_parser("show", parents=[common], help="show one entry in full")
    show.add_argument("key", help="a key digest, or a prefix of one that names a single key")
    commands.add_parser("stats", parents=[common], help="sizes and counts per layer")
    export = commands.add_parser("export", parents=[common, filters], help="write local entries to a bundle")
    export.add_argument("out", help="the bundle file to write")
    import_ = commands.add_parser("import", parents=[common], help="add a bundle's entries to the cache")
    import_.add_argument("file", help="a bundle or cache file")
    merge = commands.add_parser("merge", parents=[common], help="combine bundles into one")
    merge.add_argument("inputs", nargs="+", help="bundles, cache files or cache directories")
    merge.add_argument("-o", "--out", required=True, help="the bundle file to write")
    verify = commands.add_parser("verify", parents=[common], help="check the local and imported entries")
    verify.add_argument("--drop-failed", action="store_true", help="delete the entries that fail")
    prune_ = commands.add_parser("prune", parents=[common], help="remove old entries, or the least "
                                                                 "recently used beyond a size")
    prune_.add_argument("--max-age", type=float, metavar="DAYS", help="remove entries unused for longer")
    prune_.add_argument("--max-size", type=parse_size, metavar="SIZE",
                        help="then remove the least recently used until the entries take at most SIZE (e.g. 500M, 2G)")
    prune_.add_argument("--dry-run", action="store_true", help="only say what would be removed")
    commands.add_parser("clear", parents=[common], help="remove every local and imported entry")
    return cache


def run_cache_command(args: argparse.Namespace, verifier: Verifier | None = None) -> int:
    """Run a parsed `cache` command; `verifier(entry) -> (passed, why)` runs the GPU check for
    `verify`. Returns the exit status."""
    try:
        filters = [parse_filter(text) for text in getattr(args, "filter", [])]
    except ValueError as exc:
        print(f"cuda-agent cache: {exc}", file=sys.stderr)
        return 2
    try:
        with KernelCache.open(args.cache_dir, team=args.team) as cache:
            if args.cache_command == "verify":
                return _verify(cache, args, verifier)
            return _COMMANDS[args.cache_command](cache, args, filters)
    except BundleError as exc:
        print(f"cuda-agent cache: {exc}", file=sys.stderr)
        return 1


def parse_size(text: str) -> int:
    found = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)i?b?\s*", text.lower())
    if not found:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size such as 500M or 2G")
    return int(float(found.group(1)) * 1024 ** " kmgt".index(found.group(2) or " "))


# -- commands -----------------------------------------------------------------------------------

def _ls(cache: KernelCache, args, filters) -> int:
    listed = [_summary(layer, row, cache) for layer in cache.layers for row in layer.rows()
              if row.entry is None or all(f(row.entry) for f in filters)]
    if args.json:
        return _print_json(listed)
    print(f"{'KEY':14} {'OUTCOME':8} {'GPU':28} {'TASK':14} {'OURS MS':>9} {'INDUCTOR':>9} {'SPEEDUP':>7}  "
          f"{'LAST USED':16}  LAYER")
    for s in listed:
        if s["problem"]:
            print(f"{s['key'][:12]:14} unreadable: {s['problem']}  {s['layer']}")
            continue
        print(f"{s['key'][:12]:14} {s['outcome']:8} {s['gpu'][:28]:28} {s['task'][:12]:14} {_ms(s['ours_ms']):>9} "
              f"{_ms(s['inductor_ms']):>9} {_speedup(s):>7}  {_when(s['last_used']):16}  {s['layer']}")
    print(f"{len(listed)} entries")
    return 0


def _show(cache: KernelCache, args, _filters) -> int:
    found = [(layer, layer.row(digest)) for layer in cache.layers for digest in layer.store.digests()
             if digest.startswith(args.key)]
    digests = sorted({row.digest for _, row in found})
    if len(digests) != 1:
        why = "no entry has" if not digests else f"{len(digests)} keys have"
        print(f"cuda-agent cache: {why} a digest starting with {args.key!r}", *digests, sep="\n", file=sys.stderr)
        return 1
    layer, row = found[0]  # layers are in lookup order: this is the one a lookup would see first
    shown = {**_summary(layer, row, cache), "also_in": [lay.name for lay, _ in found[1:]]}
    if row.entry is not None:
        shown["entry"] = {**row.entry.to_json(), "binaries": {
            arch: {"bytes": len(blob), "sha256": hashlib.sha256(blob).hexdigest()}
            for arch, blob in row.entry.binaries.items()}}
    if args.json:
        return _print_json(shown)
    source = shown.get("entry", {}).pop("source", None)
    print(json.dumps(shown, indent=2))
    if source:
        print("\n# source\n" + source)
    return 0


def _stats(cache: KernelCache, args, _filters) -> int:
    report = []
    for layer in cache.layers:
        rows = list(layer.rows())
        entries = [row.entry for row in rows if row.entry is not None]
        uses = [e.last_used for e in entries if e.last_used]
        report.append({
            "layer": layer.name, "path": str(layer.store.path), "problem": layer.store.problem,
            "entries": len(entries), "unreadable": len(rows) - len(entries),
            "outcomes": dict(Counter(e.outcome for e in entries)),
            "gpus": dict(Counter(f"{e.key['gpu']['name']} ({e.key['gpu']['capability']})" for e in entries)),
            "value_bytes": sum(layer.store.value_sizes().values()), "file_bytes": layer.store.file_bytes(),
            "oldest_use": min(uses, default=None), "newest_use": max(uses, default=None),
        })
    if args.json:
        return _print_json(report)
    for s in report:
        print(f"{s['layer']}: {s['entries']} entries ({s['unreadable']} unreadable), "
              f"{s['value_bytes'] / 1e6:.1f} MB in entries, {s['file_bytes'] / 1e6:.1f} MB on disk")
        if s["problem"]:
            print(f"  not fully usable: {s['problem']}")
        for name, counts in (("outcomes", s["outcomes"]), ("gpus", s["gpus"])):
            if counts:
                print(f"  {name}: " + ", ".join(f"{k} {v}" for k, v in counts.items()))
        if s["oldest_use"]:
            print(f"  used between {_when(s['oldest_use'])} and {_when(s['newest_use'])}")
    return 0


def _export(cache: KernelCache, args, filters) -> int:
    written = export_bundle(cache, args.out, filters)
    result = {"path": args.out, "written": written, "signed": bool(cache.trust_key)}
    if args.json:
        return _print_json(result)
    print(f"wrote {written} entries to {args.out}" + (", signed" if cache.trust_key else
                                                      " (unsigned: set CUDA_AGENT_TRUST_KEY to sign them)"))
    return 0


def _import(cache: KernelCache, args, _filters) -> int:
    report = import_bundle(cache, args.file)
    if args.json:
        return _print_json(report.to_json())
    print(f"imported {report.written} entries from {args.file}: {report.trusted} signed with the trust key "
          f"(now local), {report.untrusted} to verify before use (imported layer)")
    _print_problems(report)
    return 0


def _merge(cache: KernelCache, args, _filters) -> int:
    report = merge_bundles(args.inputs, args.out, cache.trust_key)
    if args.json:
        return _print_json(report.to_json())
    print(f"wrote {report.written} entries to {args.out}")
    _print_problems(report)
    return 0


def _verify(cache: KernelCache, args, verifier: Verifier | None) -> int:
    results = []
    for layer in (cache.local, cache.imported):
        failed = []
        for row in layer.rows():
            passed, why = _check_without_gpu(row, cache)
            if passed and verifier is not None and row.entry.outcome == "kernel":
                passed, why = _run_verifier(verifier, row.entry)
            result = {"key": row.digest, "layer": layer.name, "passed": passed, "why": why}
            if passed and verifier is not None and not layer.is_local:
                # Verified on this machine now: it becomes a local, trusted entry.
                result["promoted"] = cache.put(CacheKey.from_json(row.entry.key), row.entry)
            elif passed and verifier is not None and row.entry.outcome == "kernel":
                result["recorded"] = cache.put(CacheKey.from_json(row.entry.key), row.entry)  # what it ran
            if not passed:
                failed.append(row.digest)
            results.append(result)
        if failed and args.drop_failed:
            layer.store.delete(failed)
    gpu_note = "run" if verifier is not None else "not run: no verifier given, so only format, key, signature " \
                                                  "and recorded evidence were checked"
    if args.json:
        _print_json({"gpu_verification": gpu_note, "results": results})
    else:
        for r in results:
            print(f"{'ok  ' if r['passed'] else 'FAIL'} {r['key'][:12]}  {r['layer']}  {r['why']}"
                  + ("  (now local)" if r.get("promoted") else ""))
        print(f"{sum(r['passed'] for r in results)} of {len(results)} entries passed; GPU verification {gpu_note}")
    return 0 if all(r["passed"] for r in results) else 1


def _prune(cache: KernelCache, args, _filters) -> int:
    if args.max_age is None and args.max_size is None:
        print("cuda-agent cache prune: give --max-age DAYS, --max-size SIZE or both", file=sys.stderr)
        return 2
    max_age_s = None if args.max_age is None else args.max_age * 86400
    reports = [prune(layer.store, max_age_s=max_age_s, max_bytes=args.max_size, dry_run=args.dry_run)
               for layer in (cache.local, cache.imported)]
    if args.json:
        return _print_json([r.to_json() for r in reports])
    for r in reports:
        print(f"{r.path}: {'would remove' if args.dry_run else 'removed'} {r.removed}, kept {r.kept}; "
              f"entries {r.bytes_before / 1e6:.1f} MB -> {r.bytes_after / 1e6:.1f} MB")
    return 0


def _clear(cache: KernelCache, args, _filters) -> int:
    removed = {}
    for layer in (cache.local, cache.imported):
        count = len(layer.store.digests())
        cleared = count == 0 or layer.store.clear()
        removed[layer.name] = count if cleared else 0
    if args.json:
        return _print_json({"removed": removed})
    for name, count in removed.items():
        print(f"{name}: removed {count} entries")
    return 0


_COMMANDS = {"ls": _ls, "show": _show, "stats": _stats, "export": _export, "import": _import,
             "merge": _merge, "prune": _prune, "clear": _clear}


# -- helpers ------------------------------------------------------------------------------------

def _check_without_gpu(row: Row, cache: KernelCache) -> tuple[bool, str]:
    entry = row.entry
    if entry is None:
        return False, row.problem
    if check_signature(entry, cache.trust_key) is Signature.INVALID:
        return False, "signed with the trust key, but changed since it was signed"
    if entry.outcome == "kernel" and not entry.verified:
        return False, "a kernel without passing verification evidence"
    if entry.outcome == "kernel" and math.isinf(entry.measured_ms):
        return False, "a kernel without a measured time"
    return True, "format, key, signature and evidence check out"


def _run_verifier(verifier: Verifier, entry: Entry) -> tuple[bool, str]:
    try:
        passed, why = verifier(entry)
    except Exception as exc:  # a verifier failure fails this entry, not the whole run
        return False, f"the verifier raised {exc!r}"
    return bool(passed), why


def _summary(layer: Layer, row: Row, cache: KernelCache) -> dict:
    summary = {"key": row.digest, "layer": layer.name, "problem": row.problem}
    entry = row.entry
    if entry is None:
        return summary
    trust = "local" if layer.is_local else check_signature(entry, cache.trust_key).value
    # a kernel that failed verification here, kept so that it is not verified again (docs/CACHE.md)
    outcome = "refused" if entry.outcome == "kernel" and entry.verification.get("refused") else entry.outcome
    return {**summary, "outcome": outcome, "reason": entry.verification.get("refused") or entry.reason,
            "origin": entry.origin,
            "task": entry.key.get("task_hash", ""), "inputs": entry.key.get("inputs", []),
            "gpu": f"{entry.key['gpu']['name']} ({entry.key['gpu']['capability']})",
            "ours_ms": entry.ms("ours_ms"), "inductor_ms": entry.ms("inductor_ms"), "eager_ms": entry.ms("eager_ms"),
            "trust": trust,
            "binary_bytes": sum(len(b) for b in entry.binaries.values()),
            "created": entry.created, "last_used": entry.last_used}


def _print_problems(report) -> None:
    for c in report.conflicts:
        kept = c["kept"]
        print(f"conflict {c['key'][:12]}: kept {kept['outcome']} {_ms(kept['ms'])} ms from {kept['from']} "
              f"over " + ", ".join(f"{d['outcome']} {_ms(d['ms'])} ms from {d['from']}" for d in c["dropped"]))
    for r in report.refused:
        print(f"refused {r['key'][:12]} from {r['from']}: {r['why']}")
    for u in report.unreadable:
        print(f"unreadable {u['key'][:12]} in {u['from']}: {u['why']}")


def _print_json(value) -> int:
    print(json.dumps(value, indent=2))
    return 0


def _ms(value) -> str:
    return "-" if value is None else f"{value:.4g}"


def _speedup(summary: dict) -> str:
    ours, inductor = summary["ours_ms"], summary["inductor_ms"]
    return f"{inductor / ours:.2f}x" if ours and inductor else "-"


def _when(t: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(t)) if t else "-"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="cuda-agent")
    add_cache_parser(parser.add_subparsers(dest="command", required=True, metavar="COMMAND"))
    return run_cache_command(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
