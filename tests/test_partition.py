"""Partitioning: groups are disjoint and convex, anchors take their epilogues, chains form."""
import operator

import torch
from torch.fx.experimental.proxy_tensor import make_fx

from agent_backend.graph_pass import worth_a_search
from agent_backend.partition import _Graph, classify, index_use, partition


def _graph(fn, *inputs):
    gm = make_fx(fn)(*inputs)
    gm.graph.eliminate_dead_code()
    return gm.graph


def _ops(group):
    return [n.target._opname for n in group.nodes if n.target is not operator.getitem]


def test_pointwise_chain_is_one_group():
    g = _graph(lambda x, y: torch.tanh(torch.relu(x + y) * 2.0), torch.randn(4, 8), torch.randn(4, 8))
    groups = partition(g)
    assert [(gr.kind, _ops(gr)) for gr in groups] == [("pointwise", ["add", "relu", "mul", "tanh"])]


def test_matmul_takes_epilogue_not_unrelated_work():
    def fn(x, w, b, z):
        return torch.relu(x @ w + b), torch.exp(z)
    groups = partition(_graph(fn, torch.randn(4, 8), torch.randn(8, 8), torch.randn(8), torch.randn(3)))
    kinds = {gr.kind: _ops(gr) for gr in groups}
    assert kinds["matmul"] == ["mm", "add", "relu"]
    assert kinds["pointwise"] == ["exp"]


def test_no_group_would_make_a_cycle():
    """exp feeds the mm and, around it, the add: {exp, add} without mm would be a cycle."""
    def fn(x, w):
        e = torch.exp(x)
        return torch.relu(e @ w) + e.sum()
    g = _graph(fn, torch.randn(8, 8), torch.randn(8, 8))
    gr = _Graph(g)
    nodes = {n.target._opname: n for n in g.nodes if n.op == "call_function"}
    assert not gr.is_convex({nodes["exp"], nodes["add"]})
    groups = partition(g)
    seen = set()
    for group in groups:
        members = set(group.nodes)
        assert not (members & seen), "groups overlap"
        seen |= members
        assert gr.is_convex(members)


def test_softmax_rows_fuse_into_one_group():
    def softmax(x):  # as Inductor's decompositions write it in the post-grad graph
        e = torch.exp(x * 2.0 - (x * 2.0).amax(-1, keepdim=True))
        return e / e.sum(-1, keepdim=True)
    g = _graph(softmax, torch.randn(4, 16))
    groups = partition(g)
    assert len(groups) == 1 and groups[0].kind == "reduction"
    assert {"amax", "exp", "sum", "div"} <= set(_ops(groups[0]))


def test_classify_says_why_not():
    g = _graph(lambda x: torch.rand_like(x) + x.long().float(), torch.randn(4))
    reasons = {n.target._opname: classify(n) for n in g.nodes if n.op == "call_function"}
    assert reasons["rand_like"].kind is None and "random" in reasons["rand_like"].reason
    assert any(c.kind is None and "int64" in c.reason for c in reasons.values())


def test_logsumexp_is_one_group_through_the_view_of_its_max():
    def logsumexp(x):  # as the decomposition writes it: the max is squeezed before the final add
        m = x.amax(-1, keepdim=True)
        m = torch.where(m.abs() == float("inf"), 0.0, m)
        return torch.log(torch.exp(x - m).sum(-1)) + m.squeeze(-1)
    groups = partition(_graph(logsumexp, torch.randn(4, 16)))
    assert len(groups) == 1 and groups[0].kind == "reduction"
    assert {"amax", "sum", "log", "squeeze", "add"} <= set(_ops(groups[0]))


def _as_strided_reshape(x, w):
    """What Inductor's GroupNorm decomposition writes: a per-group value reshaped to one per
    channel by as_strided, then broadcast over x."""
    scale = x.reshape(2, 4, 4, 30).var(dim=(2, 3), keepdim=True) * w.reshape(1, 4, 4, 1)
    return x * torch.as_strided(scale, [2, 16], [16, 1]).unsqueeze(2).unsqueeze(3)


def test_an_as_strided_reshape_is_a_view_and_leads_a_reduction_on_to_its_epilogue():
    g = _graph(_as_strided_reshape, torch.randn(2, 16, 5, 6), torch.randn(16))
    (node,) = [n for n in g.nodes if n.target is torch.ops.aten.as_strided.default]
    assert classify(node).kind == "view"
    groups = partition(g)
    assert [gr.kind for gr in groups] == ["reduction"]
    assert {"var", "as_strided", "unsqueeze", "mul"} <= set(_ops(groups[0]))


def test_an_as_strided_that_is_no_reshape_is_no_view():
    g = _graph(lambda x: torch.as_strided(x, [4, 4], [1, 4]) * 2, torch.randn(16))  # a transpose
    (node,) = [n for n in g.nodes if n.target is torch.ops.aten.as_strided.default]
    assert classify(node).kind is None
    g = _graph(lambda x: torch.as_strided(x, [8], [1], 8) * 2, torch.randn(16))  # from an offset
    (node,) = [n for n in g.nodes if n.target is torch.ops.aten.as_strided.default]
    assert classify(node).kind is None


def test_a_matmul_leaves_an_upcast_that_a_reduction_reads_to_the_reduction():
    """bf16 logits cast up for a softmax (as Inductor's decompositions write it): the cast is the
    softmax's prologue, so the softmax reads the product's bf16 output; a cast that feeds
    pointwise work only stays in the matmul's epilogue."""
    up = torch.ops.prims.convert_element_type.default

    def fn(x, w):
        logits = up(x @ w, torch.float32)
        e = torch.exp(logits - logits.amax(-1, keepdim=True))
        return e / e.sum(-1, keepdim=True), torch.relu(up(x @ w, torch.float32))
    bf16 = torch.bfloat16
    groups = partition(_graph(fn, torch.randn(4, 8, dtype=bf16), torch.randn(8, 16, dtype=bf16)))
    assert [(gr.kind, _ops(gr)[:2]) for gr in groups] == [
        ("matmul", ["mm"]), ("reduction", ["convert_element_type", "amax"]),
        ("matmul", ["mm", "convert_element_type"])]
    assert _ops(groups[2]) == ["mm", "convert_element_type", "relu"]


def test_a_convolution_leaves_an_upcast_that_a_group_norm_reads_to_the_norm():
    """A bf16 convolution's output cast up for GroupNorm's statistics (in Inductor's graph, read
    through a reshape): the cast is the norm's prologue, so the norm's task reads the conv's bf16
    output rather than an fp32 copy of it written between the two."""
    from agent_backend.explain import tasks_of, trace_tasks
    from benchmarks.suite.problem import build
    from benchmarks.suite.registry import select

    (problem,) = select(only=["conv_groupnorm_silu"])
    model, inputs = build(problem, "bf16", "cpu", small=True)
    conv, norm = tasks_of(trace_tasks(model, inputs, backward=False, min_ops=1))
    assert (conv.kind, conv.ops) == ("conv", ("aten.convolution.default",))
    assert norm.kind == "reduction" and norm.ops[0] == "prims.convert_element_type.default", norm.ops
    assert norm.inputs[0].dtype == "bfloat16" and norm.inputs[0].shape == conv.outputs[0].shape


def test_a_cumsum_is_a_scan_group_with_its_casts_and_pointwise_work():
    """cumsum anchors a group of kind "scan" (the rows family's kernel): fp32 alone; bf16 as
    Inductor's graph has it with a cast up before and down after, and pointwise work around."""
    convert = torch.ops.prims.convert_element_type.default
    (alone,) = partition(_graph(lambda x: torch.cumsum(x, -1), torch.randn(4, 16)))
    assert (alone.kind, _ops(alone)) == ("scan", ["cumsum"]) and worth_a_search(alone, min_ops=2)

    def casts(x):
        return convert(torch.cumsum(convert(x, torch.float32) * 2, -1), torch.bfloat16) + 1
    (group,) = partition(_graph(casts, torch.randn(4, 16, dtype=torch.bfloat16)))
    assert (group.kind, _ops(group)) == ("scan", ["convert_element_type", "mul", "cumsum", "convert_element_type",
                                                  "add"])


def test_a_cumsum_after_a_softmax_leaves_the_softmax_its_group():
    def fn(x):
        e = torch.exp(x - x.amax(-1, keepdim=True))
        return torch.cumsum(e / e.sum(-1, keepdim=True), -1)
    groups = partition(_graph(fn, torch.randn(4, 16)))
    assert [(gr.kind, _ops(gr)[-1]) for gr in groups] == [("reduction", "div"), ("scan", "cumsum")]


def _nll_with_mask(x, t):
    """Cross-entropy as its decomposition writes it: rows whose target is -100 are masked, the
    gather reads where(t != -100, t, 0), and the mean divides by the rows that count."""
    shifted = x - x.amax(-1, keepdim=True)  # log_softmax as the post-grad graph has it
    logp = shifted - shifted.exp().sum(-1, keepdim=True).log()
    keep = t != -100
    picked = -logp.gather(1, torch.where(keep, t, 0).unsqueeze(1)).squeeze(1)
    return torch.where(t != -100, picked, 0.0).sum() / (t != -100).sum().to(x.dtype)


def test_cross_entropys_target_mask_and_index_join_its_row_group():
    g = _graph(_nll_with_mask, torch.randn(8, 16), torch.arange(8))
    (rows,) = [gr for gr in partition(g) if "gather" in _ops(gr)]
    assert {"ne", "where", "unsqueeze", "gather", "amax"} <= set(_ops(rows))
    target = next(n for n in g.nodes if n.op == "placeholder" and n.meta["val"].dtype == torch.int64)
    compares = [u for u in target.users if u.target is torch.ops.aten.ne.Scalar]
    # the mean's count is no row's: its compare stays with Inductor, beside the sum of the mask
    assert sum(u in rows.nodes for u in compares) == len(compares) - 1


def test_a_compare_the_mean_shares_is_made_in_the_row_group_and_written_out():
    """One t != -100 for the index, the mask and the mean's count (linear + cross-entropy's graph):
    the row group makes it and writes it, so no kernel of Inductor's runs before the group."""
    def fn(x, t):
        shifted = x - x.amax(-1, keepdim=True)
        logp = shifted - shifted.exp().sum(-1, keepdim=True).log()
        keep = t != -100
        picked = -logp.gather(1, torch.where(keep, t, 0).unsqueeze(1)).squeeze(1)
        return torch.where(keep, picked, 0.0).sum() / keep.sum().to(x.dtype)
    g = _graph(fn, torch.randn(8, 16), torch.arange(8))
    (rows,) = [gr for gr in partition(g) if "gather" in _ops(gr)]
    (ne,) = [n for n in g.nodes if n.target is torch.ops.aten.ne.Scalar]
    assert ne in rows.nodes and any(u not in rows.nodes for u in ne.users)


def _one_hot_backward(logp, t, g):
    """Cross-entropy's backward as the post-grad graph has it: the one-hot of each row's target,
    eq(expand(where(t != -100, t, 0)), iota), times the masked gradient, less softmax x its sum."""
    keep = t.unsqueeze(1) != -100
    iota = torch.ops.prims.iota(16, start=0, step=1, dtype=torch.int64, device=torch.device("cpu"),
                                requires_grad=False)
    hot = torch.where(keep, t.unsqueeze(1), 0).expand(8, 16) == iota.reshape(1, 16)
    grad = torch.where(hot, -1.0, 0.0) * torch.where(keep, g, 0.0)
    return grad - logp.exp() * grad.sum(1, keepdim=True)


def test_cross_entropy_backwards_one_hot_is_made_in_its_row_group():
    """From the target itself: no bool mask of the logits' shape is the group's input (Inductor
    wrote one before the group, 131 MB at 4096 x 32000, for the group to read again)."""
    g = _graph(_one_hot_backward, torch.randn(8, 16), torch.arange(8), torch.tensor(0.5))
    (rows,) = [gr for gr in partition(g) if gr.kind == "reduction"]
    assert {"eq", "iota", "expand", "ne", "where", "sum"} <= set(_ops(rows))
    target = next(n for n in g.nodes if n.op == "placeholder" and n.meta["val"].dtype == torch.int64)
    assert all(u in rows.nodes for u in target.users)
    eq = next(n for n in g.nodes if n.target is torch.ops.aten.eq.Tensor)
    assert classify(eq).kind == "index" and index_use(eq, eq.args[0]) == "column"
    # compared with another integer tensor rather than a column index, it is no index work
    g = _graph(lambda x, t, u: torch.where(t.unsqueeze(1) == u, -1.0, 0.0).sum(1) + x.sum(1),
               torch.randn(8, 16), torch.arange(8), torch.arange(16).reshape(1, 16))
    eq = next(n for n in g.nodes if n.target is torch.ops.aten.eq.Tensor)
    assert classify(eq).kind is None and all(eq not in gr.nodes for gr in partition(g))


def test_integer_compares_join_no_group_without_a_gather():
    """A compare of integers is claimed ("index") only to make a gather's index and masks beside
    it: a mask of token ids that scales a softmax stays outside, its bool result the group's input."""
    g = _graph(lambda x, ids: x.softmax(-1) * (ids != 0).unsqueeze(-1), torch.randn(8, 16), torch.arange(8))
    ne = next(n for n in g.nodes if n.target is torch.ops.aten.ne.Scalar)
    assert classify(ne).kind == "index"
    assert all(ne not in gr.nodes for gr in partition(g))
    # an integer where whose result goes on to other work than a gather's index is claimed by no group
    g = _graph(lambda x, t: x.log_softmax(-1).gather(1, torch.where(t > 0, t, 0)) + torch.where(t > 0, t, 0).float(),
               torch.randn(8, 16), torch.ones(8, 1, dtype=torch.int64))
    wheres = [n for n in g.nodes if n.target is torch.ops.aten.where.self]
    kinds = [(classify(w).kind, any(u.target is torch.ops.aten.gather.default for u in w.users)) for w in wheres]
    assert sorted(kinds, key=str) == [("index", True), (None, False)]
