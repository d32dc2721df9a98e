"""Entry filters for the CLI and for exports: `FIELD=TEXT`, true when the field contains TEXT
(case-insensitive). Several filters must all hold."""
from __future__ import annotations

from typing import Callable

from .entry import Entry


def _gpu(entry: Entry) -> str:
    gpu = entry.key.get("gpu", {})
    return f"{gpu.get('name', '')} {gpu.get('capability', '')}"


FIELDS: dict[str, Callable[[Entry], object]] = {
    "outcome": lambda e: e.outcome,
    "gpu": _gpu,
    "task": lambda e: e.key.get("task_hash"),
    "torch": lambda e: e.key.get("software", {}).get("torch"),
    "cuda": lambda e: e.key.get("software", {}).get("cuda"),
    "origin": lambda e: e.origin,
    "policy": lambda e: e.provenance.get("policy"),
    "model": lambda e: e.provenance.get("model"),
}

EntryFilter = Callable[[Entry], bool]


def parse_filter(text: str) -> EntryFilter:
    field, sep, wanted = text.partition("=")
    if not sep or field not in FIELDS:
        raise ValueError(f"filter {text!r} is not FIELD=TEXT with FIELD one of {', '.join(FIELDS)}")
    read, wanted = FIELDS[field], wanted.lower()
    return lambda entry: wanted in str(read(entry) or "").lower()


def matches_all(entry: Entry, filters: list[EntryFilter]) -> bool:
    return all(f(entry) for f in filters)
