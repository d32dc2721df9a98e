"""Every candidate the pointwise template proposes computes what eager computes, on a GPU:
over the CASES of test_pointwise_template.py (dtypes, broadcasting, strided and expanded inputs,
tails, several and boolean outputs, NaN/inf), unaligned inputs, and a tensor large enough for
the grid-stride loop to go round."""
from __future__ import annotations

import pytest
import torch

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


def _assert_candidates_match_eager(fn, candidates, inputs):
    expected = fn(*inputs)
    expected = expected if isinstance(expected, tuple) else (expected,)
    for candidate in candidates:
        got = _run(candidate, inputs)
        assert len(got) == len(expected)
        for k, (g, e) in enumerate(zip(got, expected)):
            assert (g.dtype, g.shape, g.stride()) == (e.dtype, e.shape, e.stride()), f"{candidate.origin} output {k}"
            tol = TOLERANCE[e.dtype]
            torch.testing.assert_close(g, e, atol=tol, rtol=tol, equal_nan=True,
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
