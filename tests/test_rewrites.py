"""Rewrite rules on the CPU: each fires on the structure it is for, computes what the task's own
program computes, and says why it does not fire on look-alikes (a non-linear op between a GEMM
and its sum, a sum over the wrong dim, a mask that is not filled with -inf)."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch._inductor.decomposition import select_decomp_table
from torch.fx.experimental.proxy_tensor import make_fx

from agent_backend import explain
from agent_backend.partition import partition
from agent_backend.task import extract_task, load_program
from skills import rewrites


def tasks_of(fn, *inputs):
    """The tasks the backend would make of `fn`, traced to ATen as Inductor decomposes it."""
    gm = make_fx(fn, decomposition_table=select_decomp_table(), tracing_mode="fake")(*inputs)
    gm.graph.eliminate_dead_code()
    return [extract_task(g) for g in partition(gm.graph) if g.op_count() >= 2]


def only_task(fn, *inputs):
    (task,) = tasks_of(fn, *inputs)
    return task


def why_not(task, rule: str) -> str | None:
    return dict(rewrites.explain(task))[rule]


def assert_same_function(task, candidate, tol=1e-4, make_inputs=None):
    """The candidate computes the task's outputs on fresh inputs (`make_inputs()`, by default
    the task's own get_inputs), as fresh tensors."""
    program = load_program(task.program)
    namespace: dict = {}
    exec(candidate.source, namespace)
    model, new = program["Model"](), namespace["ModelNew"]()
    for _ in range(2):
        inputs = (make_inputs or program["get_inputs"])()
        expected, got = model(*inputs), new(*inputs)
        expected = expected if isinstance(expected, tuple) else (expected,)
        got = got if isinstance(got, tuple) else (got,)
        for e, g in zip(expected, got):
            assert g.dtype == e.dtype and g.shape == e.shape
            assert all(g.untyped_storage().data_ptr() != i.untyped_storage().data_ptr() for i in inputs)
            torch.testing.assert_close(g, e, atol=tol * max(1.0, float(e.float().abs().max())), rtol=tol)


def _linear_sum(x, w, b):
    return (F.linear(x, w, b) * 2.0).sum(dim=-1, keepdim=True)


@pytest.mark.parametrize("fn, shapes", [
    (_linear_sum, [(3, 5, 32), (64, 32), (64,)]),
    (lambda x, w: (x @ w).mean(dim=1), [(16, 32), (32, 48)]),
    (lambda x, w: torch.bmm(x, w).sum(-1) / 4.0, [(2, 8, 16), (2, 16, 24)]),
], ids=["linear-scale-sum", "mm-mean", "bmm-sum-div"])
def test_gemm_reduce_becomes_a_gemv_with_the_same_result(fn, shapes):
    task = only_task(fn, *[torch.randn(s) for s in shapes])
    assert task.kind == "matmul" and why_not(task, "gemm_reduce") is None
    (candidate,) = rewrites.propose(task)
    assert candidate.origin == "builtin:rewrite:gemm_reduce"
    assert "aten.sum.dim_IntList(in" in candidate.source  # the weight is summed first...
    assert candidate.source.count("aten.mm.default") + candidate.source.count("aten.bmm.default") == 1
    assert_same_function(task, candidate)


@pytest.mark.parametrize("fn, shapes", [
    (lambda x, w: (x @ w).sum(-1), [(16, 32), (32, 48)]),
    (lambda x, w, b: F.linear(x, w, b).mean(-1), [(3, 5, 32), (48, 32), (48,)]),
    (lambda x, w: torch.bmm(x, w).sum(-1, keepdim=True), [(2, 8, 16), (2, 16, 24)]),
], ids=["mm-sum", "linear-bias-mean", "bmm-sum"])
def test_gemm_reduce_in_bf16_sums_in_fp32_and_rounds_once(fn, shapes):
    task = only_task(fn, *[torch.randn(s, dtype=torch.bfloat16) for s in shapes])
    (candidate,) = rewrites.propose(task)
    assert "dtype=torch.float32" in candidate.source and "torch.bfloat16" in candidate.source
    # conversions are written as aten._to_copy: prims' eager path costs hundreds of us per call
    assert "aten._to_copy.default" in candidate.source and "convert_element_type" not in candidate.source
    # the GEMV as a product and a sum over k (one reduction for Inductor): x is not copied to fp32
    assert "mm.default" not in candidate.source and candidate.source.count("aten._to_copy.default") == 1
    assert_same_function(task, candidate, tol=2e-2)


@pytest.mark.parametrize("fn, reason", [
    (lambda x, w: torch.relu(x @ w).sum(-1), "not linear"),
    (lambda x, w: (x @ w).sum(0), "does not reduce over the product's last dim"),
    (lambda x, w: (x @ w).amax(-1), "no matrix product"),
], ids=["relu-between", "sum-over-rows", "max-is-not-linear"])
def test_gemm_reduce_does_not_fire_on_look_alikes(fn, reason):
    for task in tasks_of(fn, torch.randn(16, 32), torch.randn(32, 48)):
        why = why_not(task, "gemm_reduce")
        assert why is not None and reason in why, why
        assert all(c.origin != "builtin:rewrite:gemm_reduce" for c in rewrites.propose(task))


def _causal_attention(q, k, v, bias):
    att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
    att = att.masked_fill(bias == 0, float("-inf"))
    return torch.softmax(att, dim=-1) @ v


def _plain_attention(q, k, v):
    return torch.softmax(q @ k.transpose(-2, -1) / 8.0, dim=-1) @ v


def _additive_mask_attention(q, k, v, mask):
    return torch.softmax(q @ k.transpose(-2, -1) + mask, dim=-1) @ v


QKV = [(2, 4, 16, 8)] * 3


def test_causal_attention_from_inductors_own_graph_becomes_one_fused_call():
    """Through the real compile: there masked_fill's -inf is a constant written into the task."""
    class Causal(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("bias", torch.tril(torch.ones(16, 16)).view(1, 1, 16, 16))

        def forward(self, q, k, v):
            return _causal_attention(q, k, v, self.bias)

    with torch.no_grad():
        (task,) = explain.tasks_of(explain.trace_tasks(Causal(), [torch.randn(s) for s in QKV], backward=False))
    assert task.kind == "attention" and why_not(task, "attention") is None
    assert "aten.full.default([], float(\"-inf\")" in task.program
    (candidate,) = rewrites.propose(task)
    assert "scaled_dot_product_attention" in candidate.source and "logical_not" in candidate.source
    assert_same_function(task, candidate)


@pytest.mark.parametrize("fn, extra", [
    (_plain_attention, []),
    (_additive_mask_attention, [torch.randn(1, 1, 16, 16)]),
], ids=["no-mask", "additive-mask"])
def test_attention_becomes_one_fused_call(fn, extra):
    task = only_task(fn, *[torch.randn(s) for s in QKV], *extra)
    assert task.kind == "attention" and why_not(task, "attention") is None
    (candidate,) = rewrites.propose(task)
    assert "scaled_dot_product_attention" in candidate.source and "bmm" not in candidate.source
    assert_same_function(task, candidate)


class MathPathAttention(torch.nn.Module):
    """scaled_dot_product_attention with a padding mask, as a compiled graph holds it where no
    fused kernel was chosen at trace time (BERT's on the GPU): torch's math path."""

    def forward(self, q, k, v, keep):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=keep)


def _math_path_task(dtype):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    q, k, v = (torch.randn(s, dtype=dtype) for s in QKV)
    with torch.no_grad(), sdpa_kernel([SDPBackend.MATH]):
        (task,) = explain.tasks_of(explain.trace_tasks(MathPathAttention(), [q, k, v, torch.ones(2, 1, 16, 1) > 0],
                                                       backward=False))
    return task


def _padding_inputs(task, dead_rows: int):
    """The task's inputs with the boolean mask keeping every key for all but `dead_rows` query rows."""
    def make():
        inputs = load_program(task.program)["get_inputs"]()
        keep = next(i for i in inputs if i.dtype == torch.bool)
        keep.fill_(True)
        keep[0, 0, :dead_rows] = False
        return inputs
    return make


def test_torchs_math_path_of_attention_becomes_one_fused_call_in_half_precision():
    """bf16: q and k each scaled by sqrt(scale), everything cast up to float32 and the result
    back down, a safe softmax: one call in bf16 with the scale folded, rows with no key zero."""
    task = _math_path_task(torch.bfloat16)
    assert task.kind == "attention" and "aten.any.dim" in task.ops and why_not(task, "attention") is None
    assert "aten.full.default([2, 4, 16, 16], 0" in task.program  # the safe softmax's zeros: no input
    (candidate,) = rewrites.propose(task)
    body = candidate.source.split("def forward")[1]
    assert "scaled_dot_product_attention" in body and "bmm" not in body and "float32" not in body
    assert "scale=0.35355339059327" in body and "masked_fill" in body
    assert_same_function(task, candidate, tol=2e-2, make_inputs=_padding_inputs(task, dead_rows=5))
    namespace: dict = {}
    exec(candidate.source, namespace)
    out = namespace["ModelNew"]()(*_padding_inputs(task, dead_rows=5)())
    assert out.dtype == torch.bfloat16 and bool((out[0, :, :5] == 0).all()) and bool(out[0, :, 5:].abs().sum() > 0)


def test_torchs_math_path_of_attention_in_float32_is_rewritten_as_it_is():
    task = _math_path_task(torch.float32)
    (candidate,) = rewrites.propose(task)
    assert "scaled_dot_product_attention" in candidate.source and "bmm" not in candidate.source
    assert_same_function(task, candidate, make_inputs=_padding_inputs(task, dead_rows=3))


def test_attention_that_stays_in_float32_is_not_cast_down():
    """Inputs cast up from bf16 but a float32 result: the rule calls the fused kernel in float32."""
    def upcast(q, k, v):
        return torch.softmax(q.float() @ k.float().transpose(-2, -1) / 8.0, dim=-1) @ v.float()
    task = only_task(upcast, *[torch.randn(s, dtype=torch.bfloat16) for s in QKV])
    (candidate,) = rewrites.propose(task)
    assert "scaled_dot_product_attention" in candidate.source and "torch.float32" in candidate.source
    assert_same_function(task, candidate)


def test_attention_with_a_mask_not_filled_with_minus_inf_is_left_alone():
    def zero_fill(q, k, v, bias):
        att = (q @ k.transpose(-2, -1)).masked_fill(bias == 0, 0.0)
        return torch.softmax(att, dim=-1) @ v
    task = only_task(zero_fill, *[torch.randn(s) for s in QKV], torch.ones(1, 1, 16, 16))
    assert "no softmax" in why_not(task, "attention")
    assert rewrites.propose(task) == []


def test_attention_whose_weights_are_also_returned_is_left_alone():
    def weights_too(q, k, v):
        p = torch.softmax(q @ k.transpose(-2, -1), dim=-1)
        return p @ v, p
    for task in tasks_of(weights_too, *[torch.randn(s) for s in QKV]):
        assert all("scaled_dot_product_attention" not in c.source for c in rewrites.propose(task))


def test_reductions_over_size_one_dims_fold_and_compose_with_gemm_reduce():
    def gemm_sum_max(x, w):  # the max and logsumexp reduce a dim that the sum left at size 1
        s = (x @ w).sum(dim=1, keepdim=True)
        return torch.logsumexp(s.amax(dim=1, keepdim=True), dim=1, keepdim=True)
    task = only_task(gemm_sum_max, torch.randn(16, 32), torch.randn(32, 48))
    assert why_not(task, "gemm_reduce") is None and why_not(task, "trivial_reductions") is None
    candidates = rewrites.propose(task)
    assert [c.origin for c in candidates] == ["builtin:rewrite:gemm_reduce+trivial_reductions",
                                              "builtin:rewrite:gemm_reduce", "builtin:rewrite:trivial_reductions"]
    assert "amax" not in candidates[0].source
    for candidate in candidates:
        assert_same_function(task, candidate)


def test_a_sum_over_a_dim_of_size_two_is_not_trivial():
    task = only_task(lambda x: (x * 2.0).sum(1) + 1.0, torch.randn(8, 2))
    assert "no reduction over size-1 dims only" in why_not(task, "trivial_reductions")


def test_an_output_equal_to_an_input_after_folding_is_cloned():
    task = only_task(lambda x: (x.sum(1, keepdim=True) * 1.0).amax(1), torch.randn(8, 1))
    (candidate,) = rewrites.propose(task)
    assert_same_function(task, candidate)


def _gelu_new(x):  # GPT-2's hand-written tanh-GELU
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


@pytest.mark.parametrize("fn, shapes, dtype, call", [
    (lambda x, w, b: _gelu_new(torch.addmm(b, x.view(-1, 32), w)).view(2, 8, 48), [(2, 8, 32), (32, 48), (48,)],
     torch.float32, "use_gelu=True"),
    (lambda x, w, b: F.gelu(F.linear(x, w, b), approximate="tanh"), [(16, 32), (48, 32), (48,)], torch.bfloat16,
     "use_gelu=True"),
    (lambda x, w, b: torch.relu(F.linear(x, w, b)), [(2, 8, 32), (48, 32), (48,)], torch.float32, "use_gelu=False"),
    (lambda x, w: (x @ w) * 0.5 * 2.0 / 3.0, [(16, 32), (32, 48)], torch.float32, "alpha=0.333"),
], ids=["gpt2-gelu-new", "gelu-tanh-bf16", "linear-3d-relu", "scale-chain"])
def test_gemm_epilogue_becomes_one_call(fn, shapes, dtype, call):
    task = only_task(fn, *[torch.randn(s, dtype=dtype) for s in shapes])
    assert task.kind == "matmul" and why_not(task, "gemm_epilogue") is None
    (candidate,) = rewrites.propose(task)
    assert candidate.origin == "builtin:rewrite:gemm_epilogue" and call in candidate.source
    assert "tanh" not in candidate.source and "relu" not in candidate.source and "mul" not in candidate.source
    assert_same_function(task, candidate, tol=2e-2 if dtype == torch.bfloat16 else 1e-4)


def test_gemm_epilogue_keeps_what_follows_the_activation():
    task = only_task(lambda x, w, r: torch.relu(x @ w) + r, torch.randn(16, 32), torch.randn(32, 48), torch.randn(16, 48))
    (candidate,) = rewrites.propose(task)
    assert "_addmm_activation" in candidate.source and "aten.add.Tensor" in candidate.source
    assert_same_function(task, candidate)


@pytest.mark.parametrize("fn, reason", [
    (lambda x, w, b: F.gelu(F.linear(x, w, b)), "no relu, tanh-GELU or constant scale"),  # erf-GELU: not the same
    (lambda x, w, b: (lambda y: (torch.relu(y), y))(F.linear(x, w, b)), "no relu, tanh-GELU or constant scale"),
    (lambda x, w, b: torch.sigmoid(F.linear(x, w, b)), "no relu, tanh-GELU or constant scale"),
], ids=["erf-gelu", "product-also-returned", "sigmoid"])
def test_gemm_epilogue_does_not_fire_on_look_alikes(fn, reason):
    for task in tasks_of(fn, torch.randn(16, 32), torch.randn(48, 32), torch.randn(48)):
        why = why_not(task, "gemm_epilogue")
        assert why is not None and reason in why, why


def _bn_inputs(task):
    """The task's inputs with every 1-D one (running statistics, affine weights) drawn in
    [0.5, 2): random normal running variances would make half the channels NaN."""
    program = load_program(task.program)
    return lambda: [t.uniform_(0.5, 2.0) if t.dim() == 1 else t for t in program["get_inputs"]()]


def _conv_bn(relu: bool, bias: bool = True, dtype=torch.float32):
    layers = [torch.nn.Conv2d(8, 16, 3, padding=1, bias=bias), torch.nn.BatchNorm2d(16)] + ([torch.nn.ReLU()] if relu else [])
    return torch.nn.Sequential(*layers).to(dtype).eval(), [torch.randn(2, 8, 16, 16, dtype=dtype)]


@pytest.mark.parametrize("make, tol", [
    (lambda: _conv_bn(relu=True), 1e-4),
    (lambda: _conv_bn(relu=False, bias=False), 1e-4),
    (lambda: _conv_bn(relu=True, dtype=torch.bfloat16), 2e-2),
    (lambda: (torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.BatchNorm1d(64)).eval(), [torch.randn(8, 32)]), 1e-4),
], ids=["conv-bn-relu", "conv-no-bias-bn", "conv-bn-relu-bf16", "linear-bn1d"])
def test_inference_batchnorm_folds_into_the_weights(make, tol):
    model, inputs = make()
    with torch.no_grad():
        (task,) = explain.tasks_of(explain.trace_tasks(model, inputs, backward=False))
    assert why_not(task, "affine_fold") is None
    candidates = [c for c in rewrites.propose(task) if "affine_fold" in c.origin]
    (candidate,) = candidates
    body = candidate.source.split("def forward")[1]
    assert "sqrt" in body and ("convolution" in body or "addmm" in body)
    assert body.index("sqrt") < body.index("convolution" if "convolution" in body else "addmm")  # weights first
    assert_same_function(task, candidate, tol=tol, make_inputs=_bn_inputs(task))


@pytest.mark.parametrize("fn, shapes, reason", [
    (lambda x, w, s: torch.nn.functional.conv2d(x, w) * s, [(2, 8, 8, 8), (16, 8, 3, 3), (1, 16, 6, 6)],
     "no per-channel affine op"),  # a scale per position, not per channel
    (lambda x, w, s: torch.relu(torch.nn.functional.conv2d(x, w)) * s, [(2, 8, 8, 8), (16, 8, 3, 3), (16, 1, 1)],
     "no per-channel affine op"),  # the ReLU comes first: nothing affine follows the product itself
], ids=["spatial-scale", "relu-first"])
def test_affine_fold_does_not_fire_on_look_alikes(fn, shapes, reason):
    task = only_task(fn, *[torch.randn(s) for s in shapes])
    why = why_not(task, "affine_fold")
    assert why is not None and reason in why, why
