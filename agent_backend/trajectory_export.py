"""`cuda-agent trajectories export`: the recorded trajectories (trajectories.py) as examples in
the form fine-tuning tools read: one per evaluated candidate, with `messages` (the chat that led
to the answer, then the answer as the assistant's turn), a `reward`, and `metadata` (README.md,
"Trajectories", documents every field). JSON Lines, or Parquet where pyarrow is installed.

The reward follows the milestones of CUDA Agent's reward (arXiv 2602.24286): -1 when the answer
is not correct (it did not build, failed verification, or had no code), 1 when it is correct,
2 when it is also faster than eager PyTorch by more than the search's bar to win, and 3 when it
beats Inductor (torch.compile) by more than that bar. The timings in the metadata allow any
other reward.
"""
from __future__ import annotations

import json
import sqlite3
import sys
from pathlib import Path
from typing import IO, Iterable, Iterator

from kernel_cache.keys import input_signature

from .specs import TensorSpec
from .trajectories import FILE, TrajectoryLog

class ExportError(RuntimeError):
    """The export cannot be written as asked (no pyarrow for Parquet, no file to write it to)."""


def reward(evaluation: dict) -> float:
    if evaluation["status"] != "passed":
        return -1.0
    profile = evaluation.get("profile") or {}
    if profile.get("wins"):
        return 3.0
    if (profile.get("speedup_vs_eager") or 0.0) > profile.get("min_speedup", 1.0):
        return 2.0
    return 1.0


def _median(profile: dict, who: str) -> float | None:
    return (profile.get(f"{who}_ms") or {}).get("median")


def example(record: dict) -> dict:
    """One training example from one stored record."""
    ev, task, key = record["evaluation"], record["task"], record["key"]
    verification, profile = ev.get("verification") or {}, ev.get("profile") or {}
    metadata = {
        "id": record["id"],
        "time": record["time"],
        "task_hash": task["hash"],
        "task_kind": task["kind"],
        "ops": task["ops"],
        "program": task["program"],
        "inputs": key["inputs"],
        "outputs": [input_signature(TensorSpec.from_json(s)) for s in task["outputs"]],
        "gpu": key["gpu"]["name"],
        "capability": key["gpu"]["capability"],
        "torch": key["software"]["torch"],
        "cuda": key["software"]["cuda"],
        "key": record["key_digest"],
        "policy": record["policy"],
        "policy_revision": record["policy_revision"],
        "origin": record["origin"],
        "params": json.dumps(record["params"], sort_keys=True),
        "source": record["source"],
        "status": ev["status"],
        "reason": ev["reason"],
        "passed": ev["status"] == "passed",
        "wins": bool(profile.get("wins")),
        "max_abs_err": verification.get("max_abs_err"),
        "max_rel_err": verification.get("max_rel_err"),
        "float64_err": verification.get("float64_err"),
        "float64_ref_err": verification.get("float64_ref_err"),
        "ours_ms": _median(profile, "ours"),
        "inductor_ms": _median(profile, "inductor"),
        "eager_ms": _median(profile, "eager"),
        "speedup_vs_inductor": profile.get("speedup_vs_inductor"),
        "counted_speedup": profile.get("counted_speedup"),
        "speedup_vs_eager": profile.get("speedup_vs_eager"),
        "min_speedup": profile.get("min_speedup"),
    }
    messages = record["messages"] + [{"role": "assistant", "content": record["answer"]}]
    return {"messages": messages, "reward": reward(ev), "metadata": metadata}


def examples(trajectories: TrajectoryLog) -> Iterator[dict]:
    return (example(record) for record in trajectories.records())


def write_jsonl(rows: Iterable[dict], out: IO[str]) -> int:
    count = 0
    for row in rows:
        out.write(json.dumps(row, ensure_ascii=False) + "\n")
        count += 1
    return count


def write_parquet(rows: Iterable[dict], path: Path) -> int:
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise ExportError("Parquet needs pyarrow, which is not installed: pip install pyarrow "
                          "(or export --format jsonl)") from None
    rows = list(rows)
    pq.write_table(pa.Table.from_pylist(rows), path)
    return len(rows)


def export(trajectories: TrajectoryLog, fmt: str, out: str | None) -> int:
    """Write every example to `out` (a path; JSON Lines may go to stdout with None); the count."""
    if fmt == "parquet":
        if out is None:
            raise ExportError("Parquet is written to a file: give -o FILE")
        return write_parquet(examples(trajectories), Path(out))
    if out is None:
        return write_jsonl(examples(trajectories), sys.stdout)
    with open(out, "w", encoding="utf-8") as stream:
        return write_jsonl(examples(trajectories), stream)


def run_trajectories_command(args) -> int:
    from kernel_cache.layers import default_cache_dir
    cache_dir = Path(args.cache_dir).expanduser() if args.cache_dir else default_cache_dir()
    try:
        count = export(TrajectoryLog(cache_dir / FILE), args.format, args.out)
    except ExportError as e:
        print(f"cuda-agent trajectories: {e}", file=sys.stderr)
        return 2
    except sqlite3.Error as e:
        print(f"cuda-agent trajectories: cannot read {cache_dir / FILE}: {e}", file=sys.stderr)
        return 1
    print(f"cuda-agent trajectories: {count} example(s) written from {cache_dir / FILE}", file=sys.stderr)
    return 0
