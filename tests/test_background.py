"""Searches in the background (mode "background"): the queue runs one search at a time, once per
key while it is pending, and stores whole results only; a compile returns at once and the next
compile or refresh() picks results up; a graph compiled while its searches were pending is never
replayed from Inductor's graph cache as final; a process exits at once with a search running,
killing its workers and caching nothing.

Kernels are searched on CUDA tasks only; here the dispatcher's device rule is lifted
(`searchable_on_cpu`) so the real pool, worker processes and search loop run on the CPU."""
import json
import os
import subprocess
import sys
import textwrap
import threading
import time

import pytest
import torch

import agent_backend
from agent_backend import background, backend, runtime
from agent_backend.background import PacedEnvironment, SearchQueue
from agent_backend.dispatch import Dispatcher, close_shared_environments
from agent_backend.options import resolve
from helpers import collect_tasks, put_cached_entry
from kernel_cache import KernelCache
from test_env_cases import make_candidate

# -- the queue ------------------------------------------------------------------------------------


class Recorder:
    """Searches that note when they run and return what they are given."""

    def __init__(self):
        self.ran, self.stored = [], []

    def search(self, name, result, seconds=0.0, release: threading.Event | None = None):
        def run():
            self.ran.append(name)
            if release is not None:
                release.wait(30)
            time.sleep(seconds)
            if isinstance(result, Exception):
                raise result
            return result
        return run

    def store(self, value):
        self.stored.append(value)


def test_searches_run_one_at_a_time_in_order_and_once_per_key():
    queue, rec = SearchQueue(), Recorder()
    release = threading.Event()
    assert queue.submit("a", rec.search("a", 1, release=release), rec.store)
    assert queue.submit("b", rec.search("b", 2), rec.store)
    assert not queue.submit("a", rec.search("a again", 3), rec.store), "a is still pending"
    assert queue.pending() == 2
    release.set()
    assert queue.wait(30)
    assert rec.ran == ["a", "b"] and rec.stored == [1, 2] and queue.pending() == 0
    assert queue.submit("a", rec.search("a later", 4), rec.store), "a finished: it may be searched again"
    assert queue.wait(30) and rec.stored == [1, 2, 4]
    queue.stop()


def test_a_search_that_fails_or_finds_nothing_stores_nothing(caplog):
    queue, rec = SearchQueue(), Recorder()
    queue.submit("broken", rec.search("broken", RuntimeError("worker gone")), rec.store)
    queue.submit("nothing", rec.search("nothing", None), rec.store)
    queue.submit("fine", rec.search("fine", "entry"), rec.store)
    assert queue.wait(30)
    assert rec.stored == ["entry"]
    assert "background search broken failed (RuntimeError: worker gone)" in caplog.text
    queue.stop()


def test_stop_drops_queued_searches_and_stores_nothing_more():
    stopped_workers = []
    queue, rec = SearchQueue(on_stop=lambda: stopped_workers.append(True)), Recorder()
    release = threading.Event()
    queue.submit("running", rec.search("running", "late result", release=release), rec.store)
    queue.submit("queued", rec.search("queued", "never"), rec.store)
    while rec.ran != ["running"]:
        time.sleep(0.01)
    threading.Timer(0.2, release.set).start()  # the running search returns after the stop began
    assert queue.stop(join_s=10) == 2
    assert stopped_workers == [True]
    assert rec.ran == ["running"] and rec.stored == [], "a result reached after a stop is not written"
    assert not queue.submit("after", rec.search("after", 1), rec.store)


def test_pacing_rests_for_the_share_of_time_not_used_and_a_stop_cuts_it_short():
    class SlowEnvironment:
        def evaluate(self, task, candidate, profile=True):
            time.sleep(0.1)
            return f"verdict on {candidate}"

    stopped = threading.Event()
    paced = PacedEnvironment(SlowEnvironment(), share=0.25, stopped=stopped)
    start = time.monotonic()
    assert paced.evaluate_many(None, ["a", "b"]) == ["verdict on a", "verdict on b"]
    assert 0.75 <= time.monotonic() - start < 2.0, "busy 0.1 s, then 0.3 s of rest, per candidate"
    stopped.set()
    start = time.monotonic()
    paced.evaluate_many(None, ["a", "b"])
    assert time.monotonic() - start < 0.5


def test_no_search_starts_and_no_worker_request_is_made_while_the_process_compiles():
    queue, rec = SearchQueue(), Recorder()
    with background.compiling():
        assert queue.submit("a", rec.search("a", 1), rec.store)
        time.sleep(0.3)
        assert rec.ran == [], "a search started during a compile"
    assert queue.wait(timeout_s=10) and rec.ran == ["a"] and rec.stored == [1]

    class Environment:
        def evaluate(self, task, candidate, profile=True):
            return time.monotonic()

    paced = PacedEnvironment(Environment(), share=1.0, stopped=threading.Event())
    with background.compiling():
        released = time.monotonic() + 0.3
        done = []
        worker = threading.Thread(target=lambda: done.extend(paced.evaluate_many(None, ["x"])))
        worker.start()
        time.sleep(0.3)
    worker.join(10)
    assert done and done[0] >= released, "the request ran during the compile"


def test_searches_wait_for_a_quiet_spell_after_a_compile():
    """The compile's first call (guards, autotuning) runs right after it: a search waits until
    no compile has run for quiet_s, and not at all once that has passed."""
    stopped = threading.Event()
    with background.compiling():
        pass
    start = time.monotonic()
    background.after_compiles(stopped, poll_s=0.05, quiet_s=0.4)
    assert 0.3 <= time.monotonic() - start < 2.0
    start = time.monotonic()
    background.after_compiles(stopped, poll_s=0.05, quiet_s=0.4)
    assert time.monotonic() - start < 0.1


def test_a_stop_ends_the_wait_for_a_compile():
    stopped = threading.Event()
    threading.Timer(0.2, stopped.set).start()
    start = time.monotonic()
    with background.compiling():
        background.after_compiles(stopped, poll_s=0.05)
    assert time.monotonic() - start < 2.0


def test_the_backend_holds_searches_back_while_inductor_compiles(monkeypatch):
    seen = []
    real = backend.compile_fx_inner
    monkeypatch.setattr(backend, "compile_fx_inner", lambda *a, **k: (seen.append(background._compiles),
                                                                     real(*a, **k))[1])
    torch._dynamo.reset()
    x = torch.randn(8, 8, requires_grad=True)
    torch.compile(lambda t: (t.sin() * 2).sum(), backend="cuda_agent", options={"mode": "cached"})(x).backward()
    assert seen == [1, 1], "the forward and the lazily compiled backward each run held"
    assert background._compiles == 0


# -- the dispatcher and the backend, with real workers on the CPU ---------------------------------

class ListPolicy:
    """Proposes a fixed list once."""

    name, revision = "test-list", "1"

    def __init__(self, candidates):
        self.candidates, self.proposals = candidates, 0

    def why_not(self, task):
        return None

    def propose(self, task, feedback):
        if feedback:
            return []
        self.proposals += 1
        return list(self.candidates)


class Gate(torch.nn.Module):
    def forward(self, x, y):
        return torch.tanh(x * 0.5 + y) * torch.sigmoid(y)


GATE_WINNER = '''
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x, y):
        return torch.tanh(x * 0.5 + y) * torch.sigmoid(y)
'''


@pytest.fixture
def searchable_on_cpu(monkeypatch, cache_dir):
    """Lift the rule that only CUDA tasks are searched; close the pool and queue afterwards."""
    monkeypatch.setattr(Dispatcher, "_why_no_search", lambda self, device: None)
    queue = background.searches(on_stop=close_shared_environments)
    yield
    assert queue.wait(300), "a background search did not finish"
    close_shared_environments()


def _gate_task():
    (task,) = collect_tasks(Gate(), [torch.randn(64, 32), torch.randn(64, 32)], backward=False, min_ops=2)
    return task


def test_a_miss_is_left_to_inductor_at_once_and_searched_once_in_the_background(searchable_on_cpu):
    task = _gate_task()
    policy = ListPolicy([make_candidate("return torch.tanh(a * 0.5 + b) * torch.sigmoid(b)")])
    dispatcher = Dispatcher(resolve({"mode": "background"}), policy=policy)
    start = time.monotonic()
    first, second = dispatcher.decide(task), dispatcher.decide(task)  # a graph with two identical tasks
    assert time.monotonic() - start < 5, "the compile waited for the search"
    assert first.winner_key is None and first.reason.startswith("searching in the background")
    assert second.reason == first.reason
    assert background.searches().wait(300)
    assert policy.proposals == 1, "identical tasks are searched once"
    with KernelCache.open() as cache:
        ((_, entry),) = cache.items()
    assert entry.outcome == "inductor" and entry.timings["evaluated"] == 1, entry.reason  # a CPU never wins
    later = Dispatcher(resolve({"mode": "background"}), policy=policy).decide(task)
    assert later.reason == f"cached: {entry.reason}" and policy.proposals == 1, "the next compile picks it up"


def test_refresh_makes_compiled_models_pick_up_results_cached_since(searchable_on_cpu, monkeypatch):
    policy = ListPolicy([make_candidate("return torch.tanh(a * 0.5 + b) * torch.sigmoid(b)")])
    monkeypatch.setattr("agent_backend.policies.make_policy", lambda settings: policy)
    task = _gate_task()  # (traced first: tracing resets dynamo)
    x, y = torch.randn(64, 32), torch.randn(64, 32)
    torch._dynamo.reset()
    compiled = torch.compile(Gate(), backend="cuda_agent", options={"mode": "background"})
    seen = len(backend.reports)
    torch.testing.assert_close(compiled(x, y), Gate()(x, y))
    (decision,) = [d for r in backend.reports[seen:] for d in r.decisions]
    assert decision.reason.startswith("searching in the background"), decision.reason
    assert agent_backend.refresh(wait=True, timeout_s=300) == 0
    seen = len(backend.reports)
    compiled(x, y)
    (decision,) = [d for r in backend.reports[seen:] for d in r.decisions]
    assert decision.reason.startswith("cached: Inductor wins"), decision.reason
    # A winner cached meanwhile (by another process sharing the cache, say) runs only once the
    # compiled model is refreshed: until then the model runs the code it was compiled with.
    key = put_cached_entry(task, source=GATE_WINNER)
    runtime._registry.pop(key, None)
    compiled(x, y)
    assert runtime.registered(key) is None
    agent_backend.refresh()
    torch.testing.assert_close(compiled(x, y), Gate()(x, y))
    assert runtime.registered(key).calls == 1


class HeldPolicy(ListPolicy):
    """Proposes nothing, once released: the search stays pending until then."""

    def __init__(self):
        super().__init__([])
        self.release = threading.Event()

    def propose(self, task, feedback):
        self.release.wait(60)
        return super().propose(task, feedback)


def test_a_graph_compiled_with_searches_pending_is_keyed_under_a_token_no_one_computes_again(searchable_on_cpu):
    task = _gate_task()
    policy = HeldPolicy()
    settings = resolve({"mode": "background", "gate": False})
    dispatcher, other = Dispatcher(settings, policy=policy), Dispatcher(settings, policy=policy)
    graph_key = dispatcher.cache_identity()  # what Inductor's graph cache computes before our pass runs
    assert other.cache_identity() == graph_key
    try:
        dispatcher.decide(task)
        moved = dispatcher.cache.content_token()
        dispatcher.decide(task)
        assert dispatcher.cache.content_token() == moved, "the token moves once per graph"
        assert other.cache_identity() != graph_key, "the graph's key would be computed again"
        assert background.pending() == 1
    finally:
        policy.release.set()


# -- exit with a search running: a real process ---------------------------------------------------

EXIT_WITH_A_SEARCH_RUNNING = textwrap.dedent('''
    import json, os, sys, time
    import torch
    sys.path.insert(0, {tests!r})
    from agent_backend import background, dispatch
    from agent_backend.dispatch import Dispatcher
    from agent_backend.options import resolve
    from helpers import collect_tasks
    from test_env_cases import make_candidate
    from test_background import Gate, ListPolicy

    Dispatcher._why_no_search = lambda self, device: None
    marker = {marker!r}
    # A candidate that is still loading when the process exits.
    hangs = make_candidate("return a", init="open(%r, 'w').close()\\nimport time\\ntime.sleep(600)" % marker)
    (task,) = collect_tasks(Gate(), [torch.randn(64, 32), torch.randn(64, 32)], backward=False, min_ops=2)
    decision = Dispatcher(resolve({{"mode": "background", "gate": False}}), policy=ListPolicy([hangs])).decide(task)
    while not os.path.exists(marker):
        time.sleep(0.1)
    pids = [h.process.pid for env in dispatch._environments.values() for h in env._handles]
    print(json.dumps({{"reason": decision.reason, "workers": pids, "pending": background.pending()}}), flush=True)
''')


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as stat:  # a zombie is dead, only not yet reaped
        return stat.read().split()[2] != "Z"


def test_a_process_exits_at_once_with_a_search_running_and_caches_nothing(cache_dir, tmp_path):
    marker = tmp_path / "candidate-loading"
    script = EXIT_WITH_A_SEARCH_RUNNING.format(tests=os.path.dirname(__file__), marker=str(marker))
    env = {**os.environ, "CUDA_AGENT_CACHE_DIR": str(cache_dir)}
    process = subprocess.Popen([sys.executable, "-c", script], env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True,
                               cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    try:
        line = process.stdout.readline()  # printed just before the script ends
        exit_began = time.monotonic()
        _, stderr = process.communicate(timeout=300)
    finally:
        process.kill()
    assert process.returncode == 0, stderr[-3000:]
    assert time.monotonic() - exit_began < 20, "the exit waited for the search"
    report = json.loads(line)
    assert report["reason"].startswith("searching in the background") and report["pending"] == 1
    deadline = time.monotonic() + 15
    while any(_alive(pid) for pid in report["workers"]) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(_alive(pid) for pid in report["workers"]), "a worker outlived its process"
    assert "Traceback" not in stderr, stderr[-3000:]
    with KernelCache.open(cache_dir) as cache:
        assert list(cache.items()) == [], "a search cut short by the exit was cached"


# -- Inductor's graph cache: a graph compiled with a search pending is compiled again -------------

COMPILE_WITH_A_SEARCH_PENDING = textwrap.dedent('''
    import json, sys, time
    import torch
    from torch._dynamo.utils import counters
    from agent_backend import backend, policies
    from agent_backend.dispatch import Dispatcher

    class Never:
        """A policy still thinking when the process exits."""
        name, revision = "test-never", "1"
        def why_not(self, task):
            return None
        def propose(self, task, feedback):
            time.sleep(600)

    Dispatcher._why_no_search = lambda self, device: None
    policies.make_policy = lambda settings: Never()

    class Gate(torch.nn.Module):
        def forward(self, x, y):
            return torch.tanh(x * 0.5 + y) * torch.sigmoid(y)

    x, y = torch.randn(64, 32), torch.randn(64, 32)
    with torch.no_grad():
        torch.compile(Gate(), backend="cuda_agent", options={"mode": "background", "gate": False})(x, y)
    print(json.dumps({"hits": counters["inductor"]["fxgraph_cache_hit"],
                      "decisions": [d.reason for r in backend.reports for d in r.decisions]}))
''')


def test_a_graph_compiled_with_a_search_pending_is_not_replayed_by_the_next_process(cache_dir, tmp_path):
    env = {**os.environ, "CUDA_AGENT_CACHE_DIR": str(cache_dir), "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor"),
           "TORCHINDUCTOR_FX_GRAPH_CACHE": "1", "TORCHINDUCTOR_AUTOGRAD_CACHE": "1"}
    for process in range(2):
        done = subprocess.run([sys.executable, "-c", COMPILE_WITH_A_SEARCH_PENDING], env=env, capture_output=True,
                              text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
        report = json.loads(done.stdout.strip().splitlines()[-1])
        assert report["hits"] == 0, f"process {process} replayed a graph compiled while its search was pending"
        assert [r[:27] for r in report["decisions"]] == ["searching in the background"]
