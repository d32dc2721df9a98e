"""Trajectories: every candidate a search evaluates, with what its author was asked, what it
answered and what the environment found, kept to train models on (`cuda-agent trajectories
export`, trajectory_export.py).

They live in `trajectories.sqlite` beside the kernel cache, apart from it: the cache holds the
results compiles look up and teams share; trajectories are a log that only grows and only the
export reads, with prompts of tens of kilobytes. Each message text is stored once, by its hash:
the later turns of a conversation repeat its earlier ones, and every opening repeats SKILL.md.
Recording never fails a compile: a file that cannot be written is reported once, and this
process stops recording to it.
"""
from __future__ import annotations

import hashlib
import json
import logging
import sqlite3
import time
from contextlib import closing
from pathlib import Path
from typing import Iterator

from .policies import prompts
from .specs import Candidate, Task

log = logging.getLogger("cuda_agent.trajectories")

FILE = "trajectories.sqlite"
FORMAT = 1  # of a record; the tables' names carry it too, so a new format starts new tables
_RECORDS = "records_v1"
_TEXTS = "texts_v1"
_TIMEOUT_S = 10.0


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


class TrajectoryLog:
    """The records of one file, oldest first."""

    def __init__(self, path: Path | str):
        self.path = Path(path)
        self.problem: str | None = None  # set once writing failed; nothing more is written

    def append(self, records: list[dict]) -> bool:
        """Store `records` (each with a "messages" list) in one transaction; False if not stored."""
        if self.problem is not None or not records:
            return False
        texts, rows = {}, []
        for record in records:
            messages = []
            for message in record["messages"]:
                texts[_digest(message["content"])] = message["content"]
                messages.append({"role": message["role"], "text": _digest(message["content"])})
            rows.append((record["time"], record["task"]["hash"], json.dumps({**record, "messages": messages})))
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with closing(self._connect()) as db, db:  # one transaction, then the connection closed
                db.executemany(f'INSERT OR IGNORE INTO "{_TEXTS}" (digest, text) VALUES (?, ?)', texts.items())
                db.executemany(f'INSERT INTO "{_RECORDS}" (time, task_hash, record) VALUES (?, ?, ?)', rows)
            return True
        except (sqlite3.Error, OSError) as e:
            self.problem = f"cannot record trajectories in {self.path} ({e}); this process records no more"
            log.warning("cuda_agent: %s", self.problem)
            return False

    def records(self) -> Iterator[dict]:
        """Every record with its messages written out, and its row number as "id"."""
        if not self.path.exists():
            return
        with closing(self._connect()) as db:
            texts = dict(db.execute(f'SELECT digest, text FROM "{_TEXTS}"'))
            for row_id, stored in db.execute(f'SELECT id, record FROM "{_RECORDS}" ORDER BY id'):
                record = json.loads(stored)
                record["messages"] = [{"role": m["role"], "content": texts[m["text"]]} for m in record["messages"]]
                yield {"id": row_id, **record}

    def _connect(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, timeout=_TIMEOUT_S)
        db.execute(f'CREATE TABLE IF NOT EXISTS "{_TEXTS}" (digest TEXT PRIMARY KEY, text TEXT NOT NULL)')
        db.execute(f'CREATE TABLE IF NOT EXISTS "{_RECORDS}" (id INTEGER PRIMARY KEY AUTOINCREMENT, '
                   'time REAL NOT NULL, task_hash TEXT NOT NULL, record TEXT NOT NULL)')
        return db


def make_record(task: Task, key, policy, candidate: Candidate, evaluation) -> dict:
    """One evaluated candidate. A candidate without a conversation (a template's) is recorded as
    an answer to the opening a model would have been given, its source in a code block."""
    return {
        "format": FORMAT,
        "time": time.time(),
        "key": key.to_json(),
        "key_digest": key.digest,
        "task": task.to_json(),
        "policy": policy.name,
        "policy_revision": policy.revision,
        "origin": candidate.origin,
        "params": dict(candidate.params),
        "messages": list(candidate.conversation) or prompts.opening(task),
        "answer": candidate.answer if candidate.answer is not None else f"```python\n{candidate.source}```",
        "source": candidate.source or None,
        "evaluation": evaluation.to_json(),
    }


class Recorder:
    """`search_task(record=...)` for one task: appends each round's candidates to a log."""

    def __init__(self, trajectories: TrajectoryLog, task: Task, key, policy):
        self.trajectories, self.task, self.key, self.policy = trajectories, task, key, policy

    def __call__(self, candidates: list[Candidate], evaluations: list) -> None:
        self.trajectories.append([make_record(self.task, self.key, self.policy, c, ev)
                                  for c, ev in zip(candidates, evaluations)])
