"""A winner supplied through the cache (a hand-written candidate) replaces its subgraph with one
call of our custom op; Inductor compiles the rest; results match eager, forward and backward."""
import logging

import pytest
import torch
import torch.nn as nn
from torch._inductor.utils import run_and_get_code

from agent_backend import backend, runtime
from agent_backend.dispatch import close_shared_environments
from agent_backend.env import launch_op
from agent_backend.options import resolve
from helpers import TIMED_BOTH_WAYS, assert_close_lists, collect_tasks, put_cached_entry, run_fwd_bwd

# Hand-written candidate for x * sigmoid(x) + bias, in the KernelBench answer format.
SWISH_BIAS = '''
import pytest
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x, bias):
        return x / (1.0 + torch.exp(-x)) + bias
'''
# Right only where |x| < 10, the range an older verifier drew from: these rules' wide input set refuses it.
SWISH_BIAS_NARROW = SWISH_BIAS.replace("return x / (1.0 + torch.exp(-x)) + bias",
                                       "return torch.where(x.abs() < 10, x / (1.0 + torch.exp(-x)), 0.0) + bias")
# Fails in a way that may not recur (a runtime error, as a lack of memory is): never recorded as refused.
SWISH_BIAS_RAISING = SWISH_BIAS.replace("return x / (1.0 + torch.exp(-x)) + bias",
                                        "raise RuntimeError('out of memory, say')")


@pytest.fixture(scope="module", autouse=True)
def _close_workers():
    """Cached kernels verified here again run in the shared pool's CPU workers."""
    yield
    close_shared_environments()


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(16, 16)
        self.bias = nn.Parameter(torch.randn(16))

    def forward(self, x):
        y = x * torch.sigmoid(x) + self.bias  # used twice, so it stays a chain of its own
        return self.lin(y), y


def _swish_task(model, x):
    tasks = collect_tasks(model, [x.clone().requires_grad_()], backward=True, min_ops=1)
    matches = [t for t in tasks if t.ops == ("aten.sigmoid.default", "aten.mul.Tensor", "aten.add.Tensor")]
    assert matches, [t.ops for t in tasks]
    return matches[0]


def test_supplied_winner_is_dispatched(cache_dir):
    torch.manual_seed(0)
    model, x = Net(), torch.randn(4, 16)
    key = put_cached_entry(_swish_task(model, x), source=SWISH_BIAS)
    eager_out, eager_grads = run_fwd_bwd(model, [x])
    ours_out, ours_grads = run_fwd_bwd(model, [x], "cuda_agent", options={"mode": "cached"})
    assert_close_lists(ours_out, eager_out, 1e-5, 1e-5, "output")
    assert_close_lists(ours_grads, eager_grads, 1e-5, 1e-5, "grad")
    winner = runtime.registered(key)
    assert winner is not None and winner.calls >= 1, "the supplied winner never ran"
    decisions = [d for r in backend.reports for d in r.decisions]
    assert any(d.winner_key == key for d in decisions)
    assert any(d.winner_key is None for d in decisions), "everything else should stay with Inductor"


def test_the_winner_that_runs_is_the_one_in_the_cache_now(cache_dir, tmp_path, monkeypatch):
    """One process, two caches holding different winners for the same key (or a winner replaced):
    the compile runs the source of the cache it reads, not the one loaded for the key before."""
    torch.manual_seed(0)
    model, x = Net(), torch.randn(4, 16)
    task = _swish_task(model, x)
    key = put_cached_entry(task, source=SWISH_BIAS)
    run_fwd_bwd(model, [x], "cuda_agent", options={"mode": "cached"})
    assert runtime.registered(key).source == SWISH_BIAS
    doubled = SWISH_BIAS.replace("+ bias", "+ 2 * bias")
    monkeypatch.setenv("CUDA_AGENT_CACHE_DIR", str(tmp_path / "other_cache"))
    assert put_cached_entry(task, source=doubled) == key
    torch._dynamo.reset()
    run_fwd_bwd(model, [x], "cuda_agent", options={"mode": "cached"})
    assert runtime.registered(key).source == doubled and runtime.registered(key).calls >= 1


def test_generated_code_calls_our_op_and_inductor_kernels(cache_dir):
    torch.manual_seed(0)
    model, x = Net(), torch.randn(4, 16)
    put_cached_entry(_swish_task(model, x), source=SWISH_BIAS)
    torch._dynamo.reset()
    with torch.no_grad():
        out, code = run_and_get_code(torch.compile(model, backend="cuda_agent", options={"mode": "cached"}), x)
    text = "\n".join(code)
    assert "cuda_agent.run_winner" in text
    # Inductor copies an op's arguments into comments of its code: the program must not break out of them.
    assert not any(line.lstrip("# ").startswith("class Model(") for line in text.splitlines())
    program = _swish_task(model, x).program
    assert "\n" in program and "\n" not in runtime.program_arg(program) and repr(runtime.program_arg(program)) in text
    assert "extern_kernels.addmm" in text, "Inductor should still compile the rest"
    torch.testing.assert_close(out, model(x), atol=1e-5, rtol=1e-5)


def test_a_graph_inductor_cannot_compile_with_our_kernels_is_compiled_without_them(cache_dir, caplog, monkeypatch):
    """Our rewrite once gave Inductor code it could not import (a GPU-only codegen path, not
    reproducible on a CPU): the fault is injected here as an op argument of the wrong type, and
    the user's compile must still succeed, as Inductor alone."""
    torch.manual_seed(0)
    model, x = Net(), torch.randn(4, 16)
    key = put_cached_entry(_swish_task(model, x), source=SWISH_BIAS)
    monkeypatch.setattr(runtime, "program_arg", lambda program: 7)  # the op's schema wants a str
    torch._dynamo.reset()
    seen = len(backend.reports)
    calls_before = runtime.registered(key).calls if runtime.registered(key) else 0
    with torch.no_grad(), caplog.at_level(logging.WARNING, logger="cuda_agent"):
        out = torch.compile(model, backend="cuda_agent", options={"mode": "cached"})(x)
    torch.testing.assert_close(out, model(x), atol=1e-5, rtol=1e-5)
    assert any("Inductor failed on a graph holding 1 kernel(s) of ours" in r.message for r in caplog.records)
    (decision,) = [d for r in backend.reports[seen:] for d in r.decisions if d.task and "not used" in d.reason]
    assert decision.winner_key is None and decision.reason.startswith("Inductor failed with our kernels")
    assert runtime.registered(key).calls == calls_before, "a winner left out of the graph ran"


def test_no_winner_means_inductor_with_reason(cache_dir, caplog):
    torch.manual_seed(0)
    model, x = Net(), torch.randn(4, 16)
    torch._dynamo.reset()
    with caplog.at_level("INFO", logger="cuda_agent"):
        torch.compile(model, backend="cuda_agent")(x)
    assert any("left to Inductor" in r.message and "cpu tensors" in r.message for r in caplog.records)


def test_broken_cached_winner_falls_back(cache_dir):
    torch.manual_seed(0)
    model, x = Net(), torch.randn(4, 16)
    key = put_cached_entry(_swish_task(model, x), source="raise ImportError('gone')\n")
    runtime._registry.pop(key, None)
    out, _ = run_fwd_bwd(model, [x], "cuda_agent", options={"mode": "cached"})
    eager, _ = run_fwd_bwd(model, [x])
    assert_close_lists(out, eager, 1e-5, 1e-5, "output")
    assert runtime.registered(key) is None


def test_team_entry_runs_only_when_signed_with_a_trusted_key(cache_dir, tmp_path):
    """A team cache is code written elsewhere: unsigned, it runs here only once verified and
    faster here (CPU times are never a basis for a win); signed with the user's key, it is
    trusted and dispatched."""
    torch.manual_seed(0)
    model, x = Net(), torch.randn(4, 16)
    team = tmp_path / "team"
    key = put_cached_entry(_swish_task(model, x), source=SWISH_BIAS, cache_dir=team, trust_key="team-secret")
    runtime._registry.pop(key, None)
    seen = len(backend.reports)
    run_fwd_bwd(model, [x], "cuda_agent", options={"mode": "cached", "team_cache": [str(team)]})
    assert runtime.registered(key) is None, "an untrusted team entry ran without verification"
    reasons = [d.reason for r in backend.reports[seen:] for d in r.decisions]
    assert any("failed verification here" in r for r in reasons), reasons
    out, _ = run_fwd_bwd(model, [x], "cuda_agent",
                         options={"mode": "cached", "team_cache": [str(team)], "trust_key": "team-secret"})
    assert runtime.registered(key) is not None and runtime.registered(key).calls >= 1
    eager, _ = run_fwd_bwd(model, [x])
    assert_close_lists(out, eager, 1e-5, 1e-5, "output")


def test_a_local_entry_verified_under_other_rules_runs_only_once_verified_again(cache_dir, monkeypatch):
    """A winner an older version's verifier passed (its rules let more through: no wide input set)
    is verified again before it runs, as an untrusted team entry is, though not timed again; its
    entry then records these rules, and the next compile runs it without verifying it."""
    from agent_backend.env.verify import RULES
    from kernel_cache import KernelCache
    torch.manual_seed(0)
    model, x = Net(), torch.randn(4, 16)
    key = put_cached_entry(_swish_task(model, x), source=SWISH_BIAS, rules="0-older")
    runtime._registry.pop(key, None)
    calls = _counting_verifications(monkeypatch)
    out, _ = run_fwd_bwd(model, [x], "cuda_agent", options={"mode": "cached"})
    assert calls == [key] and runtime.registered(key).calls >= 1
    assert_close_lists(out, run_fwd_bwd(model, [x])[0], 1e-5, 1e-5, "output")
    with KernelCache.open() as cache:
        entry = cache.local.read(key)
    assert entry.verification["passed"] and entry.verification["rules"] == RULES and entry.timings == TIMED_BOTH_WAYS
    torch._dynamo.reset()
    run_fwd_bwd(model, [x], "cuda_agent", options={"mode": "cached"})
    assert calls == [key]


def test_cache_verify_records_these_rules_and_the_compile_then_trusts_the_entry(cache_dir, capsys):
    """`cuda-agent cache verify` verifies a winner recorded under other rules (on the CPU here,
    where its task is) and keeps the verification it ran: the next compile runs the winner
    without verifying it again."""
    import json

    from agent_backend.cli import main
    from agent_backend.env.verify import RULES
    from kernel_cache import KernelCache
    torch.manual_seed(0)
    model, x = Net(), torch.randn(4, 16)
    key = put_cached_entry(_swish_task(model, x), source=SWISH_BIAS, rules="0-older")
    runtime._registry.pop(key, None)
    try:
        assert main(["cache", "verify", "--json"]) == 0
    finally:
        close_shared_environments()
    (result,) = json.loads(capsys.readouterr().out)["results"]
    assert result["passed"] and result["recorded"], result
    with KernelCache.open() as cache:
        assert cache.local.read(key).verification["rules"] == RULES
    torch._dynamo.reset()
    run_fwd_bwd(model, [x], "cuda_agent", options={"mode": "cached"})
    assert runtime.registered(key) is not None and runtime.registered(key).calls >= 1


def _entry(outcome, provenance, timings=None):
    from kernel_cache import Entry
    return Entry(outcome=outcome, reason="test", source="class ModelNew: pass" if outcome == "kernel" else None,
                 provenance=provenance, timings=timings or {})


def test_only_losers_from_another_policy_or_revision_are_stale():
    from agent_backend.dispatch import Dispatcher
    dispatcher = Dispatcher(resolve({}))
    ours = {"policy": "builtin", "policy_revision": dispatcher.policy.revision}
    older = {"policy": "builtin", "policy_revision": "an older one"}
    assert not dispatcher.is_stale_loser(_entry("inductor", ours))
    assert not dispatcher.is_stale_loser(_entry("kernel", older)), "a verified winner stays"
    for outcome in ("inductor", "failed"):
        assert dispatcher.is_stale_loser(_entry(outcome, older))
        assert dispatcher.is_stale_loser(_entry(outcome, {"policy": "llm", "policy_revision": ours["policy_revision"]}))
        assert dispatcher.is_stale_loser(_entry(outcome, {}))


def test_a_rewrite_winner_our_rules_no_longer_write_is_searched_again():
    """A rewrite winner cached under an older revision whose source the rules no longer write (a
    bf16 gemm_reduce written as an fp32 copy and a GEMV, before the fused form) could only run
    op by op, not inlined: searched again. One the rules still write, or this revision wrote, stays."""
    from agent_backend.dispatch import Dispatcher
    from kernel_cache import Entry
    from skills import rewrites
    from test_rewrites import only_task
    dispatcher = Dispatcher(resolve({}))
    task = only_task(lambda x, w: (x @ w).sum(-1), torch.randn(16, 32, dtype=torch.bfloat16),
                     torch.randn(32, 48, dtype=torch.bfloat16))
    (candidate,) = rewrites.propose(task)
    older = {"policy": "builtin", "policy_revision": "an older one"}
    ours = {"policy": "builtin", "policy_revision": dispatcher.policy.revision}
    no_longer_written = candidate.source.replace("aten.mul.Tensor", "aten.mm.default")

    def winner(source, provenance):
        return Entry(outcome="kernel", reason="test", source=source, origin=candidate.origin, provenance=provenance,
                     timings=TIMED_BOTH_WAYS)

    assert no_longer_written != candidate.source
    assert dispatcher.is_stale_rewrite(winner(no_longer_written, older), task)
    assert dispatcher.search_again(winner(no_longer_written, older), task)
    assert not dispatcher.is_stale_rewrite(winner(candidate.source, older), task), "the rules still write it"
    assert not dispatcher.is_stale_rewrite(winner(no_longer_written, ours), task), "this revision's rules wrote it"
    assert not dispatcher.search_again(_entry("kernel", older, TIMED_BOTH_WAYS), task), \
        "a winner of another origin stays"


def test_a_winner_timed_after_one_kind_of_l2_flush_only_is_searched_again():
    """Winners cached before the worker's timer alternated a write and a read flush were judged
    after the write alone: where a search can run, they are judged again (in mode=cached they run)."""
    from agent_backend.dispatch import Dispatcher, timed_one_way
    dispatcher = Dispatcher(resolve({}))
    ours = {"policy": "builtin", "policy_revision": dispatcher.policy.revision}
    task = _swish_task(Net(), torch.randn(4, 16))
    one_way = _entry("kernel", ours, {"counted_speedup": 1.3, "ours_ms": {"median": 0.01, "host_median": 0.005}})
    assert timed_one_way(one_way) and dispatcher.search_again(one_way, task)
    both = _entry("kernel", ours, TIMED_BOTH_WAYS)
    assert not timed_one_way(both) and not dispatcher.search_again(both, task)
    assert not timed_one_way(_entry("inductor", ours)), "a loser's timings say nothing of a win"


def test_policy_revision_follows_the_template_sources(tmp_path):
    from agent_backend.policies import source_revision
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "a.py").write_text("A = 1\n")
    (tmp_path / "b.py").write_text("B = 1\n")
    first = source_revision(tmp_path)
    (tmp_path / "notes.md").write_text("not code")
    assert source_revision(tmp_path) == first
    (tmp_path / "pkg" / "a.py").write_text("A = 2\n")
    assert source_revision(tmp_path) != first
    (tmp_path / "pkg" / "a.py").write_text("A = 1\n")
    assert source_revision(tmp_path) == first
    (tmp_path / "pkg" / "a.py").rename(tmp_path / "pkg" / "c.py")
    assert source_revision(tmp_path) != first, "a renamed file is another source"


def test_user_precision_reads_cublas_and_cudnn_tf32_separately():
    from agent_backend.dispatch import user_precision
    before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    try:
        for cublas, cudnn in ((False, True), (True, False)):
            torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = cublas, cudnn
            precision = user_precision(resolve({}))
            assert (precision["allow_tf32"], precision["allow_cudnn_tf32"]) == (cublas, cudnn)
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


def test_a_policy_that_cannot_propose_now_caches_nothing(cache_dir, monkeypatch):
    """A model server that is down is no result: the task stays with Inductor, and the next
    compile asks again."""
    from agent_backend.dispatch import Dispatcher
    import kernel_cache
    from agent_backend.policies import PolicyError
    from kernel_cache import KernelCache

    def unavailable(self, task, key):
        raise PolicyError("cuda_agent: no answer from the model server at http://127.0.0.1:9/v1")
    task = _swish_task(Net(), torch.randn(4, 16)).on_device("cuda")
    monkeypatch.setattr(Dispatcher, "_search", unavailable)
    # As on a GPU machine, where a search is due (keyed as on this one, which has no GPU to name).
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    real_make_key = kernel_cache.make_key
    monkeypatch.setattr(kernel_cache, "make_key", lambda h, inputs, device, precision: real_make_key(
        h, inputs, "cpu", precision))
    decision = Dispatcher(resolve({"mode": "search"})).decide(task)
    assert decision.winner_key is None and "no answer from the model server" in decision.reason
    with KernelCache.open() as cache:
        assert list(cache.items()) == []


class CountingPolicy:
    """A policy with no template for the task (so no gate and no worker): counts its searches,
    or raises `error` as a model server that is down would."""

    name, revision = "test-counting", "1"

    def __init__(self, error: Exception | None = None):
        self.error, self.proposals = error, 0

    def why_not(self, task):
        return "no template here"

    def propose(self, task, feedback):
        self.proposals += 1
        if self.error:
            raise self.error
        return []


@pytest.fixture
def searchable_on_cpu(monkeypatch):
    """Searches are for CUDA tasks; these tests search CPU tasks, whose search needs no GPU."""
    from agent_backend.dispatch import Dispatcher
    monkeypatch.setattr(Dispatcher, "_why_no_search", lambda self, device: None)


def test_identical_tasks_of_one_compile_are_searched_once_when_the_cache_cannot_keep_results(tmp_path,
                                                                                             searchable_on_cpu):
    from agent_backend.dispatch import Dispatcher
    not_a_directory = tmp_path / "a-file"
    not_a_directory.write_text("")
    settings = resolve({"mode": "search", "cache_dir": str(not_a_directory / "cache")})
    task, policy = _swish_task(Net(), torch.randn(4, 16)), CountingPolicy()
    dispatcher = Dispatcher(settings, policy=policy)
    layers = [dispatcher.decide(task) for _ in range(12)]  # a transformer's identical layers
    assert policy.proposals == 1
    assert {d.reason for d in layers} == {"no template here"}


def test_a_policy_that_cannot_be_asked_is_asked_once_per_compile(cache_dir, searchable_on_cpu):
    from agent_backend.dispatch import Dispatcher
    from agent_backend.policies import PolicyError
    task = _swish_task(Net(), torch.randn(4, 16))
    policy = CountingPolicy(PolicyError("cuda_agent: no answer from the model server"))
    dispatcher = Dispatcher(resolve({"mode": "search"}), policy=policy)
    assert [dispatcher.decide(task).reason for _ in range(3)] == ["cuda_agent: no answer from the model server"] * 3
    assert policy.proposals == 1
    Dispatcher(resolve({"mode": "search"}), policy=policy).decide(task)
    assert policy.proposals == 2, "the next compile asks again"


def _counting_verifications(monkeypatch) -> list:
    """Each verification of a cached kernel here (Dispatcher._reverify, still run, on the CPU)."""
    from agent_backend.dispatch import Dispatcher
    calls, verify = [], Dispatcher._reverify

    def counted(self, task, key, *args, **kwargs):
        calls.append(key.digest)
        return verify(self, task, key, *args, **kwargs)
    monkeypatch.setattr(Dispatcher, "_reverify", counted)
    return calls


def test_a_cached_kernel_refused_here_is_verified_once_and_refused_from_then_on(cache_dir, monkeypatch, request,
                                                                               capsys):
    """A transformer's identical layers under one cached kernel that these rules find wrong:
    verified for the first, refused for all; the refusal is cached (`cache ls` lists it as
    refused), so the next compile in mode "cached" does not verify it again, nor replays it from
    a graph cache, and one in mode "search" searches its task anew."""
    import json

    from agent_backend.cli import main
    from agent_backend.dispatch import Dispatcher
    from agent_backend.env.verify import RULES
    from kernel_cache import KernelCache
    task = _swish_task(Net(), torch.randn(4, 16))
    key = put_cached_entry(task, source=SWISH_BIAS_NARROW, rules="0-older")
    calls = _counting_verifications(monkeypatch)
    dispatcher = Dispatcher(resolve({"mode": "cached"}))
    (reason,) = {dispatcher.decide(task).reason for _ in range(12)}
    assert calls == [key]
    assert reason.startswith("cached kernel failed verification here: local entry: incorrect: "), reason
    with KernelCache.open() as cache:
        entry = cache.local.read(key)
    assert (entry.outcome, entry.source) == ("kernel", SWISH_BIAS_NARROW)
    assert not entry.verified and entry.verification["rules"] == RULES
    capsys.readouterr()
    assert main(["cache", "ls", "--json"]) == 0
    (listed,) = json.loads(capsys.readouterr().out)
    assert listed["outcome"] == "refused" and reason.endswith(listed["reason"]), listed
    later = Dispatcher(resolve({"mode": "cached"}))
    assert later.decide(task).reason == reason and later.cached_winner(key) is None and calls == [key]
    request.getfixturevalue("searchable_on_cpu")
    policy = CountingPolicy()
    assert Dispatcher(resolve({"mode": "search"}), policy=policy).decide(task).reason == "no template here"
    assert calls == [key] and policy.proposals == 1


def test_a_cached_kernel_refused_here_is_searched_anew_where_searching(cache_dir, searchable_on_cpu, monkeypatch):
    """In search mode a cached kernel that fails verification here is searched again, once for
    identical tasks, and the search's result replaces it in the cache."""
    from agent_backend.dispatch import Dispatcher
    from kernel_cache import KernelCache
    task, policy = _swish_task(Net(), torch.randn(4, 16)), CountingPolicy()
    key = put_cached_entry(task, source=SWISH_BIAS_NARROW, rules="0-older")
    calls = _counting_verifications(monkeypatch)
    dispatcher = Dispatcher(resolve({"mode": "search"}), policy=policy)
    reasons = [dispatcher.decide(task).reason for _ in range(3)]
    assert reasons == ["no template here"] + ["cached: no template here"] * 2
    assert calls == [key] and policy.proposals == 1
    with KernelCache.open() as cache:
        entry = cache.local.read(key)
    assert (entry.outcome, entry.source, entry.reason) == ("failed", None, "no template here")


def test_a_cached_kernel_that_failed_in_a_way_that_may_not_recur_is_verified_again_by_the_next_compile(
        cache_dir, monkeypatch):
    from agent_backend.dispatch import Dispatcher
    from kernel_cache import KernelCache
    task = _swish_task(Net(), torch.randn(4, 16))
    key = put_cached_entry(task, source=SWISH_BIAS_RAISING, rules="0-older")
    calls = _counting_verifications(monkeypatch)
    for _ in range(2):
        assert Dispatcher(resolve({"mode": "cached"})).decide(task).reason == "local entry failed verification here"
    assert calls == [key, key]
    with KernelCache.open() as cache:
        assert cache.local.read(key).verification["rules"] == "0-older"


def test_a_team_entry_refused_here_gives_way_to_the_teams_next_source(cache_dir, tmp_path, monkeypatch):
    """An unsigned team entry these rules find wrong is refused once; the refusal, cached locally
    in front of the team's layer, holds while the team's entry is the same source. Once the team
    holds another (a fixed kernel, signed by the team's warm job), that one runs."""
    from agent_backend.dispatch import Dispatcher
    from kernel_cache import KernelCache
    task = _swish_task(Net(), torch.randn(4, 16))
    team = tmp_path / "team"
    key = put_cached_entry(task, source=SWISH_BIAS_NARROW, cache_dir=team)
    options = resolve({"mode": "cached", "team_cache": [str(team)], "trust_key": "team-secret"})
    calls = _counting_verifications(monkeypatch)
    for _ in range(2):  # two compiles
        decision = Dispatcher(options).decide(task)
        assert decision.winner_key is None and f"verification here: team:{team}" in decision.reason, decision.reason
    assert calls == [key]
    put_cached_entry(task, source=SWISH_BIAS, cache_dir=team, trust_key="team-secret")
    assert Dispatcher(options).decide(task).winner_key == key and calls == [key]
    with KernelCache.open() as cache:
        assert cache.local.read(key).source == SWISH_BIAS


def test_a_task_the_gate_skipped_is_searched_again_once_the_gate_or_its_bar_would_not_skip_it(cache_dir,
                                                                                              searchable_on_cpu):
    from agent_backend import gate
    from agent_backend.dispatch import Dispatcher
    task, policy = _swish_task(Net(), torch.randn(4, 16)), CountingPolicy()
    verdict = gate.judge(0.0510, gate.Floor(0.048, 0.0, 0.004), min_speedup=1.05, slack=0.03)
    provenance = {"policy": policy.name, "policy_revision": policy.revision}

    def cache_the_gates_verdict():
        put_cached_entry(task, outcome="inductor", reason=verdict.reason(), timings={"gate": verdict.to_json()},
                         provenance=provenance)

    cache_the_gates_verdict()
    decision = Dispatcher(resolve({"mode": "search"}), policy=policy).decide(task)
    assert decision.reason.startswith("cached: Inductor at floor: Inductor 0.0510 ms, floor 0.0480 ms (memory)")
    assert decision.gate == verdict.to_json() and policy.proposals == 0
    for options in ({"gate": False}, {"min_speedup": 1.0}, {"gate_slack": 0.0}):
        cache_the_gates_verdict()
        Dispatcher(resolve({"mode": "search", **options}), policy=policy).decide(task)
    assert policy.proposals == 3


def _launch_spec(task):
    from agent_backend.env.launch_spec import Arg, KernelLaunch, LaunchSpec
    args = (*map(Arg.input, range(len(task.inputs))), Arg.output(0))
    return LaunchSpec(task.inputs, task.outputs, (KernelLaunch(b"\x7fELF swish", "sm_90", "swish", 8, 128, args),))


def test_a_launch_spec_winner_is_called_through_the_launch_op():
    spec = _launch_spec(_swish_task(Net(), torch.randn(4, 16)))
    runtime.register(runtime.Winner("spec winner", "", spec.outputs, "test", spec=spec))
    runtime.register(runtime.Winner("python winner", SWISH_BIAS, spec.outputs, "test"))
    x, b = torch.randn(4, 16), torch.randn(16)
    assert runtime.call_for("spec winner", "p", [x, b]) == (torch.ops.cuda_agent.launch.in2, ("spec winner", "p", x, b))
    assert runtime.call_for("python winner", "p", [x, b]) == (torch.ops.cuda_agent.run_winner.default,
                                                              ("python winner", "p", [x, b]))
    assert runtime.call_for("nothing registered", "p", [x])[0] is torch.ops.cuda_agent.run_winner.default


def test_a_replayed_graph_gets_the_launch_spec_from_the_cache_entry(cache_dir, caplog):
    """No candidate code runs for a launch spec read back from the local cache; a damaged one
    leaves the winner to its source."""
    from agent_backend.dispatch import Dispatcher
    from agent_backend.options import resolve
    from kernel_cache import CacheKey, KernelCache
    task = _swish_task(Net(), torch.randn(4, 16))
    spec = _launch_spec(task)
    key = put_cached_entry(task, source="raise ImportError('not run')\n", launch_spec=spec)
    winner = Dispatcher(resolve({})).cached_winner(key)
    assert winner.spec == spec and winner.outputs == task.outputs
    with KernelCache.open() as cache:
        entry = cache.local.read(key)
        entry.launch["spec"]["kernels"][0].pop("grid")
        cache.put(CacheKey.from_json(entry.key), entry)
    with caplog.at_level("WARNING", logger="cuda_agent"):
        assert Dispatcher(resolve({})).cached_winner(key).spec is None
    assert any("launch spec of cached kernel" in r.message for r in caplog.records)


def test_inductor_compiles_a_graph_around_the_launch_op(cache_dir):
    """On the CPU the op's Meta kernel gives Inductor the outputs, and the compiled graph calls
    the op's C++ kernel (launch_lowering: directly, past torch.ops), which refuses CPU tensors:
    proof that the call reached it, with the graph's tensors. The op's node carries its inputs'
    layouts, which Inductor holds an op inserted by a pass to only from there."""
    torch.manual_seed(0)
    model, x = Net(), torch.randn(4, 16)
    task = _swish_task(model, x)
    key = put_cached_entry(task, source="raise ImportError('not run')\n", launch_spec=_launch_spec(task))
    runtime._registry.pop(key, None)  # the other tests' winner for this task
    torch._dynamo.reset()
    seen = len(backend.reports)
    traced = []  # the launch op's nodes after our pass (a post pass runs after it)
    record = lambda graph: traced.extend(n for n in graph.nodes if n.target in launch_op.overloads())  # noqa: E731
    try:
        with torch.no_grad(), torch._inductor.config.patch(post_grad_custom_post_pass=record), \
                pytest.raises(ValueError, match=r"input 0: this kernel is specialised to CUDA tensors .* got cpu"):
            torch.compile(model, backend="cuda_agent", options={"mode": "cached"})(x)
        assert any(d.winner_key == key for r in backend.reports[seen:] for d in r.decisions)
        (node,) = traced
        args, kwargs = node.meta["eager_input_vals"]
        assert args[:2] == node.args[:2] and kwargs == {}
        assert [(tuple(a.shape), a.stride()) for a in args[2:]] == [(tuple(t.shape), t.stride) for t in task.inputs]
        assert runtime.registered(key).spec is not None
    finally:
        runtime._registry.pop(key, None)  # a CPU winner that cannot run must not stay for the next tests


def test_run_winner_never_returns_an_input_even_where_the_subgraphs_program_would():
    """A winner missing from every cache runs its subgraph's program; where that returns a view
    of an input, the op still returns a new tensor (a compiled graph takes its outputs as new)."""
    program = ("import torch\nimport torch.nn as nn\n\n\nclass Model(nn.Module):\n"
               "    def forward(self, in0):\n        return torch.ops.aten.view.default(in0, [2, 4])\n\n\n"
               "def get_init_inputs():\n    return []\n")
    x = torch.randn(8)
    (out,) = torch.ops.cuda_agent.run_winner.default("no such winner", runtime.program_arg(program), [x])
    assert torch.equal(out, x.view(2, 4)) and out.untyped_storage().data_ptr() != x.untyped_storage().data_ptr()


def test_our_ops_demand_the_exact_strides_they_were_verified_on():
    """Inductor may otherwise lay an input out anew (torch's default constraint for custom ops
    has changed between releases): a winner is verified on the graph's layout only."""
    exact = getattr(torch.Tag, "needs_exact_strides", None)
    launch_ops = [getattr(torch.ops.cuda_agent.launch, name) for name in torch.ops.cuda_agent.launch.overloads()]
    assert len(launch_ops) == 9
    for op in (*launch_ops, torch.ops.cuda_agent.run_winner.default):
        assert exact in op.tags, (op, op.tags)


@pytest.mark.parametrize("fn, kinds", [
    (lambda x: x.sum(-1), ["reduction"]),
    (lambda x: x.amax(-1, keepdim=True), ["reduction"]),
    (lambda x: torch.relu(x), []),
    (lambda x: x @ x[0], ["reduction"]),  # a matrix times a 1-d vector: mv, decomposed to a sum
    (lambda x: x @ x[0].unsqueeze(-1), ["matmul"]),  # a matrix times a column
    (lambda x: x[:1] @ x.t(), ["matmul"]),  # a one-row matrix times a matrix
], ids=["sum", "amax", "relu", "matrix_vector", "matrix_column", "row_matrix"])
def test_a_reduction_or_gemv_alone_is_searched_a_pointwise_op_alone_is_not(fn, kinds):
    """min_ops (2) spares single pointwise ops, which Inductor writes as well as anyone; a single
    reduction is searched, since Inductor's can be far from the floor over long rows, and a
    single matrix-vector product (cuBLAS's GEMV can be too)."""
    class One(nn.Module):
        def forward(self, x):
            return fn(x)

    tasks = collect_tasks(One(), [torch.randn(4, 512)], backward=False, min_ops=resolve({}).min_ops)
    assert [t.kind for t in tasks] == kinds


@pytest.mark.parametrize("columns, dtype, kinds", [(1, torch.float32, ["matmul"]), (8, torch.float32, ["matmul"]),
                                                   (9, torch.float32, []), (2, torch.bfloat16, ["matmul"]),
                                                   (3, torch.bfloat16, [])])
def test_a_product_alone_is_searched_where_it_is_a_matrix_times_a_few_columns(columns, dtype, kinds):
    """KernelBench's matrix-vector problem, torch.matmul(A, B) of a one-column B, is a single mm;
    so is one of a few columns, as many as the rows template takes (gemv.most_vectors)."""
    class Product(nn.Module):
        def forward(self, a, b):
            return torch.matmul(a, b)

    tasks = collect_tasks(Product(), [torch.randn(64, 512, dtype=dtype), torch.randn(512, columns, dtype=dtype)],
                          backward=False, min_ops=resolve({}).min_ops)
    assert [t.kind for t in tasks] == kinds
