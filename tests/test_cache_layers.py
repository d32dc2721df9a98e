"""Layers: local first, then team caches; an entry written elsewhere is trusted only with a
signature from our key, and only a trusted one is copied into the local cache."""
import json
import logging
import os
import sqlite3
from pathlib import Path

import pytest
from cache_helpers import is_whole, make_test_entry, make_test_key

from kernel_cache import KernelCache, default_cache_dir

TEAM_KEY = "team secret"


def _team_cache(directory: Path, trust_key: str | None, *keys, ours_ms: float = 1.0) -> Path:
    """A teammate's cache directory holding an entry for each key, signed with `trust_key`."""
    with KernelCache.open(directory, team=[], trust_key=trust_key) as cache:
        for key in keys:
            assert cache.put(key, make_test_entry(key, ours_ms=ours_ms))
    return directory


def _local_has(cache_dir: Path, key) -> bool:
    with KernelCache.open(cache_dir, team=[]) as cache:
        return cache.get(key) is not None


def test_signed_team_entry_is_trusted_and_copied_to_local(cache_dir, tmp_path):
    key = make_test_key()
    team = _team_cache(tmp_path / "team", TEAM_KEY, key)
    with KernelCache.open(team=[team], trust_key=TEAM_KEY) as cache:
        lookup = cache.get(key)
    assert lookup.trusted and lookup.layer == f"team:{team / 'cache.sqlite'}"
    assert is_whole(key.digest, lookup.entry)
    assert _local_has(cache_dir, key)


@pytest.mark.parametrize("signed_with,ours", [(None, TEAM_KEY), ("another team", TEAM_KEY), (TEAM_KEY, None)])
def test_team_entry_without_our_signature_is_untrusted_and_not_copied(signed_with, ours, cache_dir, tmp_path):
    key = make_test_key()
    team = _team_cache(tmp_path / "team", signed_with, key)
    with KernelCache.open(team=[team], trust_key=ours) as cache:
        lookup = cache.get(key)
        assert not lookup.trusted and is_whole(key.digest, lookup.entry)
        assert not _local_has(cache_dir, key)
        # The caller verified it on this GPU: now it is ours.
        assert cache.put(key, lookup.entry)
        assert cache.get(key).layer == "local"


def test_tampered_signed_team_entry_is_refused(cache_dir, tmp_path, caplog):
    key = make_test_key()
    team = _team_cache(tmp_path / "team", TEAM_KEY, key)
    with sqlite3.connect(team / "cache.sqlite") as db:
        stored = json.loads(db.execute("SELECT value FROM entries").fetchone()[0])
        stored["source"] = stored["source"].replace("kernel", "evil")
        db.execute("UPDATE entries SET value = ?", (json.dumps(stored),))
    with caplog.at_level(logging.WARNING, "cuda_agent.cache"), \
            KernelCache.open(team=[team], trust_key=TEAM_KEY) as cache:
        assert cache.get(key) is None
    assert "signature does not match" in caplog.text
    assert not _local_has(cache_dir, key)


def test_lookup_order_local_then_trusted_team_then_untrusted(cache_dir, tmp_path):
    in_local, in_both = make_test_key("local"), make_test_key("both")
    unsigned = _team_cache(tmp_path / "unsigned", None, in_local, in_both)
    signed = _team_cache(tmp_path / "signed", TEAM_KEY, in_both)
    with KernelCache.open(team=[], trust_key=TEAM_KEY) as cache:
        assert cache.put(in_local, make_test_entry(in_local, ours_ms=9.0))
    with KernelCache.open(team=[unsigned, signed], trust_key=TEAM_KEY) as cache:
        local = cache.get(in_local)
        assert local.layer == "local" and local.entry.ms("ours_ms") == 9.0
        both = cache.get(in_both)
        assert both.trusted and both.layer == f"team:{signed / 'cache.sqlite'}"


def test_team_layers_from_the_environment_and_bundles_as_layers(cache_dir, tmp_path, monkeypatch):
    first, second = make_test_key("first"), make_test_key("second")
    _team_cache(tmp_path / "a", TEAM_KEY, first)
    bundle = tmp_path / "b.bundle"
    _team_cache(tmp_path / "b", TEAM_KEY, second)
    os.replace(tmp_path / "b" / "cache.sqlite", bundle)
    monkeypatch.setenv("CUDA_AGENT_TEAM_CACHE", os.pathsep.join([str(tmp_path / "a"), "", str(bundle)]))
    monkeypatch.setenv("CUDA_AGENT_TRUST_KEY", TEAM_KEY)
    with KernelCache.open() as cache:
        assert cache.get(first).trusted and cache.get(second).layer == f"team:{bundle}"


def test_broken_team_layers_are_skipped_and_never_changed(cache_dir, tmp_path, caplog):
    key = make_test_key()
    garbage = tmp_path / "garbage.sqlite"
    garbage.write_bytes(b"this is not sqlite" * 1000)
    good = _team_cache(tmp_path / "good", TEAM_KEY, key)
    with caplog.at_level(logging.WARNING, "cuda_agent.cache"), \
            KernelCache.open(team=[tmp_path / "missing", garbage, good], trust_key=TEAM_KEY) as cache:
        assert cache.get(key).trusted
    assert garbage.read_bytes() == b"this is not sqlite" * 1000
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache", "garbage.sqlite", "good"]
    assert "does not exist" in caplog.text and "not a readable cache" in caplog.text


def test_default_cache_dir_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.delenv("CUDA_AGENT_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache_dir() == tmp_path / "xdg" / "cuda_agent"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_cache_dir() == tmp_path / "home" / ".cache" / "cuda_agent"
    monkeypatch.setenv("CUDA_AGENT_CACHE_DIR", str(tmp_path / "mine"))
    assert default_cache_dir() == tmp_path / "mine"
    with KernelCache.open(tmp_path / "option") as cache:  # the option beats the environment
        assert cache.cache_dir == tmp_path / "option"
