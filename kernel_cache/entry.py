"""Cache entries: what one search concluded for one key, as plain JSON.

Losers are entries too ("inductor" won, or the search "failed"), so a subgraph is not
searched twice by the same policy. Binaries are base64 text inside the JSON, so a stored value is JSON and
nothing else: reading a cache someone else wrote never runs code.
"""
from __future__ import annotations

import base64
import binascii
import importlib.metadata
import math
import socket
import time
from dataclasses import dataclass, field
from typing import Callable

# Bump when the layout of an entry changes, and add the step from the old layout to MIGRATIONS.
ENTRY_FORMAT_VERSION = 1
OUTCOMES = ("kernel", "inductor", "failed", "context")

# format_version -> function turning that version's JSON into the next version's JSON.
MIGRATIONS: dict[int, Callable[[dict], dict]] = {}


class EntryFormatError(ValueError):
    """A stored value that is not an entry this version can use; it reads as a miss."""


@dataclass
class Entry:
    """One search result. Conventions the rest of the project relies on:

    - timings: `ours_ms`, `inductor_ms`, `eager_ms` in milliseconds: a search's are the
      profiler's stats (env/profile.summarize: median, p10, p90, trials, host_median), the
      in-context check's plain numbers; `ms(name)` reads either as one time (the median);
    - verification: `passed` (bool), `trials` (input sets checked), `max_error` (float);
      `refused`: why a kernel failed verification on this machine (kept, with `passed` false,
      so that it is not verified again under the same rules);
    - provenance: see `make_provenance`;
    - binaries: compiled code per architecture, e.g. {"sm_90": <cubin bytes>};
    - launch: the candidate's parameters; a launch-spec winner's spec under "spec", naming its
      CUBINs in binaries ("sm_90:<sha16>"; agent_backend/env/launch_spec.py);
    - task: `Task.to_json()` of the task searched, so the result can be re-verified anywhere.
    """

    # "kernel" (a kernel won), "inductor" (Inductor won), "failed" (search failed), or "context":
    # the in-context check's verdict on a whole graph with its winners (timings["kept"])
    outcome: str
    reason: str = ""  # why: the speedup, why Inductor won, or the error that ended the search
    source: str | None = None  # the candidate's ModelNew source
    origin: str = ""  # who wrote the candidate (Candidate.origin)
    binaries: dict[str, bytes] = field(default_factory=dict)
    launch: dict = field(default_factory=dict)
    timings: dict = field(default_factory=dict)
    verification: dict = field(default_factory=dict)
    provenance: dict = field(default_factory=dict)
    task: dict | None = None
    key: dict = field(default_factory=dict)  # CacheKey.to_json() of the key it is stored under
    last_used: float = 0.0
    created: float = 0.0
    format_version: int = ENTRY_FORMAT_VERSION
    signature: str | None = None

    def __post_init__(self):
        if self.outcome not in OUTCOMES:
            raise EntryFormatError(f"outcome {self.outcome!r} is not one of {OUTCOMES}")
        if self.outcome == "kernel" and not self.source:
            raise EntryFormatError("a kernel entry needs its source")
        for name in ("launch", "timings", "verification", "provenance", "key"):
            if not isinstance(getattr(self, name), dict):
                raise EntryFormatError(f"{name} must be a dict")
        if not all(isinstance(a, str) and isinstance(b, bytes) for a, b in self.binaries.items()):
            raise EntryFormatError("binaries must map architecture names to bytes")
        if not all(isinstance(t, (int, float)) for t in (self.last_used, self.created)):
            raise EntryFormatError("last_used and created must be times in seconds")

    @property
    def verified(self) -> bool:
        return self.verification.get("passed") is True

    def ms(self, name: str) -> float | None:
        """timings[name] as one time in milliseconds (a stats dict's median), None where there is none."""
        value = self.timings.get(name)
        if isinstance(value, dict):
            value = value.get("median")
        return float(value) if isinstance(value, (int, float)) and not math.isnan(value) else None

    @property
    def measured_ms(self) -> float:
        """The time this entry stands for: our kernel's for a kernel, Inductor's when Inductor
        won; infinity when unmeasured (it then loses every comparison)."""
        name = {"kernel": "ours_ms", "inductor": "inductor_ms"}.get(self.outcome)
        ms = self.ms(name) if name else None
        return math.inf if ms is None else ms

    def to_json(self) -> dict:
        return {
            "format_version": self.format_version,
            "outcome": self.outcome,
            "reason": self.reason,
            "source": self.source,
            "origin": self.origin,
            "binaries": {arch: base64.b64encode(blob).decode("ascii") for arch, blob in self.binaries.items()},
            "launch": self.launch,
            "timings": self.timings,
            "verification": self.verification,
            "provenance": self.provenance,
            "task": self.task,
            "key": self.key,
            "last_used": self.last_used,
            "created": self.created,
            "signature": self.signature,
        }

    @classmethod
    def from_json(cls, d: dict) -> "Entry":
        """Parse a stored value, migrating older layouts; raises EntryFormatError for anything
        else (a newer layout, a layout with no migration, a damaged value)."""
        d = migrate(d)
        try:
            binaries = {arch: base64.b64decode(text, validate=True) for arch, text in d["binaries"].items()}
            return cls(
                outcome=d["outcome"], reason=d["reason"], source=d["source"], origin=d["origin"],
                binaries=binaries, launch=d["launch"], timings=d["timings"],
                verification=d["verification"], provenance=d["provenance"], task=d["task"],
                key=d["key"], last_used=d["last_used"], created=d["created"],
                format_version=d["format_version"], signature=d["signature"],
            )
        except (KeyError, TypeError, AttributeError, binascii.Error) as exc:
            raise EntryFormatError(f"damaged entry: {exc!r}") from exc


def migrate(d: dict) -> dict:
    if not isinstance(d, dict):
        raise EntryFormatError("a stored value is not a JSON object")
    version = d.get("format_version")
    while version != ENTRY_FORMAT_VERSION:
        step = MIGRATIONS.get(version) if isinstance(version, int) else None
        if step is None:
            raise EntryFormatError(f"entry format {version!r} is not readable by format {ENTRY_FORMAT_VERSION}")
        d = step(d)
        version = d.get("format_version")
    return d


def make_provenance(policy: str, model: str | None = None, **extra) -> dict:
    """Who produced an entry, where and when: the policy, the model behind it, the host, the
    time and the project version, plus any `extra` fields the caller records."""
    try:
        project = importlib.metadata.version("cuda-agent")
    except importlib.metadata.PackageNotFoundError:
        project = "unknown"
    return {"policy": policy, "model": model, "host": socket.gethostname(), "time": time.time(),
            "project_version": project, **extra}
