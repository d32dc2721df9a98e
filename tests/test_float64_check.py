"""The float64 accuracy check's parts, on the CPU: the float64 evaluation ignores the program's
own roundings, the error measure, and the bar a candidate must meet; a task whose float64
evaluation does not fit in memory is verified without it."""
import math

import pytest
import torch

from agent_backend.env import compare, float64
from test_env_cases import AddRelu, cpu_verifier


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


def whole_tensor_relative_error(got, exact):
    """relative_error as it was before it worked in chunks."""
    if not exact.is_floating_point():
        return 0.0
    finite = torch.isfinite(exact)
    diff = torch.where(finite, got.to(torch.float64) - exact, torch.zeros_like(exact))
    norm = float(torch.where(finite, exact, torch.zeros_like(exact)).norm())
    err = float(diff.norm())
    if math.isnan(err):
        return math.inf
    return err / norm if norm > 0 else err


def _relative_error_cases():
    g = torch.Generator().manual_seed(0)
    exact = torch.randn(5, 9, generator=g, dtype=torch.float64) * 3  # 45 elements: 7 chunks of 7
    got = (exact + 1e-3 * torch.randn(5, 9, generator=g, dtype=torch.float64)).float()
    non_finite = exact.clone()
    non_finite.view(-1)[[6, 7, 30]] = torch.tensor([math.inf, -math.inf, math.nan], dtype=torch.float64)
    nan_in_a_later_chunk = got.clone()
    nan_in_a_later_chunk.view(-1)[40] = math.nan
    inf_where_finite = got.clone()
    inf_where_finite.view(-1)[20] = math.inf
    return {
        "fp32 against float64": (got, exact),
        "bf16 against float64": (exact.bfloat16(), exact),
        "non-finite reference values are skipped": (got, non_finite),
        "NaN in a later chunk": (nan_in_a_later_chunk, exact),
        "Inf where the reference is finite": (inf_where_finite, exact),
        "non-contiguous": (got.t(), exact.t()),
        "a zero reference": (got[:2], torch.zeros(2, 9, dtype=torch.float64)),
        "empty": (torch.zeros(0, 3), torch.zeros(0, 3, dtype=torch.float64)),
        "bool": (torch.tensor([True, False]), torch.tensor([True, True])),
    }


@pytest.mark.parametrize("case", list(_relative_error_cases()))
def test_chunked_relative_error_matches_the_whole_tensor_one(monkeypatch, case):
    monkeypatch.setattr(compare, "CHUNK_ELEMENTS", 7)  # small tensors span several chunks
    got, exact = _relative_error_cases()[case]
    expected = whole_tensor_relative_error(got, exact)
    assert float64.relative_error(got, exact) == pytest.approx(expected, rel=1e-12, abs=0.0)


class RunsOutOfMemoryInFloat64(torch.nn.Module):
    """relu(a + b), whose float64 evaluation does not fit (as a task that fills most of the GPU)."""

    def forward(self, a, b):
        if a.dtype == torch.float64:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 12.00 GiB.")
        return torch.relu(a + b)


def test_a_float64_evaluation_out_of_memory_leaves_the_check_out_and_the_candidate_judged():
    verifier = cpu_verifier(AddRelu(), RunsOutOfMemoryInFloat64())
    assert verifier.run() is None
    assert verifier.details()["float64_note"] == "the task evaluated in float64 does not fit in memory"
    assert verifier.details()["float64_err"] == 0.0
    # Values are still compared with the reference's.
    failure = cpu_verifier(AddRelu(shift=1.0), RunsOutOfMemoryInFloat64()).run()
    assert failure.status == "incorrect" and "elements differ" in failure.reason


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
