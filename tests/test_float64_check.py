"""The float64 accuracy check's parts, on the CPU: the float64 evaluation ignores the program's
own roundings, the error measure, and the bar a candidate must meet."""
import math

import torch

from agent_backend.env import float64


class RoundsToBf16(torch.nn.Module):
    def forward(self, x):
        return torch.ops.prims.convert_element_type.default(x * 3.0, torch.bfloat16)


def test_float64_evaluation_does_not_round_where_the_program_does():
    x = torch.randn(1000, dtype=torch.bfloat16)
    (exact,) = float64.evaluate(RoundsToBf16(), [x])
    assert exact.dtype == torch.float64
    assert torch.equal(exact, x.double() * 3.0)
    # The program's own bf16 result is off by about bf16's rounding, and the check sees it.
    err = float64.relative_error(RoundsToBf16()(x), exact)
    assert 1e-4 < err < float64.unit_roundoff(torch.bfloat16)


def test_relative_error_skips_non_finite_reference_values_and_flags_nan():
    exact = torch.tensor([1.0, -math.inf, 2.0], dtype=torch.float64)
    assert float64.relative_error(torch.tensor([1.0, -math.inf, 2.0]), exact) == 0.0
    assert float64.relative_error(torch.tensor([1.0, 0.0, float("nan")]), exact) == math.inf
    assert float64.relative_error(torch.tensor([True]), torch.tensor([True])) == 0.0


def test_the_bar_is_twice_the_reference_and_never_below_the_dtypes_rounding():
    assert float64.accuracy_problem(0, 1.9e-6, 1e-6, torch.float32) is None
    problem = float64.accuracy_problem(1, 2.1e-6, 1e-6, torch.float32)
    assert problem and problem.startswith("output 1 is less accurate than the reference")
    # An exact reference does not make every rounding a failure: fp32 rounding is allowed.
    assert float64.accuracy_problem(0, 1e-7, 0.0, torch.float32) is None
    assert float64.accuracy_problem(0, 1e-4, 0.0, torch.float32) is not None


def test_fp32_outputs_may_differ_by_a_few_fp32_roundings_and_no_more():
    u = float64.unit_roundoff(torch.float32)
    # A reference at 1.2 ulps, a kernel rounding in another order at 3 (seen on an H200).
    assert float64.accuracy_problem(0, 3.0 * u, 1.2 * u, torch.float32) is None
    assert float64.accuracy_problem(0, 2 * float64.FP32_ROUNDINGS * u * 1.01, 1.2 * u, torch.float32) is not None
    # TF32 or bf16 arithmetic in an fp32 task is far above that floor.
    assert float64.accuracy_problem(0, 1e-4, 1.2 * u, torch.float32) is not None
    # bf16 outputs: their own rounding sets the floor, as before; fp64 keeps fp64's.
    assert float64.accuracy_problem(0, 2.1 * float64.unit_roundoff(torch.bfloat16), 0.0, torch.bfloat16) is not None
    assert float64.accuracy_problem(0, 1e-12, 0.0, torch.float64) is not None
