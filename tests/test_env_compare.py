"""In-process tests of the verifier's pieces that need no worker: comparisons, tolerances,
memory overlap, global switches, the patch check, poisoned allocations, result types."""
from __future__ import annotations

import subprocess
import sys
import time

import pytest
import torch

from agent_backend.env import Evaluation, compare
from agent_backend.env.compare import (ValueCheck, bitwise_equal, compare_values, differing_elements, layout_problem,
                                       overlapping_pairs, share_memory, tolerance)
from agent_backend.env.guards import GlobalSwitches, PatchFingerprint, PoisonedAllocations, precision_context
from agent_backend.env.results import precision_settings
from agent_backend.env.verify import TorchOpRecorder, blank_like, structure_failure


def test_within_tolerance_passes_and_reports_errors():
    expected = torch.linspace(-1, 1, 100)
    check = compare_values(0, expected + 5e-5, expected, 1e-4)
    assert check.problem is None
    assert 4e-5 < check.max_abs_err < 6e-5


def test_mismatch_names_count_worst_index_and_values():
    expected = torch.zeros(4, 8)
    got = expected.clone()
    got[3, 5] = 0.31
    got[1, 1] = 0.2
    problem = compare_values(0, got, expected, 1e-4).problem
    assert problem.startswith("output 0: 2 of 32 elements differ, max abs err 0.31 at index (3, 5): got 0.31, expected 0")


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_never_passes_where_reference_is_finite(bad):
    expected = torch.ones(10)
    got = expected.clone()
    got[7] = bad
    assert "at index (7,)" in compare_values(0, got, expected, 1e-2).problem


def test_non_finite_reference_requires_the_same_value():
    expected = torch.tensor([float("nan"), float("inf"), -float("inf"), 1.0])
    assert compare_values(0, expected.clone(), expected, 1e-4).problem is None
    swapped = torch.tensor([float("nan"), -float("inf"), -float("inf"), 1.0])
    assert "index (1,)" in compare_values(0, swapped, expected, 1e-4).problem
    finite = torch.tensor([0.0, float("inf"), -float("inf"), 1.0])
    assert "index (0,)" in compare_values(0, finite, expected, 1e-4).problem


def test_bool_outputs_compare_exactly():
    expected = torch.tensor([True, False, True])
    assert compare_values(0, expected.clone(), expected, 0.0).problem is None
    assert "1 of 3 elements differ at index (1,): got True, expected False" in \
        compare_values(0, torch.tensor([True, True, True]), expected, 0.0).problem


def whole_tensor_compare(index, got, expected, tol):
    """compare_values as it was before it worked in chunks: every temporary of the whole tensor."""
    numel = expected.numel()
    if expected.dtype == torch.bool:
        bad = got != expected
        err = bad.to(torch.float64)
        max_abs = max_rel = float(err.max()) if numel else 0.0
    else:
        a, b = got.to(torch.float64), expected.to(torch.float64)
        err = (a - b).abs()
        both_finite = torch.isfinite(a) & torch.isfinite(b)
        finite = b[torch.isfinite(b)]
        scale = max(1.0, float(finite.square().mean().sqrt())) if finite.numel() else 1.0
        within = both_finite & (err <= tol * scale + tol * b.abs())
        same_non_finite = ~torch.isfinite(b) & ((torch.isnan(a) & torch.isnan(b)) | (a == b))
        bad = ~(within | same_non_finite)
        max_abs = float(torch.where(both_finite, err, torch.zeros_like(err)).max()) if numel else 0.0
        large = both_finite & (b.abs() >= max(tol, 1e-12))
        max_rel = float(torch.where(large, err / b.abs(), torch.zeros_like(err)).max()) if numel else 0.0
    n_bad = int(bad.sum())
    if n_bad == 0:
        return ValueCheck(None, max_abs, max_rel)
    score = torch.where(bad, err.nan_to_num(nan=float("inf")), torch.full_like(err, -1.0))
    flat = int(score.reshape(-1).argmax())
    where = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), expected.shape))
    g, e = got.reshape(-1)[flat].item(), expected.reshape(-1)[flat].item()
    if expected.dtype == torch.bool:
        return ValueCheck(f"output {index}: {n_bad} of {numel} elements differ at index {where}: got {g}, expected {e}",
                          max_abs, max_rel)
    return ValueCheck(f"output {index}: {n_bad} of {numel} elements differ, max abs err "
                      f"{float(err.reshape(-1)[flat]):.6g} at index {where}: got {g:.6g}, expected {e:.6g} "
                      f"(rtol = {tol:g}, atol = {tol:g} x {scale:.3g}, the reference's scale)", max_abs, max_rel)


@pytest.fixture
def small_chunks(monkeypatch):
    """Chunks of 7 elements, so that small tensors span several and meet their boundaries."""
    monkeypatch.setattr(compare, "CHUNK_ELEMENTS", 7)


def _with(t: torch.Tensor, values: dict[int, float]) -> torch.Tensor:
    """A copy of `t` with these values at these flat indices."""
    t = t.clone()
    for i, v in values.items():
        t.view(-1)[i] = v
    return t


def _chunk_cases():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(5, 9, generator=g) * 3  # 45 elements: 7 chunks, the last one short
    nan, inf = float("nan"), float("inf")
    with_non_finite = _with(x, {6: nan, 7: inf, 30: -inf, 44: nan})
    mask = torch.rand(5, 9, generator=g) > 0.5
    return {
        "within tolerance": (x + 1e-5, x, 1e-4),
        "worst in a later chunk": (_with(x, {3: x.view(-1)[3] + 0.5, 40: x.view(-1)[40] - 0.9}), x, 1e-4),
        "ties: the first in flat order": (_with(torch.zeros(45), {2: 0.5, 30: 0.5, 31: -0.5}), torch.zeros(45), 1e-4),
        "non-finite beats finite": (_with(x, {3: x.view(-1)[3] + 9.0, 29: nan}), x, 1e-4),
        "NaN errors beat infinite ones": (_with(x, {15: inf, 29: nan, 43: -inf}), x, 1e-4),
        "first of two NaN errors": (_with(x, {12: nan, 40: nan}), x, 1e-4),
        "non-finite reference, matched": (with_non_finite.clone(), with_non_finite, 1e-4),
        "non-finite reference, missed": (_with(with_non_finite, {7: -inf, 44: 0.0, 20: 5.0}), with_non_finite, 1e-4),
        "all non-finite reference": (torch.full((3, 4), nan), torch.full((3, 4), inf), 1e-4),
        "non-contiguous": ((x + 0.01 * torch.randn(5, 9, generator=g)).t(), x.t(), 1e-3),
        "bf16 against float64": ((x + 0.02).bfloat16(), x.double(), 1e-2),
        "integers": (torch.arange(20).reshape(4, 5) % 3, torch.arange(20).reshape(4, 5) % 4, 0.0),
        "bool": (mask ^ _with(torch.zeros(45, dtype=torch.bool), {9: True, 33: True}).view(5, 9), mask, 0.0),
        "bool, equal": (mask.clone(), mask, 0.0),
        "bool, non-contiguous": (mask.t() ^ torch.eye(9, 5, dtype=torch.bool), mask.t(), 0.0),
        "zero-dim": (torch.tensor(2.0), torch.tensor(1.0), 1e-4),
        "empty": (torch.zeros(0, 3), torch.zeros(0, 3), 1e-4),
    }


@pytest.mark.parametrize("case", list(_chunk_cases()))
def test_chunked_comparison_matches_the_whole_tensor_one(small_chunks, case):
    got, expected, tol = _chunk_cases()[case]
    assert compare_values(3, got, expected, tol) == whole_tensor_compare(3, got, expected, tol)


def test_chunked_comparison_reports_the_worst_element_of_a_later_chunk(small_chunks):
    expected = torch.ones(4, 9)
    got = _with(expected, {1: 1.5, 34: 3.0})
    check = compare_values(0, got, expected, 1e-4)
    assert check.problem.startswith("output 0: 2 of 36 elements differ, max abs err 2 at index (3, 7): "
                                    "got 3, expected 1")
    assert check.max_abs_err == 2.0 and check.max_rel_err == 2.0


def test_tolerances_by_dtype_and_precision():
    strict = precision_settings(None)
    assert tolerance(torch.float32, strict) == 1e-4
    assert tolerance(torch.float16, strict) == tolerance(torch.bfloat16, strict) == 1e-2
    assert tolerance(torch.float64, strict) == 1e-7
    mm, conv, pointwise = ("aten.mm.default", "aten.relu.default"), ("aten.convolution.default",), ("aten.add.Tensor",)
    assert tolerance(torch.float32, {"allow_tf32": True}, mm) == 1e-2
    assert tolerance(torch.float32, {"matmul_precision": "high"}, mm) == 1e-2
    assert tolerance(torch.float16, {"allow_tf32": True}, mm) == 1e-2
    # Looser only where the task has an op the user's switch affects.
    assert tolerance(torch.float32, {"allow_tf32": True}, pointwise) == 1e-4
    assert tolerance(torch.float32, {"allow_tf32": True}, conv) == 1e-4
    assert tolerance(torch.float32, {"allow_cudnn_tf32": True}, conv) == 1e-2
    assert tolerance(torch.float32, {"allow_cudnn_tf32": True}, mm) == 1e-4


def test_precision_settings_are_checked():
    assert precision_settings({"allow_tf32": True})["matmul_precision"] == "highest"
    with pytest.raises(ValueError):
        precision_settings({"tf32": True})
    with pytest.raises(ValueError):
        precision_settings({"matmul_precision": "low"})


def test_layout_problems():
    a = torch.zeros(2, 3)
    assert "shape (3, 2), expected (2, 3)" in layout_problem(0, torch.zeros(3, 2), a)
    assert "dtype torch.float64, expected torch.float32" in layout_problem(0, a.double(), a)
    assert layout_problem(0, a.clone(), a) is None


def test_bitwise_comparison_sees_signed_zero_and_equal_nans():
    a = torch.tensor([0.0, float("nan")])
    assert bitwise_equal(a, a.clone())
    assert differing_elements(torch.tensor([-0.0, float("nan")]), a) == 1


def test_differing_elements_are_counted_over_chunks(small_chunks):
    """Across chunks of 7 (the last one short), through a transposed view, NaN equal to NaN."""
    a = torch.randn(5, 9).t()
    b = a.clone()
    b[0, 0], b[3, 4], b[8, 4] = -b[0, 0], float("nan"), b[8, 4] + 1
    assert differing_elements(a, b) == 3
    a[3, 4] = float("nan")
    assert differing_elements(a, b) == 2 and differing_elements(torch.empty(0), torch.empty(0)) == 0


def test_counting_differing_elements_takes_no_int64_copy_of_them():
    """A bool tensor's sum copies it to int64: counted whole, 2^27 bytes that differ took 1 GiB
    more (an input of 4096 x 393216 fp32 asked for 12 GiB after timing, on an H200). A fresh
    process's peak resident memory shows it."""
    code = ("import resource, torch\n"
            "from agent_backend.env.compare import differing_elements\n"
            "a = torch.zeros(2**27, dtype=torch.uint8); b = torch.ones(2**27, dtype=torch.uint8)\n"
            "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
            "assert differing_elements(a, b) == 2**27\n"
            "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before)\n")
    grown_kib = int(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)
    assert grown_kib < 512 * 1024


def test_memory_overlap():
    base = torch.zeros(10)
    view = base[2:4]
    assert share_memory(base, view)
    assert not share_memory(base, torch.zeros(10))
    assert overlapping_pairs([base, torch.zeros(3), view]) == {(0, 2)}


def test_outputs_must_be_plain_tensors():
    class Lazy(torch.Tensor):
        pass

    assert structure_failure([torch.zeros(1)], 1) is None
    assert structure_failure([torch.zeros(1).as_subclass(Lazy)], 1).status == "rejected"
    assert structure_failure([3], 1).status == "incorrect"
    assert "returned 2 outputs, expected 1" in structure_failure([torch.zeros(1)] * 2, 1).reason


def test_blank_inputs_keep_the_layout_and_hold_garbage():
    source = torch.randn(8, 6).t()
    blank = blank_like(source)
    assert blank.shape == source.shape and blank.stride() == source.stride()
    assert torch.isnan(blank).all()


def test_poisoned_allocations_fill_new_tensors_and_notice_tampering():
    with PoisonedAllocations() as poisoning:
        assert torch.isnan(torch.empty(5)).all()
        assert torch.isnan(torch.empty_like(torch.ones(3))).all()
    assert not poisoning.tampered
    assert not torch.are_deterministic_algorithms_enabled()
    with PoisonedAllocations() as poisoning:
        torch.utils.deterministic.fill_uninitialized_memory = False
    assert poisoning.tampered
    assert torch.utils.deterministic.fill_uninitialized_memory  # put back


def test_switches_are_seen_changed_and_restored():
    switches = GlobalSwitches("cpu")
    before = switches.snapshot()
    torch.set_float32_matmul_precision("medium")
    torch.backends.cuda.matmul.fp32_precision = "tf32"  # the new API: reading the legacy one now raises
    torch.set_default_dtype(torch.float64)
    try:
        changed = switches.changed(before)
        assert any(c.startswith("torch.get_float32_matmul_precision()") for c in changed)
        assert any(c.startswith("torch.get_default_dtype()") for c in changed)
        assert switches.restore(before)
    finally:
        torch.set_default_dtype(torch.float32)
    assert switches.changed(before) == []
    assert torch.get_float32_matmul_precision() == "highest"


def test_precision_context_applies_and_restores():
    switches = GlobalSwitches("cpu")
    cudnn_before = torch.backends.cudnn.allow_tf32
    with precision_context(switches, {"allow_tf32": True}):
        assert torch.backends.cuda.matmul.allow_tf32 and not torch.backends.cudnn.allow_tf32
    with precision_context(switches, {"allow_cudnn_tf32": True}):
        assert torch.backends.cudnn.allow_tf32 and not torch.backends.cuda.matmul.allow_tf32
    assert not torch.backends.cuda.matmul.allow_tf32
    assert torch.backends.cudnn.allow_tf32 == cudnn_before


def test_patch_fingerprint_sees_replaced_functions():
    fingerprint = PatchFingerprint()
    assert fingerprint.changed() == []
    original = time.perf_counter
    time.perf_counter = lambda: 0.0
    try:
        assert fingerprint.changed() == ["time.perf_counter"]
    finally:
        time.perf_counter = original
    torch.Tensor.clone = lambda self: self  # shadows TensorBase.clone
    try:
        assert fingerprint.changed() == ["torch.Tensor.clone"]
    finally:
        del torch.Tensor.clone
    assert fingerprint.changed() == []


def test_patch_fingerprint_sees_a_kernel_registered_for_the_ops_candidates_are_timed_through():
    fingerprint = PatchFingerprint()
    library = torch.library.Library("cuda_agent", "IMPL")
    library.impl("launch", lambda key, program, inputs: list(inputs), "XLA")  # a key nothing here uses
    try:
        assert fingerprint.changed() == ["the kernels of cuda_agent::launch"]
    finally:
        library._destroy()
    assert fingerprint.changed() == []


def test_torch_op_recorder_leaves_out_allocation_views_and_copies():
    x = torch.randn(4, 4)
    with TorchOpRecorder() as recorder:
        out = torch.empty_like(x)
        out.copy_(x.t().reshape(16).view(4, 4) @ x)
        torch.relu_(out)
    assert sorted(recorder.ops) == ["aten.mm.default", "aten.relu_.default"]


def test_evaluation_round_trips_through_json():
    ev = Evaluation("passed", verification={"trials": 6}, profile={"wins": True}, compile_s=0.1)
    assert Evaluation.from_json(ev.to_json()) == ev
    assert ev.wins
    with pytest.raises(ValueError):
        Evaluation("fine")


def test_a_launch_bound_candidate_is_judged_on_its_launch_time():
    from agent_backend.env.profile import counted_speedup
    inductor = {"median": 0.010, "host_median": 0.030}  # Inductor's host time is not ours to count
    assert counted_speedup({"median": 0.005, "host_median": 0.002}, inductor) == pytest.approx(2.0)
    assert counted_speedup({"median": 0.005, "host_median": 0.020}, inductor) == pytest.approx(0.5)
    assert counted_speedup({"median": 0.005, "host_median": 0.002}, None) is None


def _timings(flush: str, ms: list[float], host_ms: float = 0.001):
    from agent_backend.env.profile import Timing
    return [Timing(m, host_ms, 0.0, flush) for m in ms]


def test_calls_timed_after_two_flushes_are_summarized_apart_as_well():
    from agent_backend.env.profile import summarize
    stats = summarize(_timings("write", [1.0, 1.2, 1.1]) + _timings("read", [2.0, 2.2, 2.1, 2.3]), 0.0)
    assert stats["trials"] == 7 and stats["median"] == pytest.approx(2.0)
    assert stats["by_flush"]["write"]["median"] == pytest.approx(1.1) and stats["by_flush"]["write"]["trials"] == 3
    assert stats["by_flush"]["read"]["median"] == pytest.approx(2.15) and "by_flush" not in stats["by_flush"]["read"]
    assert "by_flush" not in summarize(_timings("write", [1.0, 2.0]), 0.0)


def test_a_candidate_is_judged_under_the_flush_less_favourable_to_it():
    """A kernel 1.10x Inductor after a write flush and 0.97x after a read one (as the skinny
    template's was) is judged at 0.97x: no win."""
    from agent_backend.env.profile import less_favourable_flush, summarize
    ours = summarize(_timings("write", [1.00] * 10) + _timings("read", [1.00] * 10), 0.0)
    inductor = summarize(_timings("write", [1.10] * 10) + _timings("read", [0.97] * 10), 0.0)
    judged, inductor_judged, flush = less_favourable_flush(ours, inductor)
    assert flush == "read" and inductor_judged["median"] / judged["median"] == pytest.approx(0.97)
    # host time counts as in the judgement: by GPU time alone the read flush is worse for this
    # launch-bound call (1.43x against 1.6x), by counted time the write flush (1.07x against 1.33x)
    launch_bound = summarize(_timings("write", [1.0] * 4, host_ms=1.5) + _timings("read", [1.4] * 4, host_ms=1.5), 0.0)
    inductor = summarize(_timings("write", [1.6] * 4) + _timings("read", [2.0] * 4), 0.0)
    assert less_favourable_flush(launch_bound, inductor)[2] == "write"
    one_way = summarize(_timings("write", [1.0, 1.0]), 0.0)
    assert less_favourable_flush(one_way, one_way) == (one_way, one_way, None)
