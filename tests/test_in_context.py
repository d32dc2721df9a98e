"""The in-context check with real workers and the real Inductor, on the CPU and (marked gpu) on
a GPU: a graph's winners are kept only where the whole graph, compiled by Inductor with them,
is not slower than without them; the verdict is cached per graph and winners. The winners are
supplied by hand (as a cache would supply them): one slower than Inductor, one doing less work
(a GEMM summed over its outputs as a GEMV), one wrong in context."""
import hashlib

import pytest
import torch
from torch._inductor.compile_fx import compile_fx

from agent_backend import background, runtime
from agent_backend.dispatch import Dispatcher, close_shared_environments
from agent_backend.graph_pass import Decision, SubgraphPass, rewrite
from agent_backend.in_context import build_check
from agent_backend.options import resolve
from agent_backend.task import UnsupportedGroup
from kernel_cache import KernelCache

SLOW_AFFINE = '''
import time
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x):
        time.sleep(0.05)  # slower than any graph here, even on a busy machine
        return x * 2.0 + 1.0
'''

WRONG_AFFINE = SLOW_AFFINE.replace("time.sleep(0.05)", "pass").replace("+ 1.0", "+ 1.5")

GEMV = '''
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x, w):
        return torch.mv(x, w.sum(1))
'''


def affine_then_more(x, w):
    y = x * 2.0 + 1.0  # returned, so it is a group of its own beside the mm
    return torch.mm(y, w), y


def gemm_then_sum(x, w):
    return torch.mm(x, w).sum(1)


@pytest.fixture(scope="module", autouse=True)
def _close_workers():
    yield
    close_shared_environments()


DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


def _compile(fn, inputs, settings, sources: dict[tuple[str, ...], str], speedups: dict[tuple[str, ...], float] = {},
             saved: dict[tuple[str, ...], float] = {}):
    """fn compiled with our pass: a group whose ops are a key of `sources` is won by that source
    (registered as a winner, as a cached one would be, with its speedup alone from `speedups`
    and the ms it saved alone from `saved`); the dispatcher's in-context check judges the graph.
    Returns the output, the decisions on those groups and the winners' keys by ops."""
    return _compile_with(fn, inputs, settings, lambda task: sources.get(task.ops), speedups, saved=saved)


def _compile_with(fn, inputs, settings, source_for, speedups: dict[tuple[str, ...], float] = {},
                  needs_context: bool = False, saved: dict[tuple[str, ...], float] = {}):
    """As _compile, with `source_for(task)` giving a group's winner (None: no winner), each one
    launch-bound (Decision.needs_context) where `needs_context`."""
    dispatcher = Dispatcher(settings)
    keys = {}

    def decide(task):
        source = source_for(task)
        if source is None:
            return Decision(task, None, "not supplied")
        key = "test-" + hashlib.sha256((task.hash + source).encode()).hexdigest()[:20]
        runtime.load_winner(runtime.Winner(key, source, task.outputs, "test"), inputs[0].device)
        keys[task.ops] = key
        return Decision(task, key, "kernel test", speedup=speedups.get(task.ops), needs_context=needs_context,
                        saved_gpu_ms=saved.get(task.ops))

    reports = []

    def backend(gm, example_inputs):
        return compile_fx(gm, example_inputs, config_patches={"post_grad_custom_pre_pass": SubgraphPass(
            decide, 1, reports, confirm=dispatcher.confirm_in_context)})

    torch._dynamo.reset()
    out = torch.compile(fn, backend=backend)(*inputs)
    return out, [d for r in reports for d in r.decisions if d.task and d.task.ops in keys], keys


def _context_entries(cache_dir):
    cache = KernelCache.open(cache_dir=str(cache_dir))
    return [row.entry for row in cache.local.rows() if row.entry.outcome == "context"]


AFFINE_OPS = ("aten.mul.Tensor", "aten.add.Tensor")
GEMM_SUM_OPS = ("aten.mm.default", "aten.sum.dim_IntList")
GEMV_FOR = {GEMM_SUM_OPS: GEMV}


def gemm_inputs() -> list[torch.Tensor]:
    """x and w of a GEMM with far more work than the GEMV that replaces it (about 10x on a
    2-core CPU): with 256 rows of x, a busy CI machine once timed the GEMV's graph slower."""
    return [torch.randn(1024, 1024), torch.randn(1024, 1024)]


@pytest.mark.parametrize("device", DEVICES)
def test_a_winner_slower_in_its_graph_is_dropped_and_the_verdict_is_cached(cache_dir, device):
    x = [torch.randn(64, 32, device=device), torch.randn(32, 32, device=device)]
    out, (decision,), keys = _compile(affine_then_more, x, resolve({"mode": "search"}), {AFFINE_OPS: SLOW_AFFINE})
    torch.testing.assert_close(out, affine_then_more(*x))
    assert decision.winner_key is None and decision.reason.startswith("lost in context: the whole graph ran"), \
        decision.reason
    assert runtime.registered(keys[AFFINE_OPS]).calls == 0, "a dropped winner must not run"
    (entry,) = _context_entries(cache_dir)
    assert entry.timings["kept"] is False and entry.timings["speedup"] < 1.0, entry.timings

    # mode "cached" keeps winners whose graph has no verdict; this one has one.
    _, (again,), _ = _compile(affine_then_more, x, resolve({"mode": "cached"}), {AFFINE_OPS: SLOW_AFFINE})
    assert again.winner_key is None and again.reason.startswith("lost in context"), again.reason


@pytest.mark.parametrize("device", DEVICES)
def test_a_winner_that_removes_work_is_kept_and_runs(cache_dir, device):
    # On a GPU big enough that the GEMM, not the winner's host time per call, sets the times.
    m, k = (1024, 1024) if device == "cpu" else (1024, 4096)
    x, w = torch.randn(m, k, device=device), torch.randn(k, k, device=device)
    out, (decision,), keys = _compile(gemm_then_sum, [x, w], resolve({"mode": "search"}), {GEMM_SUM_OPS: GEMV})
    torch.testing.assert_close(out, gemm_then_sum(x, w), rtol=1e-4, atol=1e-2)
    assert decision.winner_key == keys[GEMM_SUM_OPS], decision.reason
    assert "in context: the whole graph ran" in decision.reason, decision.reason
    # on a GPU, times after both L2 flushes: the reason gives those of the one less favourable to ours
    assert ("flush of the L2" in decision.reason) is (device == "cuda"), decision.reason
    assert runtime.registered(keys[GEMM_SUM_OPS]).calls >= 1
    (entry,) = _context_entries(cache_dir)
    assert entry.timings["kept"] is True and entry.timings["speedup"] > 1.0, entry.timings


def test_a_graph_that_gains_more_than_its_winners_saved_alone_is_timed_twice(cache_dir):
    """The GEMV removes the GEMM's work: its graph gains far more than the 0 ms the winner is said
    to have saved alone, so the check times it again (and keeps it: both timings gain); where it
    saved as much alone, once."""
    x, w = gemm_inputs()
    for saved, twice in ((0.0, True), (1e3, False)):
        own = cache_dir / f"saved-{saved}"
        _, (decision,), _ = _compile(gemm_then_sum, [x, w], resolve({"mode": "search", "cache_dir": str(own)}),
                                     {GEMM_SUM_OPS: GEMV}, saved={GEMM_SUM_OPS: saved})
        (entry,) = _context_entries(own)
        assert entry.timings["kept"] is True and decision.winner_key is not None, entry.reason
        assert ("timed twice: the first timing's GPU time fell by" in entry.reason) is twice, entry.reason
        assert ("the kernels saved 0 ms alone" in decision.reason) is twice, decision.reason


@pytest.mark.parametrize("first, again, chosen", [
    ((0.05, 0.1, 0.04, 0.1), (0.09, 0.1, 0.08, 0.1), 1),  # both kept: the lower GPU speedup decides
    ((0.09, 0.1, 0.08, 0.1), (0.05, 0.1, 0.04, 0.1), 0),
    ((0.05, 0.1, 0.04, 0.1), (0.2, 0.1, 0.2, 0.1), 1),    # the second loses: dropped
    ((0.05, 0.1, 0.04, 0.1), None, 1),                    # the second failed: dropped
])
def test_of_two_timings_the_less_favourable_decides(first, again, chosen):
    from agent_backend.env.results import ContextTiming
    from agent_backend.in_context import less_favourable
    timings = [ContextTiming("passed", "", *first[:2], "cpu", *first[2:]),
               ContextTiming("passed", "", *again[:2], "cpu", *again[2:]) if again else
               ContextTiming("runtime_error", "the worker crashed")]
    assert less_favourable(*timings) is timings[chosen]


def test_a_gpu_gain_beyond_what_the_winners_saved_alone_is_implausible():
    from agent_backend.env.results import ContextTiming
    from agent_backend.in_context import implausible, saved_alone
    timing = ContextTiming("passed", "", 0.05, 0.1, "cuda:0", 0.04, 0.1)
    # 0.06 ms less on the GPU: beyond twice 0.02 ms saved alone plus 5% of 0.1 ms, within twice 0.03
    assert implausible(timing, 0.02) and not implausible(timing, 0.03)
    assert not implausible(timing, None) and not implausible(ContextTiming("passed", "", 0.05, 0.1), 0.0)
    assert saved_alone([Decision(None, "k", "", saved_gpu_ms=0.01)] * 3) == pytest.approx(0.03)
    assert saved_alone([Decision(None, "k", "", saved_gpu_ms=0.01), Decision(None, "k", "")]) is None


@pytest.mark.parametrize("device", DEVICES)
def test_a_winner_that_disagrees_in_its_graph_is_dropped(cache_dir, device):
    x = [torch.randn(64, 32, device=device), torch.randn(32, 32, device=device)]
    _, (decision,), _ = _compile(affine_then_more, x, resolve({"mode": "search"}), {AFFINE_OPS: WRONG_AFFINE})
    assert decision.winner_key is None and "disagrees" in decision.reason, decision.reason


def test_without_a_verdict_mode_cached_keeps_the_winners(cache_dir):
    x = [torch.randn(64, 32), torch.randn(32, 32)]
    out, (decision,), keys = _compile(affine_then_more, x, resolve({"mode": "cached"}), {AFFINE_OPS: SLOW_AFFINE})
    torch.testing.assert_close(out, affine_then_more(*x))
    assert decision.winner_key == keys[AFFINE_OPS] and not _context_entries(cache_dir)
    assert decision.reason == "kernel test"


def test_the_check_can_be_turned_off(cache_dir):
    x = [torch.randn(64, 32), torch.randn(32, 32)]
    settings = resolve({"mode": "search", "in_context_check": False})
    _, (decision,), keys = _compile(affine_then_more, x, settings, {AFFINE_OPS: SLOW_AFFINE})
    assert decision.winner_key == keys[AFFINE_OPS] and not _context_entries(cache_dir)
    assert decision.reason == "kernel test"


def test_a_graph_that_cannot_be_checked_keeps_its_winners_and_says_why(cache_dir):
    def own_program(task):
        return task.program + "\n\nclass ModelNew(Model):\n    pass\n"

    x = torch.randn(64, 32)
    _, decisions, _ = _compile_with(lambda x: x * torch.tensor([2.0, 3.0] * 16) + 1.0, [x],
                                    resolve({"mode": "search"}), own_program)
    assert decisions and all(d.winner_key for d in decisions), [d.reason for d in decisions]
    assert all(d.reason.endswith("in context: not checked (the graph holds constants of its own)")
               for d in decisions), [d.reason for d in decisions]


@pytest.mark.parametrize("options, why", [({"mode": "cached"}, "none yet"),
                                          ({"mode": "search", "in_context_check": False}, "in_context_check is off"),
                                          ({"mode": "background"}, "being checked in the background")])
def test_a_launch_bound_winner_runs_only_with_a_measured_verdict(cache_dir, options, why):
    """A kernel faster on the GPU whose launch outlasts it stays with Inductor until its graph
    is measured faster with it; background mode queues that measurement."""
    x, w = gemm_inputs()
    out, (decision,), keys = _compile_with(gemm_then_sum, [x, w], resolve(options), lambda t: GEMV_FOR.get(t.ops),
                                           needs_context=True)
    torch.testing.assert_close(out, gemm_then_sum(x, w), rtol=1e-4, atol=1e-2)
    assert decision.winner_key is None, decision.reason
    assert decision.reason.startswith(f"no in-context verdict ({why}") and \
        "its launch takes longer than it runs" in decision.reason, decision.reason
    assert runtime.registered(keys[GEMM_SUM_OPS]).calls == 0
    if options["mode"] == "background":
        assert background.refresh(wait=True, timeout_s=300) == 0
        (entry,) = _context_entries(cache_dir)
        assert entry.timings["kept"] is True, "the queued check measured the graph with the kernel"
        _, (later,), _ = _compile_with(gemm_then_sum, [x, w], resolve(options), lambda t: GEMV_FOR.get(t.ops),
                                       needs_context=True)
        assert later.winner_key and "in context: the whole graph ran" in later.reason, later.reason


def test_a_launch_bound_winner_measured_faster_in_its_graph_runs(cache_dir):
    x, w = gemm_inputs()
    out, (decision,), keys = _compile_with(gemm_then_sum, [x, w], resolve({"mode": "search"}),
                                           lambda t: GEMV_FOR.get(t.ops), needs_context=True)
    assert decision.winner_key == keys[GEMM_SUM_OPS] and "in context: the whole graph ran" in decision.reason
    assert runtime.registered(keys[GEMM_SUM_OPS]).calls >= 1


def test_a_launch_bound_winner_in_a_graph_that_cannot_be_checked_stays_with_inductor(cache_dir):
    def own_program(task):
        return task.program + "\n\nclass ModelNew(Model):\n    pass\n"

    _, decisions, _ = _compile_with(lambda x: x * torch.tensor([2.0, 3.0] * 16) + 1.0, [torch.randn(64, 32)],
                                    resolve({"mode": "search"}), own_program, needs_context=True)
    assert decisions and not any(d.winner_key for d in decisions), [d.reason for d in decisions]
    assert all(d.reason.startswith("no in-context verdict (not checked (the graph holds constants")
               for d in decisions), [d.reason for d in decisions]


def _graph_of(fn, inputs, dynamic=False):
    graphs = []

    def backend(gm, example_inputs):
        def record(graph):
            graphs.append(graph)
        return compile_fx(gm, example_inputs, config_patches={"post_grad_custom_pre_pass": record})

    torch._dynamo.reset()
    torch.compile(fn, backend=backend, dynamic=dynamic)(*inputs)
    return graphs[0]


def test_graphs_drawing_random_numbers_are_timed_without_comparing_results():
    dropout = build_check(_graph_of(lambda x: torch.nn.functional.dropout(x * 2, 0.5) + 1, [torch.randn(8)]), [],
                          rewrite)
    assert not dropout.comparable
    # Attention ops carry the random tag for their dropout; at dropout_p = 0 they are deterministic.
    q = torch.randn(1, 2, 8, 4)
    attention = build_check(_graph_of(lambda q, k, v: torch.nn.functional.scaled_dot_product_attention(q, k, v) * 2,
                                      [q, q.clone(), q.clone()]), [], rewrite)
    assert attention.comparable and any("scaled_dot_product" in op for op in attention.before.ops)


def test_graphs_with_symbolic_sizes_are_not_checked():
    with pytest.raises(UnsupportedGroup, match="not a tensor"):
        build_check(_graph_of(lambda x: x * 2 + 1, [torch.randn(8)], dynamic=True), [], rewrite)


def test_both_programs_take_the_graphs_inputs_in_one_order():
    graph = _graph_of(lambda a, b: (b * 2 + a).relu() + b.sum(), [torch.randn(8), torch.randn(8)])
    check = build_check(graph, [], rewrite)
    assert check.before.inputs == check.after.inputs and check.before.outputs == check.after.outputs
    assert check.before.kind == "graph"


def test_a_graph_indexed_by_integer_inputs_is_checked_with_indices_in_bounds(cache_dir):
    """Token ids become zeros in the check's inputs; drawn like floats they were negative."""
    def embed_then_affine(table, ids, w):
        y = table[ids] * 2.0 + 1.0
        return torch.mm(y, w), y

    inputs = [torch.randn(1000, 32), torch.randint(0, 1000, (64,)), torch.randn(32, 32)]
    out, (decision,), _ = _compile(embed_then_affine, inputs, resolve({"mode": "search"}), {AFFINE_OPS: SLOW_AFFINE})
    torch.testing.assert_close(out, embed_then_affine(*inputs))
    assert decision.reason.startswith("lost in context: the whole graph ran"), decision.reason


def test_where_all_winners_lose_together_the_one_least_faster_alone_is_dropped_first(cache_dir):
    def two_groups(x, w, v, u):
        y = v * 2.0 + 1.0
        return torch.mm(x, w).sum(1), torch.mm(y, u), y

    inputs = [*gemm_inputs(), torch.randn(64, 32), torch.randn(32, 32)]
    _, decisions, keys = _compile(two_groups, inputs, resolve({"mode": "search"}),
                                  {GEMM_SUM_OPS: GEMV, AFFINE_OPS: SLOW_AFFINE}, {GEMM_SUM_OPS: 3.0, AFFINE_OPS: 1.2})
    by_ops = {d.task.ops: d for d in decisions}
    assert by_ops[AFFINE_OPS].winner_key is None and by_ops[AFFINE_OPS].reason.startswith("lost in context")
    assert by_ops[GEMM_SUM_OPS].winner_key == keys[GEMM_SUM_OPS], by_ops[GEMM_SUM_OPS].reason
    kept = sorted(e.timings["kept"] for e in _context_entries(cache_dir))
    assert kept == [False, True], "one check with both winners, one with the GEMV alone"


def test_a_transformer_graph_is_checked_whole(cache_dir):
    """GPT-2's inference graph (token ids, attention with dropout_p = 0) with its LayerNorms won
    by their own programs: both graphs compile in the worker, agree and are timed."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=100, n_positions=32, n_embd=32, n_layer=1, n_head=2)).eval()
    ids = torch.randint(0, 100, (2, 16))

    def own_program(task):  # the task's reference, as a winner: correct by construction
        return task.program + "\n\nclass ModelNew(Model):\n    pass\n" if task.ops[0] == "aten.var_mean.correction" \
            else None

    with torch.no_grad():
        expected = model(ids).logits
        out, decisions, keys = _compile_with(lambda i: model(i).logits, [ids], resolve({"mode": "search"}),
                                             own_program)
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-4)
    assert len(keys) == 1 and len(decisions) == 3, "the three LayerNorms are one task"
    entries = _context_entries(cache_dir)
    assert entries and all(e.reason.startswith("the whole graph ran") for e in entries), [e.reason for e in entries]
    # Kept or dropped, each decision says what the check found.
    assert all("in context: the whole graph ran" in d.reason for d in decisions), [d.reason for d in decisions]


def test_a_training_steps_row_tasks_won_in_place_compute_the_same_step(cache_dir):
    """GPT-2's training step with every row task (LayerNorms, their backward, the loss, the bias
    gradients) won by its own program. The forward computes a LayerNorm's output, uses it, and
    only then the LayerNorm's 1/std saved for the backward: the winner's call, put where the
    group's last node was, came after that use, and Inductor refused the graph ("used before it
    has been defined"); the graph is now sorted again. Loss and gradients match eager's."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=32, n_embd=32, n_layer=1, n_head=2,
                                       resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0))
    ids = torch.randint(0, 64, (2, 16))

    def step(i):
        out = model(i, labels=i)
        out.loss.backward()
        return out.loss.detach()

    def own_program(task):
        return task.program + "\n\nclass ModelNew(Model):\n    pass\n" if task.kind == "reduction" else None

    expected_loss = step(ids)
    expected = {name: p.grad.clone() for name, p in model.named_parameters()}
    model.zero_grad()
    loss, decisions, keys = _compile_with(step, [ids], resolve({"mode": "search", "in_context_check": False}),
                                          own_program)
    assert len(keys) >= 5 and all(d.winner_key for d in decisions), "LayerNorm forward and backward, sums, the loss"
    torch.testing.assert_close(loss, expected_loss)
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.grad, expected[name], rtol=1e-4, atol=1e-5, msg=name)


def test_a_graph_whose_inputs_take_a_large_share_of_the_gpus_free_memory_is_not_checked(monkeypatch):
    from agent_backend.in_context import ContextCheck, too_big
    from agent_backend.specs import Task, TensorSpec

    weights = TensorSpec((4096, 4096), (4096, 1), "bfloat16", "cuda")  # 32 MiB
    graph = Task("h", "", (weights, weights), (weights,), (), "graph")
    check = ContextCheck(graph, graph, ("k",))
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda *device: (1 << 30, 1 << 31))
    assert too_big(check) is None  # 64 MiB of 1 GiB free
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda *device: (200 << 20, 1 << 31))
    assert "take more than 25% of the GPU's free memory" in too_big(check)


def test_graphs_that_differ_beyond_tolerance_are_judged_against_float64():
    """Two roundings of a deep bf16 graph drift apart beyond any fixed tolerance: the graph with
    our kernels then agrees where it is no less accurate than Inductor's against float64."""
    from agent_backend.env.worker import _disagreement
    from agent_backend.specs import Task, TensorSpec

    torch.manual_seed(0)
    exact = torch.randn(4096, dtype=torch.float64)
    close = exact.to(torch.bfloat16)  # one rounding of the exact values
    far = (exact * (1 + 0.05 * torch.randn(4096, dtype=torch.float64))).to(torch.bfloat16)  # 5% off
    spec = TensorSpec((4096,), (1,), "bfloat16", "cpu")
    task = Task("h", "", (spec,), (spec,), ("aten.mul.Tensor",), "graph")
    assert _disagreement([close], [far], task, {}, lambda: [exact]) is None, "ours is the closer one"
    problem = _disagreement([far], [close], task, {}, lambda: [exact])
    assert problem.startswith("output 0:") and "less accurate than the reference" in problem, problem
    assert _disagreement([close], [close], task, {}, lambda: 1 / 0) is None, "no float64 run where they agree"

    def no_float64():
        raise RuntimeError("no float64 kernel")
    assert "no float64 evaluation to judge by" in _disagreement([close], [far], task, {}, no_float64)


@pytest.mark.parametrize("ours, inductor, ours_gpu, inductor_gpu, kept", [
    (0.9, 1.0, 0.9, 1.0, True),        # faster: kept
    (0.1005, 0.1, 0.05, 0.07, True),   # host-bound, a tie within noise, 1.4x on the GPU: kept
    (0.1005, 0.1, 0.069, 0.07, False),  # a tie, and no faster on the GPU: dropped
    (0.105, 0.1, 0.05, 0.07, False),   # slower beyond noise however fast its GPU part: dropped
    (0.1005, 0.1, None, None, False),  # no GPU times (an older worker's reply): the graph's time alone
    (0.09, 0.1, None, None, True),
    (0.05, 0.1, 0.074, 0.07, False),   # faster by its host's time only, slower on the GPU: dropped
    (0.05, 0.1, 0.0714, 0.07, False),  # even within noise (0.98x): the host times are the worker's
    (0.05, 0.1, 0.07, 0.07, True),     # faster, and as fast on the GPU: kept
])
def test_a_tie_on_host_time_keeps_a_kernel_faster_on_the_gpu(ours, inductor, ours_gpu, inductor_gpu, kept):
    from agent_backend.env.results import ContextTiming
    from agent_backend.in_context import describe, keeps
    timing = ContextTiming("passed", "", ours, inductor, "cuda:0", ours_gpu, inductor_gpu)
    assert keeps(timing) is kept
    assert ("on the GPU" in describe(timing)) is (ours_gpu is not None)
    # the worker's host times, where its reply has them, show what made a graph host-bound
    with_host = ContextTiming("passed", "", ours, inductor, "cuda:0", ours_gpu, inductor_gpu, 0.03, 0.02)
    assert "(host 0.03 ms vs 0.02 ms)" in describe(with_host) and keeps(with_host) is kept
    # the worker's times after both flushes are those of the one less favourable to ours: it says which
    flushed = ContextTiming("passed", "", ours, inductor, "cuda:0", ours_gpu, inductor_gpu, flush="read")
    assert "after a read flush of the L2" in describe(flushed) and "flush" not in describe(timing)


def test_a_verdict_cached_under_an_older_rule_keeps_kernels_only_where_todays_rule_does():
    from kernel_cache import Entry
    from agent_backend.in_context import verdict
    def cached(kept, speedup, gpu_speedup):
        return Entry(outcome="context", reason="the whole graph ran ...", origin="in-context check",
                     timings={"ours_ms": 0.1, "inductor_ms": 0.1 * speedup, "speedup": speedup,
                              "gpu_speedup": gpu_speedup, "kept": kept})
    assert verdict(cached(True, 1.05, 0.98))[0] is False  # kept by the rule before GPU_AT_LEAST
    assert verdict(cached(True, 1.05, 1.02))[0] is True
    assert verdict(cached(False, 1.05, 1.02))[0] is False  # dropped stays dropped (e.g. results disagreed)
    assert verdict(cached(True, 1.05, None))[0] is True  # an older worker's: the graph's time alone


def _check_replayed(monkeypatch, tmp_path, *timings):
    """A real Dispatcher's in-context check of a graph, its timings (ours, Inductor's, our GPU,
    Inductor's GPU ms; None: no more) replayed: GPU times, which this machine cannot make.
    Returns the graphs timed and the check's entry."""
    from agent_backend import dispatch
    from agent_backend.env.results import ContextTiming
    from agent_backend.in_context import ContextCheck
    from agent_backend.specs import Task, TensorSpec

    replies = iter([ContextTiming("passed", "", *t[:2], "cuda:0", *t[2:]) for t in timings if t])
    asked = []

    class ReplayedTimings:
        def time_in_context(self, before, after, winners, compare=True):
            asked.append(before.hash)
            return next(replies)

    monkeypatch.setattr(dispatch, "shared_environment", lambda *args, **kwargs: ReplayedTimings())
    spec = TensorSpec((64,), (1,), "float32", "cuda")
    graph = Task("h", "", (spec,), (spec,), ("aten.mul.Tensor",), "graph")
    entry = Dispatcher(resolve({"mode": "search", "cache_dir": str(tmp_path)}))._check_in_context(
        ContextCheck(graph, graph, ()), None)
    return asked, entry


@pytest.mark.parametrize("first, again, timed, kept", [
    ((0.098, 0.1, 0.098, 0.1), (0.1, 0.1, 0.103, 0.1), 2, False),  # 1.02x on the GPU, then 0.97x: dropped
    ((0.098, 0.1, 0.098, 0.1), (0.095, 0.1, 0.096, 0.1), 2, True),  # 1.02x, then 1.04x: kept
    ((0.09, 0.1, 0.09, 0.1), None, 1, True),                        # 1.11x: sure, timed once
    ((0.11, 0.1, 0.11, 0.1), None, 1, False),                       # slower: dropped at once
])
def test_a_graph_kept_by_a_gpu_gain_within_noise_is_timed_again(monkeypatch, tmp_path, first, again, timed, kept):
    """One check's GPU ratio moves by a few percent between runs: a graph kept by less than
    GPU_SURE_AT on the GPU is timed once more, and the less favourable timing decides (timings
    replayed: _check_replayed)."""
    asked, entry = _check_replayed(monkeypatch, tmp_path, first, again)
    assert len(asked) == timed and entry.timings["kept"] is kept, entry.reason
    assert ("within one timing's noise" in entry.reason) is (timed == 2), entry.reason


@pytest.mark.parametrize("first, again, timed, kept", [
    ((0.105, 0.1, 0.05, 0.1), (0.098, 0.1, 0.05, 0.1), 2, True),   # host 0.95x, GPU 2x; then 1.02x: kept
    ((0.105, 0.1, 0.05, 0.1), (0.104, 0.1, 0.05, 0.1), 2, False),  # host 0.95x, then 0.96x: a real loss
    ((0.105, 0.1, 0.05, 0.1), (0.098, 0.1, 0.101, 0.1), 2, False),  # the keeping timing must gain on the GPU
    ((0.12, 0.1, 0.05, 0.1), None, 1, False),                      # host 0.83x: beyond noise, dropped at once
    ((0.105, 0.1, 0.099, 0.1), None, 1, False),                    # GPU 1.01x: no gain sure enough to retry
])
def test_a_graph_dropped_by_host_time_within_noise_but_well_faster_on_the_gpu_is_timed_again(
        monkeypatch, tmp_path, first, again, timed, kept):
    """The worker's host times swing far more than its GPU times: a graph dropped by host time
    within HOST_NOISE_AT while its GPU time is at least GPU_SURE_AT faster is timed once more,
    and the more favourable timing decides (timings replayed: _check_replayed)."""
    asked, entry = _check_replayed(monkeypatch, tmp_path, first, again)
    assert len(asked) == timed and entry.timings["kept"] is kept, entry.reason
    assert ("dropped the kernels by host time" in entry.reason) is (timed == 2), entry.reason
