"""Searches in the background (mode "background").

A compile leaves each subgraph with no cached result to Inductor at once and queues its search
here. One thread runs the queued searches one at a time, in order, through the same worker pool
a blocking search uses, resting between worker requests so that the workers are busy at most
`background_share` of the time. A result reaches the kernel cache whole (one transaction) or not
at all. The next compile, `refresh()`, or the next process picks the winners up.

While the process compiles a graph (backend.py holds `compiling()` around each of Inductor's
compiles, forward and backward), no search starts and a running one makes no new worker request:
the queue's thread shares the interpreter with the compile, and its Python work would lengthen
the compile the user waits for.

At exit the queue stops: queued searches are dropped and the running one is abandoned (its
workers are killed and a result it still returns is not written), so a process never waits
for a search and never caches a verdict reached by killing its workers. A dropped search runs
again in a later process: the graphs compiled while it was pending are never replayed from
Inductor's graph cache as final (Dispatcher.leave_to_background says why).
"""
from __future__ import annotations

import atexit
import contextlib
import logging
import math
import os
import threading
import time
from collections import deque
from typing import Callable, NamedTuple

log = logging.getLogger("cuda_agent")


class _Job(NamedTuple):
    name: str
    search: Callable[[], object]  # returns the result to store, or None for nothing
    store: Callable[[object], object]


_compiles = 0  # compiles running in this process (compiling())
_compiles_cond = threading.Condition()
_last_compile_end = -math.inf  # time.monotonic() when the last compile ended
# After a compile, Dynamo still builds guards and the first call runs the new graph (Triton's
# autotuning, CUDA graphs' recording) while the user waits: a search started at once competed with
# that call on an H100 machine (0.1-0.25 s of GPT-2's first call; 1 s on a freshly started one).
QUIET_AFTER_COMPILE_S = 2.0


@contextlib.contextmanager
def compiling():
    """Hold background searches back while the body (one of Inductor's compiles) runs."""
    global _compiles
    with _compiles_cond:
        _compiles += 1
    try:
        yield
    finally:
        global _last_compile_end
        with _compiles_cond:
            _compiles -= 1
            _last_compile_end = time.monotonic()
            _compiles_cond.notify_all()


def after_compiles(stopped: threading.Event, poll_s: float = 0.5, quiet_s: float = QUIET_AFTER_COMPILE_S) -> None:
    """Return once no compile has run for `quiet_s` seconds (at once if none did lately), or the
    queue has stopped."""
    with _compiles_cond:
        while not stopped.is_set():
            quiet_left = _last_compile_end + quiet_s - time.monotonic()
            if not _compiles and quiet_left <= 0:
                return
            _compiles_cond.wait(poll_s if _compiles else min(poll_s, quiet_left))


class SearchQueue:
    """Searches run one at a time on a daemon thread, each once per name while it is pending."""

    def __init__(self, on_stop: Callable[[], None] = lambda: None):
        self._cond = threading.Condition()
        self._jobs: deque[_Job] = deque()
        self._pending: set[str] = set()  # names queued or running
        self._thread: threading.Thread | None = None
        self._on_stop = on_stop
        self.stopped = threading.Event()

    def submit(self, name: str, search: Callable[[], object], store: Callable[[object], object]) -> bool:
        """Queue `search`, then `store(result)` unless the result is None or the queue stopped
        meanwhile. False when `name` is queued or running already, or the queue has stopped."""
        with self._cond:
            if self.stopped.is_set() or name in self._pending:
                return False
            self._pending.add(name)
            self._jobs.append(_Job(name, search, store))
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="cuda_agent-search", daemon=True)
                self._thread.start()
            self._cond.notify_all()
            return True

    def pending(self) -> int:
        """Searches queued or running."""
        with self._cond:
            return len(self._pending)

    def wait(self, timeout_s: float | None = None) -> bool:
        """Wait until no search is pending; False if some still are after `timeout_s`."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._pending, timeout_s)

    def stop(self, join_s: float = 5.0) -> int:
        """Drop the queued searches, abandon the running one (`on_stop` kills the workers it
        waits on) and write nothing more. Returns how many searches did not finish."""
        with self._cond:  # taken while a result is stored: a write in progress completes
            if self.stopped.is_set():
                return 0
            self.stopped.set()
            unfinished = len(self._pending)
            self._jobs.clear()
            self._cond.notify_all()
        self._on_stop()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(join_s)
        return unfinished

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._jobs or self.stopped.is_set())
                if self.stopped.is_set():
                    return
                job = self._jobs.popleft()
            try:
                after_compiles(self.stopped)
                result = job.search()
            except Exception as exc:  # a stop kills the workers under a search: that is no result
                result = None
                if not self.stopped.is_set():
                    log.warning("cuda_agent: background search %s failed (%s: %s); a later compile tries again",
                                job.name[:12], type(exc).__name__, exc, exc_info=True)
            with self._cond:
                try:
                    if result is not None and not self.stopped.is_set():
                        job.store(result)
                finally:
                    self._pending.discard(job.name)
                    self._cond.notify_all()


class PacedEnvironment:
    """An Environment as a background search uses it: one candidate at a time, on this thread
    (no pool of threads that interpreter shutdown would wait for), none while the process
    compiles, and after each request a rest as long as the request took times (1 / share - 1),
    so the workers are busy at most `share` of the wall time; a stop cuts the rest short."""

    def __init__(self, env, share: float, stopped: threading.Event):
        self.env, self.share, self.stopped = env, share, stopped

    def _paced(self, request: Callable[[], object]):
        after_compiles(self.stopped)
        start = time.monotonic()
        try:
            return request()
        finally:
            self.stopped.wait((time.monotonic() - start) * (1.0 / self.share - 1.0))

    def evaluate_many(self, task, candidates, profile: bool = True):
        return [self._paced(lambda: self.env.evaluate(task, c, profile)) for c in candidates]

    def time_reference(self, task, floors_path: str | None = None, copy_bytes: int | None = None):
        return self._paced(lambda: self.env.time_reference(task, floors_path, copy_bytes))


_queue: SearchQueue | None = None
_queue_lock = threading.Lock()


def searches(on_stop: Callable[[], None] = lambda: None) -> SearchQueue:
    """The process's queue, made on first use (with `on_stop`) and stopped at exit."""
    global _queue
    with _queue_lock:
        if _queue is None:
            _queue = SearchQueue(on_stop)
            # Registered now, after the kernel cache and worker pools registered their own exit
            # handlers, so that it runs before them (atexit runs the last registered first).
            atexit.register(_stop_at_exit)
        return _queue


def _stop_at_exit() -> None:
    queue = _queue
    if queue is not None:
        unfinished = queue.stop()
        if unfinished:
            log.info("cuda_agent: %d background search(es) did not finish; a later compile searches them again",
                     unfinished)


def _forget_in_child() -> None:
    """A forked child has none of the parent's threads: it starts a queue of its own if it needs one."""
    global _queue, _queue_lock
    _queue, _queue_lock = None, threading.Lock()


os.register_at_fork(after_in_child=_forget_in_child)


def pending() -> int:
    """Background searches queued or running in this process."""
    return _queue.pending() if _queue is not None else 0


def refresh(wait: bool = False, timeout_s: float | None = None) -> int:
    """Make every model compiled with the backend compile again on its next call, so that it
    picks up the kernels background searches have cached since (torch._dynamo.reset()).
    wait=True first waits (up to `timeout_s`) for the pending searches. Returns how many are
    still pending."""
    import torch._dynamo

    if wait and _queue is not None:
        _queue.wait(timeout_s)
    torch._dynamo.reset()
    return pending()
