"""`cuda-agent cache ...`: every command, its --json output, verify and prune."""
import argparse
import json
import subprocess
import sys
import time

import pytest
from cache_helpers import REPO, make_test_entry, make_test_key

from kernel_cache import Entry, KernelCache
from kernel_cache.cli import add_cache_parser, parse_size, run_cache_command

TEAM_KEY = "team secret"


def cli(*argv, verifier=None) -> int:
    parser = argparse.ArgumentParser(prog="cuda-agent")
    add_cache_parser(parser.add_subparsers(dest="command", required=True))
    return run_cache_command(parser.parse_args(["cache", *map(str, argv)]), verifier=verifier)


def cli_json(capsys, *argv, verifier=None):
    capsys.readouterr()
    status = cli(*argv, "--json", verifier=verifier)
    return status, json.loads(capsys.readouterr().out)


@pytest.fixture
def filled(cache_dir):
    keys = [make_test_key(i) for i in range(3)]
    with KernelCache.open() as cache:
        for key in keys:
            assert cache.put(key, make_test_entry(key))
        loser = make_test_key("inductor")
        assert cache.put(loser, Entry("inductor", reason="no candidate beat Inductor", timings={"inductor_ms": 0.2}))
    return keys + [loser]


def test_module_entry_point_lists_and_shows(filled, cache_dir):
    def run(*argv):
        done = subprocess.run([sys.executable, "-m", "kernel_cache.cli", "cache", *argv], cwd=REPO,
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        return done.stdout
    listed = json.loads(run("ls", "--json"))
    assert {row["key"] for row in listed} == {k.digest for k in filled}
    assert "4 entries" in run("ls")
    shown = json.loads(run("show", filled[0].digest[:10], "--json"))
    assert shown["entry"]["binaries"]["sm_90"]["bytes"] == 4096 and shown["layer"] == "local"
    assert "// kernel for" in run("show", filled[0].digest[:10])


def test_ls_filters_and_show_rejects_unknown_or_ambiguous_keys(filled, capsys):
    status, listed = cli_json(capsys, "ls", "--filter", "outcome=inductor")
    assert status == 0 and [row["key"] for row in listed] == [filled[-1].digest]
    assert cli("show", "ffffffffffffff-none") == 1
    assert cli("show", "") == 1  # every key starts with ""
    assert cli("ls", "--filter", "nonsense") == 2


def test_stats(filled, capsys):
    status, stats = cli_json(capsys, "stats")
    local = stats[0]
    assert status == 0 and local["layer"] == "local"
    assert local["entries"] == 4 and local["outcomes"] == {"kernel": 3, "inductor": 1}
    assert local["file_bytes"] > local["value_bytes"] > 3 * 4096


def test_export_import_merge_commands(filled, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("CUDA_AGENT_TRUST_KEY", TEAM_KEY)
    status, exported = cli_json(capsys, "export", tmp_path / "all.bundle")
    assert status == 0 and exported["written"] == 4 and exported["signed"]
    assert cli("export", tmp_path / "kernels.bundle", "--filter", "outcome=kernel") == 0
    status, merged = cli_json(capsys, "merge", tmp_path / "all.bundle", tmp_path / "kernels.bundle",
                              "-o", tmp_path / "merged.bundle")
    assert status == 0 and merged["written"] == 4 and merged["conflicts"] == []
    status, imported = cli_json(capsys, "import", tmp_path / "merged.bundle", "--cache-dir", tmp_path / "other")
    assert status == 0 and imported["trusted"] == 4
    assert cli("import", tmp_path / "missing.bundle") == 1


def test_verify_without_a_gpu_checks_what_it_can(filled, capsys):
    status, report = cli_json(capsys, "verify")
    assert status == 0 and report["gpu_verification"].startswith("not run")
    assert all(r["passed"] for r in report["results"])
    with KernelCache.open() as cache:  # a kernel with no passing evidence fails
        bad = make_test_key("bad")
        assert cache.put(bad, make_test_entry(bad, verification={"passed": False}))
    status, report = cli_json(capsys, "verify", "--drop-failed")
    assert status == 1 and [r["key"] for r in report["results"] if not r["passed"]] == [bad.digest]
    with KernelCache.open() as cache:
        assert cache.get(bad) is None


def test_verify_runs_the_verifier_and_promotes_imported_entries(filled, tmp_path, capsys):
    team_key = make_test_key("from the team")
    with KernelCache.open(tmp_path / "team", team=[]) as team:
        assert team.put(team_key, make_test_entry(team_key))
    assert cli("export", tmp_path / "team.bundle", "--cache-dir", tmp_path / "team") == 0
    assert cli("import", tmp_path / "team.bundle") == 0

    def verifier(entry):
        if entry.key["task_hash"] == "task-1":
            return False, "max error 0.5 on input set 3"
        entry.verification = {"passed": True, "rules": "these"}
        return True, "5 input sets within 1e-4"

    status, report = cli_json(capsys, "verify", verifier=verifier)
    results = {r["key"]: r for r in report["results"]}
    assert status == 1 and report["gpu_verification"] == "run"
    assert results[filled[1].digest]["why"] == "max error 0.5 on input set 3"
    assert results[team_key.digest]["promoted"] and results[filled[0].digest]["recorded"]
    with KernelCache.open() as cache:
        assert cache.get(team_key).layer == "local"
        # what the verifier ran is kept, for a passing local kernel as for a promoted one
        assert cache.get(team_key).entry.verification["rules"] == "these"
        assert cache.get(filled[0]).entry.verification["rules"] == "these"
        assert "rules" not in cache.get(filled[1]).entry.verification  # failed: left as it was

    def broken(entry):
        raise RuntimeError("worker died")

    status, report = cli_json(capsys, "verify", verifier=broken)
    assert status == 1 and "worker died" in report["results"][0]["why"]


def test_prune_by_age_then_by_size_least_recently_used_first(cache_dir, capsys):
    now = time.time()
    keys = [make_test_key(i) for i in range(6)]
    with KernelCache.open() as cache:
        for age_days, key in zip((100, 50, 4, 3, 2, 1), keys):
            assert cache.put(key, make_test_entry(key, binary_bytes=200_000))
            cache.local.store.set_last_used({key.digest: now - age_days * 86400})
    file_before = (cache_dir / "cache.sqlite").stat().st_size
    status, [local, _imported] = cli_json(capsys, "prune", "--max-age", "30", "--dry-run")
    assert status == 0 and local["removed"] == 2
    assert cli_json(capsys, "prune", "--max-age", "30")[1][0]["removed"] == 2
    entry_bytes = local["bytes_before"] // 6
    status, [local, _imported] = cli_json(capsys, "prune", "--max-size", str(2 * entry_bytes + 100))
    assert status == 0 and local["removed"] == 2 and local["kept"] == 2
    with KernelCache.open() as cache:
        assert {d for d, _ in cache.items()} == {keys[4].digest, keys[5].digest}
    assert (cache_dir / "cache.sqlite").stat().st_size < file_before / 2
    assert cli("prune") == 2


def test_clear(filled, capsys):
    status, cleared = cli_json(capsys, "clear")
    assert status == 0 and cleared["removed"]["local"] == 4
    with KernelCache.open() as cache:
        assert list(cache.items()) == []


@pytest.mark.parametrize("text,size", [("500", 500), ("10k", 10240), ("2G", 2 << 30), ("1.5MiB", 3 << 19)])
def test_parse_size(text, size):
    assert parse_size(text) == size
