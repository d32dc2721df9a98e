"""Entries: plain JSON on disk (never pickle), versioned, and signed so tampering shows."""
import json
import logging
import os
import pickle
import sqlite3
from dataclasses import replace

import pytest
from cache_helpers import make_test_entry, make_test_key

from kernel_cache import Entry, EntryFormatError, KernelCache, make_provenance
from kernel_cache import entry as entry_module
from kernel_cache.trust import Signature, check_signature, sign


def _raw_rows(cache_dir):
    with sqlite3.connect(cache_dir / "cache.sqlite") as db:
        return dict(db.execute("SELECT key, value FROM entries"))


def test_entry_round_trips_through_json_with_every_field():
    key = make_test_key()
    entry = make_test_entry(key, binaries={"sm_90": bytes(range(256)), "sm_80": b""},
                            signature="hmac-sha256:x:y", last_used=5.5)
    assert Entry.from_json(json.loads(json.dumps(entry.to_json()))) == entry


def test_stored_values_are_plain_json_with_base64_binaries(cache_dir):
    key = make_test_key()
    with KernelCache.open() as cache:
        assert cache.put(key, make_test_entry(key))
    stored = json.loads(_raw_rows(cache_dir)[key.digest])
    assert stored["source"] == make_test_entry(key).source
    assert stored["binaries"]["sm_90"].isascii()


def test_reading_a_planted_pickle_runs_no_code(cache_dir, tmp_path):
    marker = tmp_path / "code-ran"

    class Exploit:
        def __reduce__(self):
            return os.system, (f"touch {marker}",)

    key = make_test_key()
    with KernelCache.open() as cache:
        assert cache.put(key, make_test_entry(key))
    with sqlite3.connect(cache_dir / "cache.sqlite") as db:
        db.execute("UPDATE entries SET value = ? WHERE key = ?", (pickle.dumps(Exploit()), key.digest))
    with KernelCache.open() as cache:
        assert cache.get(key) is None
        assert list(cache.items()) == []
    assert not marker.exists()


def test_provenance_says_who_where_when():
    provenance = make_provenance("llm", "qwen-coder", turns=3)
    assert provenance.keys() == {"policy", "model", "host", "time", "project_version", "turns"}
    assert provenance["policy"] == "llm" and provenance["host"] and provenance["time"] > 1.7e9
    json.dumps(provenance)


def test_timings_read_as_one_time_whether_stats_or_numbers():
    """A search stores the profiler's stats, the in-context check plain numbers: both read as
    milliseconds; a kernel without a time is unmeasured (infinitely slow in every comparison)."""
    key = make_test_key()
    searched = make_test_entry(key, ours_ms=0.25)
    assert searched.ms("ours_ms") == 0.25 and searched.measured_ms == 0.25 and searched.ms("inductor_ms") == 1.5
    context = replace(searched, outcome="context", timings={"ours_ms": 0.2, "inductor_ms": 0.3, "kept": True})
    assert (context.ms("ours_ms"), context.ms("inductor_ms"), context.ms("eager_ms")) == (0.2, 0.3, None)
    unmeasured = replace(searched, timings={"ours_ms": {"median": float("nan")}})
    assert unmeasured.ms("ours_ms") is None and unmeasured.measured_ms == float("inf")
    inductor_won = replace(searched, outcome="inductor", binaries={}, source="")
    assert inductor_won.measured_ms == 1.5


def test_entry_checks_its_fields():
    with pytest.raises(EntryFormatError):
        Entry("won")
    with pytest.raises(EntryFormatError):
        Entry("kernel", source=None)
    with pytest.raises(EntryFormatError):
        Entry("inductor", binaries={"sm_90": "not bytes"})
    assert Entry("failed", reason="compile error").source is None


@pytest.mark.parametrize("version", [0, 2, "1", None])
def test_entry_in_an_unknown_format_is_a_miss_not_a_crash(version, cache_dir, caplog):
    key = make_test_key()
    with KernelCache.open() as cache:
        assert cache.put(key, make_test_entry(key))
    stored = json.loads(_raw_rows(cache_dir)[key.digest])
    stored["format_version"] = version
    with sqlite3.connect(cache_dir / "cache.sqlite") as db:
        db.execute("UPDATE entries SET value = ? WHERE key = ?", (json.dumps(stored), key.digest))
    with caplog.at_level(logging.WARNING, "cuda_agent.cache"), KernelCache.open() as cache:
        assert cache.get(key) is None
    assert "format" in caplog.text


def test_entry_in_an_older_format_is_migrated(cache_dir, monkeypatch):
    key = make_test_key()
    old = make_test_entry(key).to_json()
    old["format_version"] = 0
    old["timings"] = {"ours_us": 1000.0}  # the old layout kept microseconds
    with KernelCache.open() as cache:
        assert cache.local.store.put({key.digest: old})

    def from_0(d):
        return {**d, "format_version": 1, "timings": {"ours_ms": d["timings"]["ours_us"] / 1000}}

    monkeypatch.setitem(entry_module.MIGRATIONS, 0, from_0)
    with KernelCache.open() as cache:
        assert cache.get(key).entry.timings == {"ours_ms": 1.0}


def test_signature_covers_content_and_key_but_not_last_use():
    trust_key, other_key = b"team secret", b"another team"
    key = make_test_key()
    entry = make_test_entry(key)
    signed = replace(entry, signature=sign(entry, trust_key))
    assert check_signature(signed, trust_key) is Signature.VALID
    assert check_signature(replace(signed, last_used=123.0), trust_key) is Signature.VALID
    assert check_signature(replace(signed, source=signed.source + " "), trust_key) is Signature.INVALID
    assert check_signature(replace(signed, binaries={"sm_90": b"\x00"}), trust_key) is Signature.INVALID
    moved = replace(signed, key=make_test_key("other").to_json())
    assert check_signature(moved, trust_key) is Signature.INVALID
    assert check_signature(signed, other_key) is Signature.FOREIGN
    assert check_signature(signed, None) is Signature.FOREIGN
    assert check_signature(entry, trust_key) is Signature.UNSIGNED
