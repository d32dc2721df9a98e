"""The fast forms' own source (skills/pointwise/ops._FAST), each PTX instruction emulated by the
exact result it approximates (tests/cuda_emulation.emulated_fast), against the function it stands
for in float64, over the range where kernels call it. What the hardware's approximations add (an
ulp or two of ex2 and rcp) is test_pointwise_gpu's and test_rows_gpu's; this catches a wrong
constant or a flushed range that kernels' own checks, bounded by the output's scale, may not."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from cuda_emulation import compiler, evaluate_fast

pytestmark = pytest.mark.skipif(compiler() is None, reason="needs a C++ compiler")

# Below 2^-126 a form may flush (.ftz) or keep fewer bits (an fp32 subnormal): there only the
# difference is bounded. Where x times such a value is (SiLU past exp's overflow, as eager's own
# x / (1 + exp(-x)) in fp32; the GELU's flushed reciprocal), up to 2^-120. Above it, a few fp32
# roundings of an exponent up to about 200 in log2 units (x log2(e), the constants' own) make up
# to about 2e-5 relative.
TINY, TIMES_TINY, RELATIVE = 2.0 ** -126, 2.0 ** -120, 5e-5
C, K = math.sqrt(2 / math.pi), 0.044715
A = -2 * C * math.log2(math.e)  # rows plan._gelu_tanh's constants


def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    """A tanh GELU in float64 (test_rows_emulated's too)."""
    return x * torch.sigmoid(2 * C * (x + K * x ** 3))  # 0.5 x (1 + tanh(z)) without its cancellation


FORMS = {
    "pw_exp_fast(x)": (torch.exp, -100.0, 88.0, TINY),
    "pw_exp_fast_ftz(x)": (torch.exp, -100.0, 88.0, TINY),
    "pw_exp_fast_nonpositive(x)": (torch.exp, -140.0, 0.0, TINY),
    "pw_exp_fast_bounded(x)": (torch.exp, -140.0, 66.0, TINY),
    "pw_sigmoid_fast(x)": (torch.sigmoid, -100.0, 100.0, TINY),
    "pw_silu_fast(x)": (F.silu, -100.0, 100.0, TIMES_TINY),
    "pw_one_plus_tanh_fast(x)": (lambda z: 2 * torch.sigmoid(2 * z), -60.0, 60.0, TINY),
    f"pw_gelu_tanh_fast(x, {A!r}f, {A * K!r}f)": (gelu_tanh, -40.0, 40.0, TIMES_TINY),
    "pw_div_fast(x, 3.0f)": (lambda x: x / 3, -1e3, 1e3, TINY),
}


@pytest.fixture(scope="module")
def evaluated(tmp_path_factory) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Per form: (its inputs, its emulated results), all forms built in one program."""
    steps = torch.linspace(0, 1, 40001, dtype=torch.float64)
    inputs = {form: (lo + (hi - lo) * steps).float() for form, (_, lo, hi, _) in FORMS.items()}
    xs = torch.cat(list(inputs.values()))
    results = evaluate_fast(list(FORMS), xs, tmp_path_factory.mktemp("fast"))
    return {form: (x, y[i * steps.numel():(i + 1) * steps.numel()]) for i, (form, x, y) in
            enumerate(zip(FORMS, inputs.values(), results))}


@pytest.mark.parametrize("form", FORMS)
def test_each_fast_form_computes_its_function(form, evaluated):
    x, got = evaluated[form]
    function, _, _, small = FORMS[form]
    exact = function(x.double())
    error = (got.double() - exact).abs()
    normal = exact.abs() >= small
    assert bool(torch.isfinite(got).all())
    assert bool((error[normal] <= RELATIVE * exact.abs()[normal]).all()), float((error / exact.abs())[normal].max())
    assert bool((error[~normal] <= small).all())


def test_a_constant_a_tenth_of_a_percent_off_is_found():
    """The bound is tight enough for what it is for: a GELU whose exponent's constant is off by
    0.1% misses it (the kernels' checks, relative to the output's scale, pass one 5% off)."""
    x = torch.linspace(-40, 40, 40001, dtype=torch.float64)
    exact, off = gelu_tanh(x), x * torch.sigmoid(2 * C * 1.001 * (x + K * x ** 3))
    normal = exact.abs() >= TIMES_TINY
    assert bool(((off - exact).abs()[normal] > RELATIVE * exact.abs()[normal]).any())
