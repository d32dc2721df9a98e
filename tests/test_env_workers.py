"""Worker supervision on the CPU: candidates that abort, segfault, exit or hang end with a
clear verdict within their time limit, the worker is replaced, and the next evaluation passes;
evaluations spread over several workers; profiling returns numbers."""
from __future__ import annotations

import dataclasses
import os
import signal
import threading
import time
from contextlib import contextmanager

import pytest

from agent_backend.env import Environment, Evaluation, Timeouts
from agent_backend.env.pool import WorkerHandle
from agent_backend.env.verify import VERIFICATION_PLAN
from test_env_cases import (CACHES_ONCE_TIMED, GOOD_ADD_RELU, STATIC_OUTPUT_ONCE_TIMED, add_relu_task, contiguous,
                            make_candidate, make_task, module_environment)

TASK = add_relu_task()
SHORT_S = 3.0
WORKER_START = {"worker_start:process", "worker_start:torch"}  # a request's wait for a (CPU) worker to start


# compile_s also bounds Inductor's compile of the reference, which can take a minute cold.
env = module_environment("cpu", compile_s=120, verify_s=30, profile_s=120, start_s=120)


@contextmanager
def short_limits(env):
    saved = env.timeouts
    env.timeouts = dataclasses.replace(saved, compile_s=SHORT_S, verify_s=SHORT_S)
    try:
        yield
    finally:
        env.timeouts = saved


def assert_recovers(env, ev: Evaluation):
    assert ev.worker_restarted
    assert env.evaluate(TASK, GOOD_ADD_RELU, profile=False).status == "passed"


CRASHES = {
    "abort": ("x = 1\nos.abort()", "SIGABRT"),
    "segfault": ("ctypes.string_at(0)", "SIGSEGV"),
    "exit": ("os._exit(3)", "exited with code 3"),
}


@pytest.mark.parametrize("case", CRASHES, ids=list(CRASHES))
def test_crashing_forward_gives_crash_verdict_and_a_new_worker(env, case):
    body, reason = CRASHES[case]
    ev = env.evaluate(TASK, make_candidate(body, header="import ctypes, os"), profile=False)
    assert ev.status == "crash" and reason in ev.reason and "during verify" in ev.reason, ev.reason
    if case != "exit":  # faulthandler's dump names the line
        assert "at <candidate> line" in ev.reason and "in forward" in ev.reason, ev.reason
    assert_recovers(env, ev)


@pytest.mark.parametrize("where, phase", [("forward", "verify"), ("__init__", "compile")])
def test_infinite_loop_times_out_without_hanging_the_caller(env, where, phase):
    loop = "while True:\n    pass"
    candidate = make_candidate(loop if where == "forward" else "return a + b", init=loop if where == "__init__" else "pass")
    with short_limits(env):
        start = time.monotonic()
        ev = env.evaluate(TASK, candidate, profile=False)
        elapsed = time.monotonic() - start
    assert ev.status == "timeout" and f"{phase} ran past its limit of 3 s" in ev.reason, ev.reason
    assert "at <candidate> line" in ev.reason and f"in {where}" in ev.reason, ev.reason
    assert elapsed < SHORT_S + 15
    assert_recovers(env, ev)


def test_worker_killed_while_idle_is_replaced_silently(env):
    env.evaluate(TASK, GOOD_ADD_RELU, profile=False)
    (handle,) = env._handles
    os.kill(handle.process.pid, signal.SIGKILL)
    handle.process.wait()
    ev = env.evaluate(TASK, GOOD_ADD_RELU, profile=False)
    assert ev.status == "passed"
    # the wait for the new worker is its own phase, with the worker's own account of its parts
    start = ev.phase_s["worker_start:process"] + ev.phase_s["worker_start:torch"]
    assert ev.phase_s["worker_start:process"] > 0 and ev.phase_s["worker_start:torch"] > 0, ev.phase_s
    assert set(ev.phase_s) == WORKER_START | {"load", "verify"}
    again = env.evaluate(TASK, GOOD_ADD_RELU, profile=False)
    assert set(again.phase_s) == {"load", "verify"}, "a running worker costs no start-up"
    assert again.phase_s["load"] < start


def test_sys_exit_in_forward_is_a_runtime_error(env):
    ev = env.evaluate(TASK, make_candidate("sys.exit(0)", header="import sys"), profile=False)
    assert ev.status == "runtime_error" and "SystemExit" in ev.reason, ev.reason


def test_profile_on_cpu_returns_numbers(env):
    ev = env.evaluate(TASK, GOOD_ADD_RELU, profile=True)
    assert ev.status == "passed", ev.reason
    profile = ev.profile
    assert "note" not in profile, profile["note"]
    for name in ("ours_ms", "inductor_ms", "eager_ms"):
        stats = profile[name]
        assert stats["trials"] >= 20 and 0 < stats["p10"] <= stats["median"] <= stats["p90"], (name, stats)
    assert profile["speedup_vs_inductor"] == pytest.approx(profile["inductor_ms"]["median"] / profile["ours_ms"]["median"])
    assert profile["counted_speedup"] == pytest.approx(
        profile["inductor_ms"]["median"] / max(profile["ours_ms"]["median"], profile["ours_ms"]["host_median"]))
    assert profile["min_speedup"] == 1.05
    assert not profile["wins"]  # host times include torch.compile's wrappers: never a basis for a win
    assert ev.verification["trials"] == len(VERIFICATION_PLAN) + 1  # the check after timing is one more trial
    assert set(ev.phase_s) - WORKER_START == {"prepare", "load", "verify", "profile"}
    assert all(seconds > 0 for seconds in ev.phase_s.values())
    assert Evaluation.from_json(ev.to_json()) == ev


def test_candidate_that_caches_only_once_timing_starts_is_caught_after_timing(env):
    ev = env.evaluate(TASK, CACHES_ONCE_TIMED, profile=True)
    assert ev.status in ("rejected", "incorrect") and ev.reason.startswith("after timing: "), ev.reason
    assert ev.profile is None


def test_candidate_that_reuses_one_output_buffer_once_timed_is_caught_after_timing(env):
    """Timed calls' outputs are dropped as they come; the last timed input set's call is kept, so
    the check after timing sees the buffer returned again."""
    ev = env.evaluate(TASK, STATIC_OUTPUT_ONCE_TIMED, profile=True)
    assert ev.status == "rejected" and ev.reason.startswith("after timing: "), ev.reason
    assert "output returned by an earlier call" in ev.reason, ev.reason


def test_evaluate_many_spreads_over_workers_and_keeps_order():
    candidates = [GOOD_ADD_RELU, make_candidate("os.abort()", header="import os"), make_candidate("return a")]
    with Environment(["cpu", "cpu"], Timeouts(compile_s=30, verify_s=30, start_s=120)) as env:
        evaluations = env.evaluate_many(TASK, candidates, profile=False)
        processes = [h.process for h in env._handles]
    assert [ev.status for ev in evaluations] == ["passed", "crash", "rejected"]
    assert all(p.poll() is not None for p in processes)  # closed: no worker left behind


def test_a_failure_of_the_verifier_itself_is_a_verdict_not_a_crash_of_the_caller(env):
    """Regression: the worker's own failure comes back without verification evidence, which
    made the caller raise KeyError: 'verification' and left the task unjudged."""
    spec = contiguous((4, 4), "float32", "cpu")
    broken = make_task("reference_raises", "raise RuntimeError('the reference cannot run')", [spec, spec], [spec],
                       "pointwise", ("aten.add.Tensor",))
    ev = env.evaluate(broken, make_candidate("return a + b"), profile=False)
    assert ev.status == "runtime_error" and "the verifier failed" in ev.reason
    assert "the reference cannot run" in ev.reason and ev.verification == {}


def test_a_task_whose_reference_the_worker_dropped_is_still_timed_against_inductor(env):
    """Regression: the caller remembered which tasks a worker had compiled with Inductor, but the
    worker keeps only its last few; a task it had dropped was profiled with "Inductor's reference
    was not compiled in this worker" and left unjudged (24 tasks of a BERT training step)."""
    assert "note" not in env.evaluate(TASK, GOOD_ADD_RELU, profile=True).profile
    spec = contiguous((8, 8), "float32", "cpu")
    for i in range(9):  # more tasks than a worker keeps, loaded without timing: no Inductor compile
        other = make_task(f"other_{i}", "return aten.relu.default(aten.add.Tensor(in0, in1))", [spec, spec], [spec],
                          "pointwise", ("aten.add.Tensor", "aten.relu.default"))
        assert env.evaluate(other, GOOD_ADD_RELU, profile=False).status == "passed"
    again = env.evaluate(TASK, GOOD_ADD_RELU, profile=True)
    assert again.status == "passed" and "note" not in again.profile, again.profile.get("note")
    assert again.profile["inductor_ms"]["median"] > 0


def test_inductors_reference_is_timed_alone(env, tmp_path):
    """The gate's request: Inductor's reference compiled and timed as candidates are timed
    against it; on a CPU worker no floors are measured (they are a GPU's), and none are written."""
    timing = env.time_reference(TASK, floors_path=str(tmp_path / "gpu_floors.json"), copy_bytes=1 << 20)
    assert timing.status == "passed", timing.reason
    stats = timing.inductor_ms
    assert stats["trials"] >= 20 and 0 < stats["p10"] <= stats["median"] <= stats["p90"], stats
    assert timing.floors is None and "CUDA GPUs only" in timing.floors_note
    assert timing.copy_ms is None, "a copy is timed on a GPU only, where the gate has floors"
    assert set(timing.phase_s) - WORKER_START == {"prepare", "reference"} and timing.device == "cpu"
    assert not (tmp_path / "gpu_floors.json").exists()


def test_a_reference_inductor_cannot_run_is_a_verdict(env):
    spec = contiguous((4, 4), "float32", "cpu")
    broken = make_task("reference_raises_when_timed", "raise RuntimeError('the reference cannot run')", [spec, spec],
                       [spec], "pointwise", ("aten.add.Tensor",))
    timing = env.time_reference(broken)
    assert timing.status == "compile_error" and "the reference cannot run" in timing.reason
    assert timing.inductor_ms is None


def test_closing_while_a_restart_kills_its_worker_waits_its_turn(tmp_path, monkeypatch):
    """The environment closing (at exit, say) while a request's thread replaces its worker: the
    close waits for the restart, then stops the new worker, so the pipe is closed once and no
    worker outlives the close. The restart's kill is held until the close is under way."""
    handle = WorkerHandle("cpu", str(tmp_path), 0)
    handle.start()
    killed, in_first_kill, release = [], threading.Event(), threading.Event()
    real_killpg = os.killpg

    def slow_killpg(pid, sig):  # the first kill lingers, as a worker stuck in the driver would
        killed.append(pid)
        if not in_first_kill.is_set():
            in_first_kill.set()
            release.wait(10)
        real_killpg(pid, sig)

    monkeypatch.setattr(os, "killpg", slow_killpg)
    errors = []

    def run(step):
        try:
            step()
        except Exception as e:  # noqa: BLE001 - the test reports whatever a thread raised
            errors.append(e)

    restarting = threading.Thread(target=run, args=(handle.restart,))
    closing = threading.Thread(target=run, args=(handle.close,))
    try:
        restarting.start()
        assert in_first_kill.wait(10)
        closing.start()
        time.sleep(0.5)  # taking no turns, the close would now stop the worker under the restart's feet
    finally:
        release.set()
        for thread in (restarting, closing):
            if thread.ident is not None:  # started
                thread.join(30)
        handle.close()  # whatever happened, no worker is left behind
    assert not errors, errors
    assert handle.closed and handle.process is None and handle.conn is None
    assert len(set(killed)) == 2, "the close stopped the worker the restart started"
    for pid in killed:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
