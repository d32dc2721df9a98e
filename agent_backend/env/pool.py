"""The caller's side: one worker process per device, time limits per phase, verdicts.

Workers are started lazily (importing torch takes seconds) and kept between requests; each
serves one request at a time. A worker that runs past a phase's limit, dies (any exit code, a
signal), breaks its CUDA context or may have been tampered with is killed with its whole
process group (compilers it started included) and replaced; the evaluation then says
"timeout" or "crash" and names the phase. The calling process never runs candidate code, never
unpickles anything from a worker, and never waits past a limit.

Workers are plain `subprocess` children running a fresh interpreter (no fork, so no inherited
CUDA state), rather than multiprocessing's spawn, which would re-run the user's unguarded
`__main__` module in every worker.
"""
from __future__ import annotations

import contextlib
import json
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from multiprocessing import Pipe
from multiprocessing.connection import wait
from typing import Iterator

from agent_backend.env.results import (ContextTiming, Evaluation, Failure, ReferenceTiming, Timeouts,
                                       precision_settings)
from agent_backend.specs import Candidate, Task

DEFAULT_MIN_SPEEDUP = 1.05
_PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_LOG_TAIL_BYTES = 64 * 1024
_WORKER_ENV = {
    # One process compiles Inductor's reference: no pool of compile subprocesses to outlive a
    # killed worker, and our subgraphs are small.
    "TORCHINDUCTOR_COMPILE_THREADS": "1",
    "PYTHONUNBUFFERED": "1",
}


def default_devices() -> list[str]:
    import torch

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return [f"cuda:{i}" for i in range(count)] or ["cpu"]


@dataclass
class Reply:
    """A worker's answer, or why there is none (`failure`, after which the worker was replaced)."""

    data: dict | None = None
    failure: Failure | None = None


_CANDIDATE_FRAME = re.compile(r'File "<candidate>", line (\d+) in (\S+)')


def _where_in_candidate(log: str) -> str:
    """'at <candidate> line N in f' from the innermost candidate frame faulthandler dumped."""
    match = _CANDIDATE_FRAME.search(log)
    return f" at <candidate> line {match.group(1)} in {match.group(2)}" if match else ""


def _last_words(log: str) -> str:
    """The line of the worker's output that best says why it died."""
    match = re.search(r"^(Fatal Python error: .*|.*(?:CUDA error|terminate called).*)$", log, re.MULTILINE)
    lines = [line.strip() for line in log.splitlines() if line.strip()]
    words = match.group(1).strip() if match else (lines[-1] if lines else "")
    return f"; its last output: {words[:300]}" if words else ""


def _exit_description(returncode: int | None) -> str:
    if returncode is None:
        return "stopped answering"
    if returncode < 0:
        try:
            return f"was killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"was killed by signal {-returncode}"
    return f"exited with code {returncode}"


class WorkerHandle:
    """One worker process for one device, from the caller's side."""

    def __init__(self, device: str, log_dir: str, index: int):
        self.device = device
        self.log_path = os.path.join(log_dir, f"worker-{index}.log")
        self.process: subprocess.Popen | None = None
        self.conn = None
        self.ready = False
        self.closed = False  # set when its environment closes: a request in flight then starts no new worker
        # Held to start, stop or close: the thread closing the environment (at exit too) and a
        # request's thread replacing its worker take turns, so one pipe is never closed twice
        # and no worker starts after the close.
        self._lock = threading.RLock()
        # Seconds requests waited for this worker to start, by part, since the last take_start_s():
        # "worker_start:<part>" as the worker timed its own start-up, "worker_start:process" the
        # rest (the process's start and imports); the parts add up to the whole wait.
        self.start_s: dict[str, float] = {}

    def start(self) -> None:
        with self._lock:
            self._start()

    def _start(self) -> None:
        if self.closed:
            raise RuntimeError("the environment is closed")
        parent_conn, child_conn = Pipe(duplex=True)
        fd = child_conn.fileno()
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-c", "from agent_backend.env.worker import main; main()", str(fd), self.device,
                 str(os.getpid())],
                pass_fds=[fd], stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True, cwd=_PACKAGE_ROOT, env=self._environment())
        child_conn.close()
        self.conn = parent_conn
        self.ready = False

    @staticmethod
    def _environment() -> dict:
        path = os.pathsep.join(p for p in (_PACKAGE_ROOT, os.environ.get("PYTHONPATH")) if p)
        return {**os.environ, **_WORKER_ENV, "PYTHONPATH": path}

    def stop(self) -> None:
        """Kill the worker and everything it started; never waits long."""
        with self._lock:
            self._stop()

    def _stop(self) -> None:
        if self.process is not None:
            try:
                os.killpg(self.process.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                self.process.kill()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass  # stuck in the driver; it is gone from our side, the kernel reaps it later
        if self.conn is not None:
            self.conn.close()
        self.process, self.conn, self.ready = None, None, False

    def restart(self) -> None:
        with self._lock:
            self._stop()
            self._start()

    def close(self) -> None:
        """Stop the worker for good: a request in flight then starts no new one."""
        with self._lock:
            self.closed = True
            self._stop()

    def _returncode(self) -> int | None:
        """The exit status of a worker that closed its end; None if it does not exit soon."""
        try:
            return self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            return None

    def _log_text(self) -> str:
        try:
            with open(self.log_path, "rb") as log:
                log.seek(max(0, os.path.getsize(self.log_path) - _LOG_TAIL_BYTES))
                return log.read().decode(errors="replace")
        except OSError:
            return ""

    def _receive(self, timeout_s: float, phase: str) -> Reply:
        """The next message, or a failure after which the worker has been replaced."""
        if wait([self.conn], timeout_s):
            try:
                return Reply(json.loads(self.conn.recv_bytes()))
            except (EOFError, OSError):
                reason = f"the worker {_exit_description(self._returncode())} during {phase}"
            except ValueError:
                reason = f"the worker sent an unreadable reply during {phase}"
            log = self._log_text()
            failure = Failure("crash", reason + _where_in_candidate(log) + _last_words(log), restart=True)
        else:
            log = self._log_text()
            failure = Failure("timeout", f"{phase} ran past its limit of {timeout_s:g} s{_where_in_candidate(log)}",
                              restart=True)
        self.restart()
        return Reply(failure=failure)

    def request(self, message: dict, timeout_s: float, phase: str, start_s: float) -> Reply:
        if self.process is None:
            self.start()
        if not self.ready:
            waited = time.monotonic()
            reply = self._receive(start_s, "the worker's start-up")
            parts = {} if reply.failure else reply.data.get("start_s", {})
            self._add_start_s({"worker_start:process": time.monotonic() - waited - sum(parts.values()),
                               **{f"worker_start:{part}": seconds for part, seconds in parts.items()}})
            if reply.failure:
                return reply
            self.ready = True
        os.truncate(self.log_path, 0)  # the log then holds this request's output only
        try:
            self.conn.send_bytes(json.dumps({**message, "timeout_s": timeout_s}).encode())
        except OSError:  # died while idle, e.g. killed from outside: not this request's doing
            self.restart()
            return self.request(message, timeout_s, phase, start_s)
        return self._receive(timeout_s, phase)

    def _add_start_s(self, parts: dict[str, float]) -> None:
        for part, seconds in parts.items():
            self.start_s[part] = self.start_s.get(part, 0.0) + seconds

    def take_start_s(self) -> dict[str, float]:
        """The start-up seconds waited since the last call (a restart mid-request included)."""
        taken, self.start_s = self.start_s, {}
        return taken


def _kill_all(handles: list[WorkerHandle], log_dir: str) -> None:
    for handle in handles:
        handle.close()
    shutil.rmtree(log_dir, ignore_errors=True)


class Environment:
    """Compiles, verifies and profiles candidates in worker processes, one per device.

    `evaluate` may be called from several threads at once; each call takes a free worker (or
    waits for one). `evaluate_many` spreads candidates over all workers in parallel.
    """

    def __init__(self, devices: list[str] | None = None, timeouts: Timeouts | None = None,
                 precision: dict | None = None, min_speedup: float = DEFAULT_MIN_SPEEDUP,
                 build_root: str | None = None):
        self.devices = list(devices) if devices else default_devices()
        self.timeouts = timeouts or Timeouts()
        self.precision = precision_settings(precision)
        self.min_speedup = min_speedup
        self.build_root = build_root
        self._log_dir = tempfile.mkdtemp(prefix="cuda_agent_workers_")
        self._handles = [WorkerHandle(device, self._log_dir, i) for i, device in enumerate(self.devices)]
        self._free: queue.Queue[WorkerHandle] = queue.Queue()
        for handle in self._handles:
            self._free.put(handle)
        self._start_lock = threading.Lock()
        self._started = False
        self._close = weakref.finalize(self, _kill_all, self._handles, self._log_dir)

    def close(self) -> None:
        self._close()

    def __enter__(self) -> "Environment":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def _start_all(self) -> None:
        """On first use start every worker at once, so their slow start-ups overlap."""
        with self._start_lock:
            if not self._started:
                for handle in self._handles:
                    handle.start()
                self._started = True

    @contextlib.contextmanager
    def _free_worker(self) -> Iterator[WorkerHandle]:
        """A free worker (waiting for one), the workers started on first use."""
        if not self._close.alive:
            raise RuntimeError("the environment is closed")
        self._start_all()
        handle = self._free.get()
        try:
            yield handle
        finally:
            self._free.put(handle)

    def evaluate(self, task: Task, candidate: Candidate, profile: bool = True) -> Evaluation:
        with self._free_worker() as handle:
            return _Evaluation(self, handle, task, candidate).run(profile)

    def evaluate_many(self, task: Task, candidates: list[Candidate], profile: bool = True) -> list[Evaluation]:
        with ThreadPoolExecutor(max_workers=len(self._handles)) as pool:
            return list(pool.map(lambda c: self.evaluate(task, c, profile), candidates))

    def time_reference(self, task: Task, floors_path: str | None = None,
                       copy_bytes: int | None = None) -> ReferenceTiming:
        """Inductor's time for `task` on a free worker (its reference stays compiled there for
        the candidates that follow), interleaved on a GPU with a copy moving `copy_bytes`, and
        with that GPU's floors when `floors_path` names their file (env/floors.py)."""
        with self._free_worker() as handle:
            return _Evaluation(self, handle, task, None).run_reference(floors_path, copy_bytes)

    def time_in_context(self, before: Task, after: Task, winners: list[dict],
                        compare: bool = True) -> ContextTiming:
        """A whole graph (`before`, as Inductor compiles it) against the same graph calling our
        winners (`after`; winners: runtime.Winner.to_json() of each), both compiled with
        Inductor on a free worker, checked to agree (where `compare`: not where they draw random
        numbers), and timed interleaved (in_context.py)."""
        with self._free_worker() as handle:
            timeouts = self.timeouts
            request = {"op": "context", "before": before.to_json(), "after": after.to_json(), "winners": winners,
                       "precision": self.precision, "compare": compare}
            reply = handle.request(request, 2 * timeouts.compile_s + timeouts.profile_s, "the in-context check",
                                   timeouts.start_s)
            if reply.failure:
                return ContextTiming(reply.failure.status, reply.failure.reason, device=handle.device)
            if reply.data.get("restart"):
                handle.restart()
            data = reply.data
            return ContextTiming(data["status"], data.get("reason", ""), data.get("ours_ms"), data.get("inductor_ms"),
                                 handle.device, data.get("ours_gpu_ms"), data.get("inductor_gpu_ms"),
                                 data.get("ours_host_ms"), data.get("inductor_host_ms"), data.get("judged_flush"))


class _Evaluation:
    """The phases of one evaluation on one worker: prepare (Inductor, once per task and
    worker), load, verify, profile; or, with no candidate, prepare and time the reference."""

    def __init__(self, env: Environment, handle: WorkerHandle, task: Task, candidate: Candidate | None):
        self.env, self.handle, self.task, self.candidate = env, handle, task, candidate
        self.restarted = False
        self.phase_s: dict[str, float] = {}

    def _call(self, message: dict, timeout_s: float, phase: str) -> Reply:
        """One request; its seconds go to phase_s under its op, less any wait for the worker to
        start, which goes under "worker_start:<part>" (WorkerHandle.start_s)."""
        started = time.monotonic()
        self.handle.take_start_s()  # one an in-context check's request waited for: not this evaluation's
        reply = self.handle.request(message, timeout_s, phase, self.env.timeouts.start_s)
        waited = self.handle.take_start_s()
        self.phase_s[message["op"]] = time.monotonic() - started - sum(waited.values())
        for part, seconds in waited.items():
            self.phase_s[part] = self.phase_s.get(part, 0.0) + seconds
        if reply.failure:  # the handle has already replaced the worker
            self.restarted = True
        elif reply.data.get("restart"):  # the worker answered, but cannot be used any more
            self.handle.restart()
            self.restarted = True
        return reply

    def run_reference(self, floors_path: str | None, copy_bytes: int | None) -> ReferenceTiming:
        def failed(status: str, reason: str) -> ReferenceTiming:
            return ReferenceTiming(status, reason, device=self.handle.device, phase_s=dict(self.phase_s))
        timeouts, task_json = self.env.timeouts, self.task.to_json()
        reply = self._call({"op": "prepare", "task": task_json, "precision": self.env.precision},
                           timeouts.compile_s, "Inductor's compile of the task")
        if reply.failure:
            return failed(reply.failure.status, reply.failure.reason)
        if not reply.data["ok"]:
            return failed("compile_error", reply.data["error"])
        reply = self._call({"op": "reference", "task": task_json, "precision": self.env.precision,
                            "floors_path": floors_path, "copy_bytes": copy_bytes}, timeouts.profile_s,
                           "timing Inductor's reference")
        if reply.failure:
            return failed(reply.failure.status, reply.failure.reason)
        if reply.data["status"] != "passed":
            return failed(reply.data["status"], reply.data["reason"])
        return ReferenceTiming("passed", inductor_ms=reply.data["inductor_ms"], copy_ms=reply.data.get("copy_ms"),
                               floors=reply.data.get("floors"),
                               floors_note=reply.data.get("floors_note", ""), device=self.handle.device,
                               phase_s=dict(self.phase_s))

    def _verdict(self, status: str, reason: str = "", **fields) -> Evaluation:
        return Evaluation(status=status, reason=reason, worker_restarted=self.restarted, device=self.handle.device,
                          phase_s=dict(self.phase_s), **fields)

    def run(self, profile: bool) -> Evaluation:
        timeouts, task_json = self.env.timeouts, self.task.to_json()
        inductor_note = None
        # Asked every time (a no-op in a worker that has it): the worker keeps the references of
        # its last few tasks only, so a set kept here went stale and left tasks untimed.
        if profile:
            reply = self._call({"op": "prepare", "task": task_json, "precision": self.env.precision},
                               timeouts.compile_s, "Inductor's compile of the task")
            if reply.failure:
                inductor_note = f"Inductor's reference is missing: {reply.failure.reason}"
            elif not reply.data["ok"]:
                inductor_note = reply.data["error"]

        reply = self._call({"op": "load", "task": task_json, "candidate": self.candidate.to_json(),
                            "precision": self.env.precision, "build_root": self.env.build_root},
                           timeouts.compile_s, "compile")
        if reply.failure:
            return self._verdict(reply.failure.status, reply.failure.reason)
        compile_s = reply.data["compile_s"]
        if reply.data["status"] != "loaded":
            return self._verdict(reply.data["status"], reply.data["reason"], compile_s=compile_s)

        reply = self._call({"op": "verify", "keep": profile}, timeouts.verify_s, "verify")
        if reply.failure:
            return self._verdict(reply.failure.status, reply.failure.reason, compile_s=compile_s)
        # A failure of the verifier itself (the worker's own error) comes back with no evidence.
        verification = reply.data.get("verification", {})
        if reply.data["status"] != "passed" or not profile:
            return self._verdict(reply.data["status"], reply.data["reason"], compile_s=compile_s,
                                 verification=verification)

        reply = self._call({"op": "profile", "min_speedup": self.env.min_speedup, "inductor_note": inductor_note},
                           timeouts.profile_s, "profile")
        if reply.failure:
            return self._verdict(reply.failure.status, reply.failure.reason, compile_s=compile_s,
                                 verification=verification)
        return self._verdict(reply.data["status"], reply.data["reason"], compile_s=compile_s,
                             verification=reply.data.get("verification", verification),
                             profile=reply.data.get("profile"))
