"""Trajectories: a search records every evaluated candidate (what the model was asked, what it
answered, the verdict) beside the cache, and `cuda-agent trajectories export` writes them back
as chat examples with a reward and metadata."""
import json
import sqlite3
import sys

import pytest

import agent_backend.dispatch as dispatch
from agent_backend.cli import main
from agent_backend.env.results import DEFAULT_PRECISION, Evaluation
from agent_backend.options import resolve
from agent_backend.policies import prompts
from agent_backend.search import search_task
from agent_backend.trajectories import FILE, Recorder, TrajectoryLog, make_record
from agent_backend.trajectory_export import export, reward
from kernel_cache import make_key
from test_env_cases import GOOD_ADD_RELU, add_relu_task, module_environment
from test_llm_policy import BROKEN, RIGHT, WRONG, ChatServer, scripted_coder

TASK = add_relu_task()
KEY = make_key(TASK.hash, TASK.inputs, "cpu", DEFAULT_PRECISION)
env = module_environment("cpu", compile_s=120, verify_s=60, profile_s=180, start_s=120)

METADATA = {"id", "time", "task_hash", "task_kind", "ops", "program", "inputs", "outputs", "gpu", "capability",
            "torch", "cuda", "key", "policy", "policy_revision", "origin", "params", "source", "status", "reason",
            "passed", "wins", "max_abs_err", "max_rel_err", "float64_err", "float64_ref_err", "ours_ms",
            "inductor_ms", "eager_ms", "speedup_vs_inductor", "counted_speedup", "speedup_vs_eager", "min_speedup"}


@pytest.fixture(scope="module")
def recorded(env, tmp_path_factory):
    """The trajectories of one search by the scripted coder (WRONG, BROKEN, then RIGHT)."""
    from agent_backend.policies import make_policy
    server = ChatServer(scripted_coder)
    try:
        policy = make_policy(resolve({"policy": "llm", "llm_url": server.url, "llm_model": "test-coder",
                                      "llm_samples": 2}, environ={}))
        trajectories = TrajectoryLog(tmp_path_factory.mktemp("cache") / FILE)
        search_task(TASK, env, policy, budget_s=600, max_candidates=8,
                    record=Recorder(trajectories, TASK, KEY, policy))
    finally:
        server.close()
    return trajectories


def test_export_round_trips_every_evaluated_candidate_as_a_chat_example(recorded, tmp_path):
    out = tmp_path / "train.jsonl"
    assert export(recorded, "jsonl", str(out)) == 3
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [set(row) for row in rows] == [{"messages", "reward", "metadata"}] * 3
    assert all(set(row["metadata"]) == METADATA for row in rows)
    assert [row["metadata"]["status"] for row in rows] == ["incorrect", "compile_error", "passed"]
    assert [row["messages"][-1]["content"] for row in rows] == [WRONG, BROKEN, RIGHT]
    wrong, broken, right = rows
    assert [m["role"] for m in wrong["messages"]] == ["system", "user", "assistant"]
    assert wrong["messages"][:2] == prompts.opening(TASK)
    # RIGHT came in the second turn of WRONG's conversation, after the environment's verdict.
    assert [m["role"] for m in right["messages"]] == ["system", "user", "assistant", "user", "assistant"]
    assert right["messages"][2]["content"] == WRONG and "outputs are wrong" in right["messages"][3]["content"]
    assert (wrong["reward"], broken["reward"]) == (-1.0, -1.0) and right["reward"] in (1.0, 2.0)  # CPU never wins
    meta = right["metadata"]
    assert meta["passed"] and not meta["wins"] and meta["float64_err"] <= 2 * max(meta["float64_ref_err"], 6e-8)
    assert meta["ours_ms"] > 0 and meta["inductor_ms"] > 0 and meta["speedup_vs_inductor"] > 0
    assert meta["program"] == TASK.program and meta["inputs"] == list(KEY.inputs) and meta["key"] == KEY.digest
    assert meta["outputs"] == ["float32[32,64]/[64,1]@cpu"] and meta["gpu"] == KEY.gpu
    assert meta["policy"] == "llm:test-coder" and json.loads(meta["params"]) == {"round": 2, "sample": 0}
    assert "clamp_min" in meta["source"] and "SyntaxError" in broken["metadata"]["reason"]


def test_message_texts_are_stored_once(recorded):
    with sqlite3.connect(recorded.path) as db:
        stored = db.execute("SELECT count(*) FROM texts_v1").fetchone()[0]
    sent = sum(len(r["messages"]) for r in recorded.records())
    assert sent == 2 + 2 + 4 and stored == 4, "system, task, WRONG and its verdict: the later turn repeats the first"


def test_the_command_line_writes_jsonl_and_says_why_parquet_cannot_be(recorded, tmp_path, monkeypatch, capsys):
    out = tmp_path / "t.jsonl"
    cache_dir = str(recorded.path.parent)
    assert main(["trajectories", "export", "--cache-dir", cache_dir, "-o", str(out)]) == 0
    assert len(out.read_text().splitlines()) == 3
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # as where pyarrow is not installed
    assert main(["trajectories", "export", "--format", "parquet", "--cache-dir", cache_dir, "-o", str(tmp_path / "t.parquet")]) == 2
    assert "Parquet needs pyarrow, which is not installed: pip install pyarrow" in capsys.readouterr().err


def test_parquet_round_trips_where_pyarrow_is_installed(recorded, tmp_path):
    pq = pytest.importorskip("pyarrow.parquet")
    assert export(recorded, "parquet", str(tmp_path / "t.parquet")) == 3
    rows = pq.read_table(tmp_path / "t.parquet").to_pylist()
    assert [r["metadata"]["status"] for r in rows] == ["incorrect", "compile_error", "passed"]
    assert rows[2]["messages"][-1] == {"role": "assistant", "content": RIGHT}


def test_a_template_candidate_is_recorded_as_the_answer_to_the_opening():
    class Templates:
        name, revision = "builtin", "r1"
    record = make_record(TASK, KEY, Templates(), GOOD_ADD_RELU, Evaluation("passed", verification={"trials": 7}))
    assert record["messages"] == prompts.opening(TASK)
    assert record["answer"] == f"```python\n{GOOD_ADD_RELU.source}```" and record["policy"] == "builtin"


@pytest.mark.parametrize("status,profile,expected", [
    ("compile_error", None, -1.0), ("rejected", None, -1.0), ("passed", None, 1.0),
    ("passed", {"wins": False, "speedup_vs_eager": 1.5, "min_speedup": 1.05}, 2.0),
    ("passed", {"wins": True, "speedup_vs_eager": 3.0, "min_speedup": 1.05}, 3.0),
])
def test_reward_milestones(status, profile, expected):
    assert reward({"status": status, "profile": profile}) == expected


def test_the_dispatcher_records_only_when_asked(env, tmp_path, monkeypatch):
    server = ChatServer([(200, {"choices": [{"index": 0, "message": {"role": "assistant", "content": RIGHT}}]})])
    monkeypatch.setattr(dispatch, "shared_environment", lambda *args: env)
    try:
        for record, cache_dir in ((True, tmp_path / "on"), (False, tmp_path / "off")):
            settings = resolve({"policy": "llm", "llm_url": server.url, "llm_model": "m", "llm_samples": 1,
                                "max_candidates": 1, "cache_dir": str(cache_dir), "record_trajectories": record},
                               environ={})
            dispatch.Dispatcher(settings)._search(TASK, KEY)
    finally:
        server.close()
    assert [r["evaluation"]["status"] for r in TrajectoryLog(tmp_path / "on" / FILE).records()] == ["passed"]
    assert not (tmp_path / "off" / FILE).exists()


def test_a_file_that_cannot_be_written_stops_recording_with_one_warning(tmp_path, caplog):
    (tmp_path / FILE).mkdir()  # a directory where the file should be
    trajectories = TrajectoryLog(tmp_path / FILE)
    record = make_record(TASK, KEY, type("P", (), {"name": "p", "revision": "r"})(), GOOD_ADD_RELU, Evaluation("passed"))
    assert trajectories.append([record]) is False and trajectories.append([record]) is False
    assert len([r for r in caplog.records if "cannot record trajectories" in r.getMessage()]) == 1


def test_a_file_that_is_not_a_trajectory_log_is_an_error_on_export(tmp_path, capsys):
    (tmp_path / FILE).write_bytes(b"not a database" * 100)
    assert main(["trajectories", "export", "--cache-dir", str(tmp_path), "-o", str(tmp_path / "t.jsonl")]) == 1
    assert f"cannot read {tmp_path / FILE}" in capsys.readouterr().err
