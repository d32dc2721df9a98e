"""Every candidate the pointwise template proposes computes what eager computes, on a GPU:
over the CASES of test_pointwise_template.py (dtypes, broadcasting, strided, expanded and
transposed inputs, tails, several and boolean outputs, NaN/inf, exp-based ops in fp16/bf16),
unaligned inputs, a tensor large enough for the grid-stride loop to go round, every fp16 and
bf16 value through the fast exp-based forms, and a transposed input at benchmark size."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from agent_backend.env import float64
from agent_backend.specs import random_inputs
from skills.pointwise import propose
from test_pointwise_template import CASES, make_task

pytestmark = pytest.mark.gpu

TOLERANCE = {torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 1e-2, torch.float64: 1e-7, torch.bool: 0.0}


def _run(candidate, inputs):
    namespace = {}
    exec(compile(candidate.source, candidate.origin, "exec"), namespace)
    out = namespace["ModelNew"]()(*inputs)
    return out if isinstance(out, tuple) else (out,)


def _assert_candidates_match_eager(fn, candidates, inputs, tolerance=TOLERANCE, exact_where_not=True):
    """`tolerance`: dtype -> atol = rtol, or -> (atol, rtol). An fp16/bf16 element beyond it
    passes, where `exact_where_not`, if it is no further from the float64 evaluation than eager's
    or within one unit of that dtype's precision of it: eager rounds every op's result and the
    template, as Inductor, rounds a chain once, so where a chain cancels the two part."""
    expected = fn(*inputs)
    expected = expected if isinstance(expected, tuple) else (expected,)
    exact = float64.evaluate(fn, inputs) if exact_where_not else [None] * len(expected)
    for candidate in candidates:
        got = _run(candidate, inputs)
        assert len(got) == len(expected)
        for k, (g, e, x) in enumerate(zip(got, expected, exact)):
            assert (g.dtype, g.shape, g.stride()) == (e.dtype, e.shape, e.stride()), f"{candidate.origin} output {k}"
            tol = tolerance[e.dtype]
            atol, rtol = tol if isinstance(tol, tuple) else (tol, tol)
            close = torch.isclose(g, e, atol=atol, rtol=rtol, equal_nan=True)
            if x is not None and e.dtype in (torch.float16, torch.bfloat16):
                ours, eagers = (g.double() - x).abs(), (e.double() - x).abs()
                close |= ~torch.isfinite(x) | (ours <= torch.maximum(eagers, torch.finfo(e.dtype).eps * x.abs()))
            if not bool(close.all()):
                torch.testing.assert_close(g, e, atol=atol, rtol=rtol, equal_nan=True,
                                           msg=lambda m: f"{candidate.origin} output {k}: {m}")


@pytest.mark.parametrize("name", CASES)
def test_every_candidate_matches_eager(name):
    fn, make_inputs = CASES[name]
    inputs = make_inputs("cuda")
    task = make_task(fn, inputs)
    candidates = propose(task)
    assert candidates
    for seed in (0, 1):  # also the inputs a verifier draws for this signature
        _assert_candidates_match_eager(fn, candidates, inputs)
        inputs = random_inputs(task.inputs, seed, scale=2.0, device="cuda")


def test_unaligned_inputs_take_the_scalar_fallback():
    fn, make_inputs = CASES["scale_shift_relu_fp16_tail"]
    (x,) = make_inputs("cuda")
    candidates = propose(make_task(fn, [x]))
    shifted = torch.empty(x.numel() + 1, dtype=x.dtype, device="cuda")[1:].copy_(x)  # same signature, odd address
    assert candidates[0].params["vector_width"] > 1 and shifted.data_ptr() % 16
    _assert_candidates_match_eager(fn, candidates, [shifted])


def test_large_tensor_every_config():
    x, y = (torch.randn(2**25 + 3, dtype=torch.float16, device="cuda") for _ in range(2))
    fn = lambda x, y: torch.sigmoid(x) * y + 1  # noqa: E731
    candidates = propose(make_task(fn, [x, y]))
    assert any(c.params["waves"] for c in candidates)  # grids capped below the tensor: threads loop
    _assert_candidates_match_eager(fn, candidates, [x, y])


def test_inputs_outside_the_signature_are_refused():
    fn, make_inputs = CASES["bias_gelu_fp32_odd"]
    x, b = make_inputs("cuda")
    candidate = propose(make_task(fn, [x, b]))[0]
    namespace = {}
    exec(compile(candidate.source, candidate.origin, "exec"), namespace)
    with pytest.raises(ValueError, match="specialised"):
        namespace["ModelNew"]()(x.t().contiguous().t(), b)


# One unit in the last place (relative, and the smallest subnormal near zero): the fast fp32
# forms may move a result rounded once to fp16/bf16 by at most this much from eager's.
ONE_ULP = {torch.float16: (2.0**-24, 2.0**-10), torch.bfloat16: (2.0**-133, 2.0**-7)}


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_fast_exp_forms_over_every_half_value(dtype):
    x = torch.arange(-2**15, 2**15, dtype=torch.int32, device="cuda").to(torch.int16).view(dtype)
    fn = lambda x: (torch.sigmoid(x), F.silu(x), torch.exp(x), torch.tanh(x), torch.reciprocal(x))  # noqa: E731
    candidates = propose(make_task(fn, [x]))
    assert "pw_sigmoid_fast(x0)" in candidates[0].source and "pw_exp_fast(x0)" in candidates[0].source
    _assert_candidates_match_eager(fn, candidates, [x], ONE_ULP)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_steps_see_the_rounded_value_over_every_half_value(dtype):
    """Products kept unrounded in fp32 (ops.CONTINUOUS) are rounded before a floor, a compare
    and a narrowing conversion: bit for bit eager's, where x * 3 rounds across an integer."""
    x = torch.arange(-2**15, 2**15, dtype=torch.int32, device="cuda").to(torch.int16).view(dtype)
    other = torch.float16 if dtype == torch.bfloat16 else torch.bfloat16
    fn = lambda x: (torch.floor(x * 3), x * 3 > 1, (x * 3).to(other))  # noqa: E731
    candidates = propose(make_task(fn, [x]))
    assert "round_" in candidates[0].source
    _assert_candidates_match_eager(fn, candidates, [x], {torch.float16: 0.0, torch.bfloat16: 0.0, torch.bool: 0.0},
                                   exact_where_not=False)


def test_transposed_input_at_benchmark_size():
    x, y = (torch.randn(4096, 4096, device="cuda") for _ in range(2))
    fn = lambda x, y: torch.sigmoid(x + y) * 3  # noqa: E731
    candidates = propose(make_task(fn, [x.t(), y]))
    assert [c.origin.rsplit(":", 1)[1] for c in candidates if "tile" in c.params] == ["t32r8", "t32r4"]
    _assert_candidates_match_eager(fn, candidates, [x.t(), y])
