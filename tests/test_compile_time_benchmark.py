"""benchmarks/compile_time.py on the CPU (its dry run): every trial is a real process through
the real backend and Inductor, cold trials start from empty caches, and a warm trial of ours
finds the graph its priming process left in Inductor's graph cache (the pass does not run)."""
import argparse
import json

import pytest

from benchmarks import compile_time


def test_cold_and_warm_trials_in_fresh_processes_interleaved(tmp_path, capsys):
    out = tmp_path / "compile_time.json"
    assert compile_time.main(["--dry-run", "--only", "softmax", "--rounds", "2", "--warm-rounds", "1",
                              "--settle", "1", "--out", str(out)]) == 0
    row, = json.loads(out.read_text())["problems"]
    for phase, trials in (("cold", 2), ("warm", 1)):
        for backend in compile_time.BACKENDS:
            assert len(row[phase][backend]) == trials
            assert all(t["compile_s"] > 0 and t["process_s"] > t["compile_s"] for t in row[phase][backend]), row
        summary = row[f"{phase}_summary"]
        assert summary["ratio"] == pytest.approx(summary["median_s"]["ours"] / summary["median_s"]["inductor"])
    # cold: our pass made the softmax a task (no GPU: nothing searched or queued)
    assert all(t["tasks"] == 1 and t["queued"] == 0 for t in row["cold"]["ours"])
    assert row["prime"]["ours"]["later_s"], "the priming process compiles again after waiting"
    # warm: Inductor's graph cache replayed the primed graph, so the pass saw no graph
    assert row["warm"]["ours"][0]["tasks"] == 0
    assert "softmax" in capsys.readouterr().out


def test_an_unknown_problem_is_refused_before_any_trial():
    with pytest.raises(ValueError, match="no problem named nonesuch"):
        compile_time.main(["--dry-run", "--only", "nonesuch"])


def test_a_failing_trial_is_recorded_with_its_error(tmp_path):
    args = argparse.Namespace(dry_run=True, option=["mode=nonesuch"], trial_timeout=120.0)
    trial = compile_time._trial("softmax", "ours", tmp_path, args)
    assert "mode" in trial["error"] and "compile_s" not in trial
