"""On a CUDA GPU: the model set matches eager, a supplied winner is dispatched while Inductor
compiles the rest, and the search runs end to end for pointwise chains."""
import time

import pytest
import torch
import torch.nn as nn
from torch._inductor.utils import run_and_get_code

from agent_backend import backend, runtime
from helpers import assert_close_lists, collect_tasks, put_cached_entry, run_fwd_bwd
from models import model_set

pytestmark = pytest.mark.gpu

# A CUDA winner through the fast path, counting its own launches.
SWISH_BIAS_CUDA = r'''
import torch
import torch.nn as nn
from agent_backend.env.fast_kernel import load_kernel

SRC = """
extern "C" __global__ void swish_bias(const float* x, const float* b, float* out, long long n, int cols) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) { float v = x[i]; out[i] = v / (1.0f + expf(-v)) + b[i % cols]; }
}
"""
_kernel = load_kernel(SRC, "swish_bias", ["ptr", "ptr", "ptr", "i64", "i32"])
LAUNCHES = [0]


class ModelNew(nn.Module):
    def forward(self, x, bias):
        out = torch.empty_like(x)
        n = x.numel()
        _kernel.launch(((n + 255) // 256,), (256,), [x, bias, out, n, x.shape[-1]])
        LAUNCHES[0] += 1
        return out
'''


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(64, 64)
        self.bias = nn.Parameter(torch.randn(64))

    def forward(self, x):
        y = x * torch.sigmoid(x) + self.bias
        return self.lin(y), y


@pytest.mark.parametrize("name", sorted(model_set("cuda")))
def test_model_set_matches_eager_on_cuda(name, cache_dir):
    model, inputs = model_set("cuda")[name]()
    eager_out, eager_grads = run_fwd_bwd(model, inputs)
    ours_out, ours_grads = run_fwd_bwd(model, inputs, "cuda_agent", options={"mode": "cached"})
    assert_close_lists(ours_out, eager_out, 1e-4, 1e-4, f"{name} output")
    assert_close_lists(ours_grads, eager_grads, 1e-4, 1e-4, f"{name} grad")


def test_supplied_cuda_winner_is_dispatched(cache_dir):
    torch.manual_seed(0)
    model, x = Net().cuda(), torch.randn(32, 64, device="cuda")
    tasks = collect_tasks(model, [x.clone().requires_grad_()], backward=True, min_ops=1)
    task = next(t for t in tasks if t.ops == ("aten.sigmoid.default", "aten.mul.Tensor", "aten.add.Tensor"))
    key = put_cached_entry(task, source=SWISH_BIAS_CUDA, device="cuda")
    eager_out, eager_grads = run_fwd_bwd(model, [x])
    ours_out, ours_grads = run_fwd_bwd(model, [x], "cuda_agent", options={"mode": "cached"})
    assert_close_lists(ours_out, eager_out, 1e-5, 1e-5, "output")
    assert_close_lists(ours_grads, eager_grads, 1e-4, 1e-4, "grad")
    assert runtime.registered(key).calls >= 1
    torch._dynamo.reset()
    with torch.no_grad():
        _, code = run_and_get_code(torch.compile(model, backend="cuda_agent", options={"mode": "cached"}), x)
    text = "\n".join(code)
    assert "cuda_agent.run_winner" in text and "extern_kernels" in text


# A softmax whose exp is not taken against its row's max: right on values within +-15, NaN past 88.7.
NAIVE_SOFTMAX = """
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x):
        e = x.exp()
        return e / e.sum(-1, keepdim=True)
"""


class Softmax(nn.Module):
    def forward(self, x):
        return torch.softmax(x, -1)


def _compile_softmax(caplog, options: dict, x: torch.Tensor) -> None:
    """A softmax over x * 40 (values up to about 150) compiled with `options`, its log in
    `caplog`: it matches eager."""
    torch._dynamo.reset()
    with torch.no_grad(), caplog.at_level("INFO", logger="cuda_agent"):
        out = torch.compile(Softmax(), backend="cuda_agent", options=options)(x * 40)
    torch.testing.assert_close(out, torch.softmax(x * 40, -1))


def _compile_over_a_cached_naive_softmax(caplog, options: dict) -> str:
    """The naive softmax cached as a local winner under older rules (no wide input set), then a
    softmax compiled with `options` (_compile_softmax). The entry's key."""
    x = torch.randn(64, 1000, device="cuda")
    (task,) = [t for t in collect_tasks(Softmax(), [x], backward=False) if "aten.amax.default" in t.ops]
    key = put_cached_entry(task, source=NAIVE_SOFTMAX, device="cuda", rules="0-older")
    runtime._registry.pop(key, None)
    _compile_softmax(caplog, options, x)
    return key


def test_a_cached_kernel_passed_by_older_rules_is_verified_again_and_refused(cache_dir, caplog):
    """A local winner recorded under rules without the wide input set (as an older version's
    verifier would have passed this softmax) runs only once these rules pass it: it fails on the
    wide set, and Inductor computes the softmax. The refusal is cached: the next compile does
    not verify it again."""
    from agent_backend.env.verify import RULES
    from kernel_cache import KernelCache
    key = _compile_over_a_cached_naive_softmax(caplog, {"mode": "cached"})
    assert runtime.registered(key) is None
    assert any("rejected here" in r.message and "mean 60" in r.message for r in caplog.records), \
        [r.message for r in caplog.records]
    with KernelCache.open() as cache:
        verification = cache.local.read(key).verification
    assert verification["rules"] == RULES and not verification["passed"], verification
    assert verification["refused"].startswith("local entry: incorrect: "), verification
    caplog.clear()
    _compile_softmax(caplog, {"mode": "cached"}, torch.randn(64, 1000, device="cuda"))
    assert runtime.registered(key) is None and not any("rejected here" in r.message for r in caplog.records)


def test_a_cached_kernel_refused_here_is_searched_anew_and_replaced(cache_dir, caplog):
    """In search mode, the cached naive softmax that these rules refuse is searched again: the
    search's result, verified under these rules, replaces it in the cache."""
    from agent_backend.env.verify import RULES
    from kernel_cache import KernelCache
    key = _compile_over_a_cached_naive_softmax(caplog, {"mode": "search", "search_budget_s": 30})
    assert any("its cached kernel failed verification here" in r.message for r in caplog.records)
    with KernelCache.open() as cache:
        entry = cache.local.read(key)
    assert entry.source != NAIVE_SOFTMAX
    assert entry.outcome != "kernel" or entry.verification["rules"] == RULES


def test_a_cached_winner_passed_by_older_rules_runs_once_these_pass_it(cache_dir):
    """A correct local winner recorded under older rules is verified again (not timed again: its
    timings were measured here) before it runs; its entry then records these rules."""
    from agent_backend.env.verify import RULES
    from helpers import TIMED_BOTH_WAYS
    from kernel_cache import KernelCache
    torch.manual_seed(0)
    model, x = Net().cuda(), torch.randn(32, 64, device="cuda")
    tasks = collect_tasks(model, [x.clone().requires_grad_()], backward=True, min_ops=1)
    task = next(t for t in tasks if t.ops == ("aten.sigmoid.default", "aten.mul.Tensor", "aten.add.Tensor"))
    key = put_cached_entry(task, source=SWISH_BIAS_CUDA, device="cuda", rules="0-older")
    runtime._registry.pop(key, None)
    torch._dynamo.reset()
    ours_out, _ = run_fwd_bwd(model, [x], "cuda_agent", options={"mode": "cached"})
    eager_out, _ = run_fwd_bwd(model, [x])
    assert_close_lists(ours_out, eager_out, 1e-5, 1e-5, "output")
    assert runtime.registered(key).calls >= 1
    with KernelCache.open() as cache:
        entry = cache.local.read(key)
    assert entry.verification["rules"] == RULES and entry.timings == TIMED_BOTH_WAYS


class Chains(nn.Module):
    """Pointwise chains big enough to be worth a kernel."""

    def forward(self, x, y):
        a = torch.tanh(x * 0.5 + y) * torch.sigmoid(y)
        return a, torch.relu(a - 1.0).sum()


def test_search_end_to_end(cache_dir):
    torch.manual_seed(0)
    x, y = torch.randn(4096, 1024, device="cuda"), torch.randn(4096, 1024, device="cuda")
    model = Chains()
    with torch.no_grad():
        expected = model(x, y)
        torch._dynamo.reset()
        got = torch.compile(model, backend="cuda_agent", options={"mode": "search", "search_budget_s": 300})(x, y)
    assert_close_lists(list(got), list(expected), 1e-4, 1e-4, "output")
    decisions = [d for d in backend.reports[-1].decisions if d.task is not None]
    assert decisions, "no subgraph reached the dispatcher"
    pointwise = [d for d in decisions if d.task.kind == "pointwise"]
    assert pointwise and all(not d.reason.startswith("no candidate") for d in pointwise), \
        [d.reason for d in pointwise]
    for d in pointwise:
        if d.winner_key:
            assert runtime.registered(d.winner_key).calls >= 1
    # A second compile finds every result in the cache and searches nothing.
    start = time.monotonic()
    torch._dynamo.reset()
    with torch.no_grad():
        again = torch.compile(model, backend="cuda_agent", options={"mode": "cached"})(x, y)
    assert_close_lists(list(again), list(expected), 1e-4, 1e-4, "cached output")
    assert all(not d.reason.startswith("no cached") for d in backend.reports[-1].decisions), \
        [d.reason for d in backend.reports[-1].decisions]
    print(f"cached recompile took {time.monotonic() - start:.1f} s;",
          [d.reason for d in backend.reports[-1].decisions])


def test_loser_from_an_older_policy_is_searched_again(cache_dir):
    """A cached "Inductor wins" from an older template revision does not stop a newer one."""
    from kernel_cache import KernelCache
    from agent_backend.policies.builtin import BuiltinPolicy
    torch.manual_seed(0)
    x, y = torch.randn(2048, 1024, device="cuda"), torch.randn(2048, 1024, device="cuda")
    model = Chains()
    tasks = [t for t in collect_tasks(model, [x, y], backward=False) if t.kind == "pointwise"]
    assert tasks
    digests = [put_cached_entry(t, "inductor", device="cuda", reason="an old loser",
                                provenance={"policy": "builtin", "policy_revision": "older"}) for t in tasks]
    torch._dynamo.reset()
    with torch.no_grad():
        got = torch.compile(model, backend="cuda_agent", options={"mode": "search", "search_budget_s": 300})(x, y)
        expected = model(x, y)
    assert_close_lists(list(got), list(expected), 1e-4, 1e-4, "output")
    reasons = [d.reason for d in backend.reports[-1].decisions if d.task is not None and d.task.kind == "pointwise"]
    assert reasons and not any("an old loser" in r for r in reasons), reasons
    cache = KernelCache.open()
    revisions = {cache.local.read(d).provenance["policy_revision"] for d in digests}
    cache.close()
    assert revisions == {BuiltinPolicy().revision}
