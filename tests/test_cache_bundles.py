"""Bundles: export -> import -> merge keep every field, keep the best verified entry per key,
report conflicts, and refuse entries changed after they were signed."""
import json
import sqlite3

import pytest
from cache_helpers import make_test_entry, make_test_key

from kernel_cache import Entry, KernelCache
from kernel_cache.bundle import BundleError, export_bundle, import_bundle, merge_bundles, read_bundle
from kernel_cache.filters import parse_filter

TEAM_KEY = "team secret"


def _cache_with(directory, trust_key, *entries) -> KernelCache:
    cache = KernelCache.open(directory, team=[], trust_key=trust_key)
    for key, entry in entries:
        assert cache.put(key, entry)
    return cache


def _bundle(path, trust_key, *entries):
    with _cache_with(path.parent / f"{path.name}.cache", trust_key, *entries) as cache:
        export_bundle(cache, path)
    return path


def _bundle_entries(path) -> dict[str, Entry]:
    return {row.digest: row.entry for row in read_bundle(path)}


def test_export_import_merge_round_trip_keeps_every_field(tmp_path):
    keys = [make_test_key(i) for i in range(3)]
    with _cache_with(tmp_path / "a", TEAM_KEY, *[(k, make_test_entry(k)) for k in keys]) as source:
        source.touch(keys[0])
        source.flush()
        originals = dict(source.items())
        assert export_bundle(source, tmp_path / "out.bundle") == 3
    exported = _bundle_entries(tmp_path / "out.bundle")
    assert exported == originals  # signatures included: they were signed when put
    with KernelCache.open(tmp_path / "b", team=[], trust_key=TEAM_KEY) as target:
        report = import_bundle(target, tmp_path / "out.bundle")
        assert (report.trusted, report.untrusted, report.conflicts) == (3, 0, [])
        assert dict(target.items()) == originals
    merged = merge_bundles([tmp_path / "out.bundle", tmp_path / "b"], tmp_path / "merged.bundle", TEAM_KEY.encode())
    assert merged.conflicts == [] and _bundle_entries(tmp_path / "merged.bundle") == originals


def test_export_signs_local_entries_and_filters(tmp_path):
    kernel, inductor = make_test_key("k"), make_test_key("i")
    with _cache_with(tmp_path / "a", None, (kernel, make_test_entry(kernel)),
                     (inductor, Entry("inductor", reason="no win", timings={"inductor_ms": 0.5}))) as cache:
        assert export_bundle(cache, tmp_path / "unsigned.bundle", [parse_filter("outcome=kernel")]) == 1
        cache.trust_key = TEAM_KEY.encode()
        assert export_bundle(cache, tmp_path / "signed.bundle") == 2
    [unsigned] = _bundle_entries(tmp_path / "unsigned.bundle").values()
    assert unsigned.signature is None
    assert all(e.signature for e in _bundle_entries(tmp_path / "signed.bundle").values())
    with pytest.raises(ValueError):
        parse_filter("colour=red")


def test_merge_keeps_the_fastest_verified_winner_and_reports_conflicts(tmp_path):
    key, same, alone = make_test_key("contested"), make_test_key("same"), make_test_key("alone")
    slow = _bundle(tmp_path / "slow.bundle", TEAM_KEY, (key, make_test_entry(key, ours_ms=2.0)),
                   (same, make_test_entry(same)))
    fast = _bundle(tmp_path / "fast.bundle", TEAM_KEY,
                   (key, make_test_entry(key, ours_ms=0.5, source="// a faster kernel")), (same, make_test_entry(same)))
    # Fastest of all, but it failed verification: it must not win.
    unverified = make_test_entry(key, ours_ms=0.1, source="// wrong", verification={"passed": False})
    lost = _bundle(tmp_path / "lost.bundle", TEAM_KEY, (key, unverified), (alone, make_test_entry(alone)))
    report = merge_bundles([slow, fast, lost], tmp_path / "merged.bundle", TEAM_KEY.encode())
    merged = _bundle_entries(tmp_path / "merged.bundle")
    assert merged.keys() == {key.digest, same.digest, alone.digest}
    assert merged[key.digest].source == "// a faster kernel"
    [conflict] = report.conflicts  # `same` met an identical entry: no conflict
    assert conflict["key"] == key.digest and conflict["kept"]["ms"] == 0.5
    assert sorted(d["ms"] for d in conflict["dropped"]) == [0.1, 2.0]


def test_kernel_beats_inductor_and_trusted_beats_untrusted_in_a_merge(tmp_path):
    key = make_test_key()
    inductor = _bundle(tmp_path / "inductor.bundle", TEAM_KEY, (key, Entry("inductor", timings={"inductor_ms": 0.1})))
    untrusted = _bundle(tmp_path / "untrusted.bundle", None, (key, make_test_entry(key, ours_ms=0.01)))
    trusted = _bundle(tmp_path / "trusted.bundle", TEAM_KEY, (key, make_test_entry(key, ours_ms=1.0)))
    merge_bundles([inductor, untrusted, trusted], tmp_path / "merged.bundle", TEAM_KEY.encode())
    [kept] = _bundle_entries(tmp_path / "merged.bundle").values()
    assert kept.outcome == "kernel" and kept.ms("ours_ms") == 1.0


def _tamper(bundle, digest):
    with sqlite3.connect(bundle) as db:
        stored = json.loads(db.execute("SELECT value FROM entries WHERE key = ?", (digest,)).fetchone()[0])
        stored["timings"]["ours_ms"] = 0.001
        db.execute("UPDATE entries SET value = ? WHERE key = ?", (json.dumps(stored), digest))


def test_tampered_signed_entry_is_refused_by_import_and_merge(tmp_path):
    honest, tampered = make_test_key("honest"), make_test_key("tampered")
    bundle = _bundle(tmp_path / "team.bundle", TEAM_KEY, (honest, make_test_entry(honest)),
                     (tampered, make_test_entry(tampered)))
    _tamper(bundle, tampered.digest)
    with KernelCache.open(tmp_path / "mine", team=[], trust_key=TEAM_KEY) as cache:
        report = import_bundle(cache, bundle)
        assert [r["key"] for r in report.refused] == [tampered.digest]
        assert cache.get(honest).trusted and cache.get(tampered) is None
    report = merge_bundles([bundle], tmp_path / "merged.bundle", TEAM_KEY.encode())
    assert [r["key"] for r in report.refused] == [tampered.digest]
    assert _bundle_entries(tmp_path / "merged.bundle").keys() == {honest.digest}


def test_unsigned_import_waits_in_the_imported_layer_for_verification(tmp_path):
    key = make_test_key()
    bundle = _bundle(tmp_path / "unsigned.bundle", None, (key, make_test_entry(key)))
    with KernelCache.open(tmp_path / "mine", team=[], trust_key=TEAM_KEY) as cache:
        report = import_bundle(cache, bundle)
        assert (report.trusted, report.untrusted) == (0, 1)
        lookup = cache.get(key)
        assert not lookup.trusted and lookup.layer == f"team:{tmp_path / 'mine' / 'imported.sqlite'}"
        assert list(cache.items()) == []  # nothing untrusted in the local cache


def test_import_keeps_a_better_local_entry_and_reports_the_conflict(tmp_path):
    key = make_test_key()
    bundle = _bundle(tmp_path / "team.bundle", TEAM_KEY, (key, make_test_entry(key, ours_ms=3.0, source="// slow")))
    with _cache_with(tmp_path / "mine", TEAM_KEY, (key, make_test_entry(key, ours_ms=1.0))) as cache:
        report = import_bundle(cache, bundle)
        assert report.written == 0 and len(report.conflicts) == 1
        assert cache.get(key).entry.ms("ours_ms") == 1.0


def test_unreadable_bundle_is_an_error_not_a_crash(tmp_path):
    (tmp_path / "garbage.bundle").write_bytes(b"\x00garbage" * 100)
    with pytest.raises(BundleError):
        read_bundle(tmp_path / "garbage.bundle")
    with pytest.raises(BundleError):
        read_bundle(tmp_path / "missing.bundle")
