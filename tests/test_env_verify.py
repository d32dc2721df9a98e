"""Verification end to end on the CPU: CPU tasks, CPU candidates, one worker process shared by
the module. A correct candidate passes; each cheat that can be written for the CPU is refused
for the right reason; compile errors come back short."""
from __future__ import annotations

import pytest

from agent_backend.env.verify import VERIFICATION_PLAN
from agent_backend.specs import TensorSpec
from test_env_cases import (GOOD_ADD_RELU, add_relu_task, contiguous, make_candidate, make_task, module_environment,
                            sum_diff_task)

TASK = add_relu_task()
TWO_OUTPUTS = sum_diff_task()


env = module_environment("cpu", compile_s=30, verify_s=30, profile_s=120, start_s=120)


def evaluate(env, candidate, task=TASK):
    return env.evaluate(task, candidate, profile=False)


def test_correct_candidate_passes_and_its_torch_ops_are_recorded(env):
    ev = evaluate(env, GOOD_ADD_RELU)
    assert ev.status == "passed", ev.reason
    assert ev.verification["trials"] >= 5
    assert ev.verification["torch_ops"] == ["aten.add.Tensor", "aten.relu.default"]
    assert ev.verification["max_abs_err"] == 0.0
    assert ev.verification["atol"] == ev.verification["rtol"] == 1e-4
    # Computed as the reference computes it: exactly as accurate, measured against float64.
    assert 0 < ev.verification["float64_err"] == ev.verification["float64_ref_err"] < 1e-6
    assert ev.profile is None and not ev.worker_restarted and ev.compile_s is not None


def test_allocation_and_copies_are_not_counted_as_torch_ops(env):
    ev = evaluate(env, make_candidate("""
        out = torch.empty_like(a)
        out.copy_(torch.maximum(a + b, torch.zeros_like(a)))
        return out
    """))
    assert ev.status == "passed", ev.reason
    assert ev.verification["torch_ops"] == ["aten.add.Tensor", "aten.maximum.default"]


def test_other_output_strides_pass_and_are_recorded(env):
    ev = evaluate(env, make_candidate("return torch.relu(a + b).t().contiguous().t()"))
    assert ev.status == "passed", ev.reason
    assert ev.verification["stride_notes"] == ["output 0 has strides (1, 32), the reference (64, 1)"]


def test_two_output_candidate_passes(env):
    assert evaluate(env, make_candidate("return a + b, a - b"), TWO_OUTPUTS).status == "passed"


REFUSED = {
    "unwritten output": ("return torch.empty_like(a)", "incorrect", "got nan"),
    "partial output": ("""
        out = torch.empty_like(a)
        out[:16] = torch.relu(a[:16] + b[:16])
        return out
     """, "incorrect", "got nan"),
    "constant output": ("return torch.zeros(32, 64)", "incorrect", "elements differ"),
    "wrong values": ("return torch.relu(a + b) * 1.001", "incorrect", "output 0: "),
    # Within the elementwise tolerance (1e-4), but far less accurate than fp32 arithmetic.
    "less accurate": ("return torch.relu(a + b) * (1 + 3e-5)", "incorrect", "less accurate than the reference"),
    "wrong shape": ("return torch.relu(a + b).t()", "incorrect", "has shape (64, 32), expected (32, 64)"),
    "wrong dtype": ("return torch.relu(a + b).double()", "incorrect", "dtype torch.float64"),
    "wrong output count": ("return torch.relu(a + b), a", "incorrect", "returned 2 outputs, expected 1"),
    "not a tensor": ("return 3", "incorrect", "output 0 is a int"),
    "changes an input and returns it": ("return a.relu_().add_(b)", "rejected", "changed input 0"),
    "output aliases an input": ("return a", "rejected", "shares memory with input 0"),
    "output is a view of an input": ("return b.view(-1).view(32, 64)", "rejected", "shares memory with input 1"),
    "zeroes an input": ("""
        out = torch.relu(a + b)
        b.zero_()
        return out
     """, "rejected", "changed input 1"),
    "tensor subclass (lazy)": ("""
        class Lazy(torch.Tensor):
            pass
        return torch.relu(a + b).as_subclass(Lazy)
     """, "rejected", "subclass of torch.Tensor"),
    "raises": ("return a[100]", "runtime_error", "<candidate> line"),
}


@pytest.mark.parametrize("case", REFUSED, ids=list(REFUSED))
def test_broken_or_cheating_forward_is_refused(env, case):
    body, status, reason = REFUSED[case]
    ev = evaluate(env, make_candidate(body))
    assert (ev.status, reason in ev.reason) == (status, True), ev.reason


def test_result_cached_by_input_pointer_is_rejected(env):
    ev = evaluate(env, make_candidate("""
        key = (a.data_ptr(), b.data_ptr())
        if key not in self.cache:
            self.cache[key] = torch.relu(a + b)
        return self.cache[key].clone()
    """, init="self.cache = {}"))
    assert ev.status == "rejected" and "cached (by input pointer or shape)" in ev.reason, ev.reason


def test_input_addresses_repeat_only_where_a_trial_reuses_inputs_on_purpose(env):
    """Earlier trials' inputs are let go (a task of 6 GB tensors ran out of memory holding them
    all), yet no later trial's input lands where one of theirs was: this candidate answers wrong
    once it has seen an input address twice outside the one reusing trial."""
    ev = evaluate(env, make_candidate("""
        pointers = {a.data_ptr(), b.data_ptr()}
        self.repeats += bool(pointers & self.seen)
        self.seen |= pointers
        return torch.relu(a + b) + (self.repeats > 1)
    """, init="self.seen, self.repeats = set(), 0"))
    assert ev.status == "passed", ev.reason


def test_result_cached_by_shape_is_rejected(env):
    ev = evaluate(env, make_candidate("""
        if a.shape not in self.cache:
            self.cache[a.shape] = torch.relu(a + b)
        return self.cache[a.shape].clone()
    """, init="self.cache = {}"))
    assert ev.status == "rejected" and "cached" in ev.reason, ev.reason


def test_output_buffer_reused_across_calls_is_rejected(env):
    ev = evaluate(env, make_candidate("""
        torch.add(a, b, out=self.out)
        return self.out.relu_()
    """, init="self.out = torch.empty(32, 64)"))
    assert ev.status == "rejected" and "output returned by an earlier call" in ev.reason, ev.reason


def test_outputs_sharing_memory_are_rejected(env):
    ev = evaluate(env, make_candidate("""
        s = a + b
        return s, s
    """), TWO_OUTPUTS)
    assert ev.status == "rejected" and "outputs 0 and 1 share memory" in ev.reason, ev.reason


def test_work_left_in_a_thread_is_rejected(env):
    ev = evaluate(env, make_candidate("""
        out = torch.empty_like(a)
        def finish():
            time.sleep(0.2)
            torch.add(a, b, out=out).relu_()
        threading.Thread(target=finish, name="finisher").start()
        return out
    """, header="import threading, time"))
    assert ev.status == "rejected" and "left a thread running (finisher)" in ev.reason, ev.reason
    assert ev.worker_restarted
    assert evaluate(env, GOOD_ADD_RELU).status == "passed"


@pytest.mark.parametrize("flip, seen", [
    ("torch.backends.cuda.matmul.allow_tf32 = True", "torch.backends.cuda.matmul.allow_tf32: False -> True"),
    ("torch.set_float32_matmul_precision('medium')", "torch.get_float32_matmul_precision(): highest -> medium"),
    ("torch.backends.cuda.matmul.fp32_precision = 'tf32'", "fp32_precision(cuda, matmul): ieee -> tf32"),
    ("torch.backends.cudnn.allow_tf32 = True", "torch.backends.cudnn.allow_tf32: False -> True"),
    ("torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = True",
     "allow_bf16_reduced_precision_reduction: False -> True"),
    ("torch.set_default_dtype(torch.float64)", "torch.get_default_dtype(): torch.float32 -> torch.float64"),
    ("torch.set_num_threads(torch.get_num_threads() + 1)", "torch.get_num_threads()"),
    ("torch.use_deterministic_algorithms(True)", "torch.use_deterministic_algorithms"),
])
def test_flipping_a_global_switch_in_forward_is_rejected_and_undone(env, flip, seen):
    ev = evaluate(env, make_candidate(f"""
        {flip}
        return torch.relu(a + b)
    """))
    assert ev.status == "rejected" and seen in ev.reason, ev.reason
    assert not ev.worker_restarted  # put back, so the worker stays
    assert evaluate(env, GOOD_ADD_RELU).status == "passed"


def test_flipping_a_switch_at_import_is_rejected_at_load(env):
    ev = evaluate(env, make_candidate("return torch.relu(a + b)",
                                      header="torch.backends.cuda.matmul.allow_tf32 = True"))
    assert ev.status == "rejected" and "loading the candidate changed" in ev.reason, ev.reason
    assert "torch.backends.cuda.matmul.allow_tf32: False -> True" in ev.reason


def test_switching_off_output_poisoning_is_rejected(env):
    ev = evaluate(env, make_candidate("""
        torch.utils.deterministic.fill_uninitialized_memory = False
        return torch.relu(a + b)
    """))
    assert ev.status == "rejected" and "fill_uninitialized_memory" in ev.reason, ev.reason


@pytest.mark.parametrize("patch, name", [
    ("time.perf_counter = lambda: 0.0", "time.perf_counter"),
    ("torch.cuda.synchronize = lambda *args, **kwargs: None", "torch.cuda.synchronize"),
    ("torch.cuda.Event.elapsed_time = lambda self, end: 0.001", "torch.cuda.streams.Event.elapsed_time"),
])
def test_patching_a_timer_is_rejected_and_the_worker_replaced(env, patch, name):
    ev = evaluate(env, make_candidate("return torch.relu(a + b)", init=patch, header="import time"))
    assert ev.status == "rejected" and f"replaced {name}" in ev.reason, ev.reason
    assert ev.worker_restarted
    assert evaluate(env, GOOD_ADD_RELU).status == "passed"


COMPILE_ERRORS = {
    "syntax error": (make_candidate("return a +* b"), "SyntaxError"),
    "missing module": (make_candidate("return a + b", header="import no_such_module_here"),
                       "ModuleNotFoundError: No module named 'no_such_module_here'"),
    "raising __init__": (make_candidate("return a + b", init="raise ValueError('bad block size')"),
                         "in __init__: raise ValueError('bad block size')\nValueError: bad block size"),
    "no ModelNew": (make_candidate("return a + b").__class__("x = 1", "test"), "defines no class ModelNew"),
    "compiler error": (make_candidate("return a + b", header="""
        from agent_backend.env.compile_errors import CompileError
        raise CompileError('kernel.cu(3): error: identifier "x" is undefined')
     """), 'kernel.cu(3): error: identifier "x" is undefined'),
}


@pytest.mark.parametrize("case", COMPILE_ERRORS, ids=list(COMPILE_ERRORS))
def test_compile_errors_come_back_short(env, case):
    candidate, reason = COMPILE_ERRORS[case]
    ev = evaluate(env, candidate)
    assert ev.status == "compile_error" and reason in ev.reason, ev.reason
    assert len(ev.reason) < 1000 and ev.verification == {}
    if case == "compiler error":
        assert ev.reason == reason  # the compiler's text alone, no traceback


def test_an_input_expanded_over_a_dim_is_verified(env):
    """Regression: an input with a stride-0 dim (as backward graphs pass them) could not be
    written element by element, and every candidate failed with "more than one element of the
    written-to tensor refers to a single memory location"."""
    row, full = TensorSpec((32, 64), (0, 1), "float32", "cpu"), contiguous((32, 64), "float32", "cpu")
    task = make_task("expanded_input", "return aten.relu.default(aten.add.Tensor(in0, in1))", [row, full], [full],
                     "pointwise", ("aten.add.Tensor", "aten.relu.default"))
    ev = evaluate(env, GOOD_ADD_RELU, task)
    assert ev.status == "passed", ev.reason


# bf16 (a + 1000) - 1000: the reference rounds a + 1000 to a multiple of 8, float64 keeps a.
STRAYING = make_task("bf16_cancellation", "return aten.sub.Tensor(aten.add.Tensor(in0, 1000.0), 1000.0)",
                     [contiguous((32, 64), "bfloat16", "cpu")], [contiguous((32, 64), "bfloat16", "cpu")],
                     "pointwise", ("aten.add.Tensor", "aten.sub.Tensor"))


def test_a_candidate_closer_to_float64_than_a_straying_reference_passes(env):
    ev = evaluate(env, make_candidate("return a.clone()", args="a"), STRAYING)
    assert ev.status == "passed", ev.reason
    assert ev.verification["float64_err"] == 0.0 < ev.verification["float64_ref_err"]
    assert ev.verification["judged_by_float64"] and "elements differ" in ev.verification["judged_by_float64"][0]


def test_a_wrong_candidate_is_not_saved_by_a_straying_reference(env):
    ev = evaluate(env, make_candidate("return a * 1.5", args="a"), STRAYING)
    assert (ev.status, "elements differ" in ev.reason) == ("incorrect", True), ev.reason


SOFTMAX = make_task("softmax_rows", "return aten._softmax.default(in0, -1, False)",
                    [contiguous((32, 64), "float32", "cpu")], [contiguous((32, 64), "float32", "cpu")],
                    "softmax", ("aten._softmax.default",))
LOGSUMEXP = make_task("logsumexp_rows", "return aten.logsumexp.default(in0, [-1])",
                      [contiguous((32, 64), "float32", "cpu")], [contiguous((32,), "float32", "cpu")],
                      "reduction", ("aten.logsumexp.default",))


@pytest.mark.parametrize("task, body, status", [
    (SOFTMAX, "e = (a - a.amax(-1, keepdim=True)).exp()\nreturn e / e.sum(-1, keepdim=True)", "passed"),
    (SOFTMAX, "e = a.exp()\nreturn e / e.sum(-1, keepdim=True)", "incorrect"),
    (LOGSUMEXP, "m = a.amax(-1, keepdim=True)\nreturn ((a - m).exp().sum(-1, keepdim=True).log() + m).squeeze(-1)",
     "passed"),
    (LOGSUMEXP, "return a.exp().sum(-1).log()", "incorrect"),
], ids=["softmax", "softmax_without_its_max", "logsumexp", "logsumexp_without_its_max"])
def test_an_exp_not_taken_against_its_rows_max_is_refused_on_the_wide_input_set(env, task, body, status):
    """Exact on values within +-15 (every other input set), such a kernel overflows on logits
    over 88.7: only the wide set, the last, draws them."""
    ev = evaluate(env, make_candidate(body, args="a"), task)
    assert ev.status == status, ev.reason
    if status == "incorrect":
        assert f"[input set {len(VERIFICATION_PLAN)}: inputs drawn from a normal distribution with mean 60" in ev.reason
        assert "got nan" in ev.reason or "got inf" in ev.reason, ev.reason


VARIANCE = make_task("var_rows", "return aten.var.correction(in0, [-1], correction=0)",
                     [contiguous((32, 4096), "float32", "cpu")], [contiguous((32,), "float32", "cpu")],
                     "reduction", ("aten.var.correction",))


@pytest.mark.parametrize("body, status", [
    ("m = a.mean(-1, keepdim=True)\nreturn ((a - m) ** 2).mean(-1)", "passed"),
    ("return (a * a).mean(-1) - a.mean(-1) ** 2", "incorrect"),
], ids=["two_passes", "one_pass"])
def test_a_variance_taken_in_one_pass_is_refused_as_less_accurate(env, body, status):
    """E[x^2] - E[x]^2 cancels where the mean is large against the spread: within tolerance of
    the reference, it is refused on its error against float64 (a set whose mean is 4 stds)."""
    ev = evaluate(env, make_candidate(body, args="a"), VARIANCE)
    assert ev.status == status, ev.reason
    if status == "incorrect":
        assert "less accurate than the reference" in ev.reason, ev.reason


# in0 where in1 != 0, else 0: a mask that normal draws never hit (in1 == 0 has probability 0)
MASKED = make_task("masked_by_nonzero", "return aten.mul.Tensor(in0, aten.ne.Scalar(in1, 0))",
                   [contiguous((32, 64), "float32", "cpu")] * 2, [contiguous((32, 64), "float32", "cpu")],
                   "pointwise", ("aten.ne.Scalar", "aten.mul.Tensor"))


def test_a_candidate_that_ignores_a_mask_is_refused(env):
    # Normal draws hold an exact 0 now and then (about one 4096-element CPU draw in 4000), so
    # which input set refuses it is not fixed; without the set of 0s and 1s it would pass.
    ev = evaluate(env, make_candidate("return a.clone()"), MASKED)
    assert ev.status == "incorrect", ev.reason
    assert evaluate(env, make_candidate("return a * (b != 0)"), MASKED).status == "passed"


def _cross_entropy_losses():
    """Cross-entropy's per-row losses as the partition cuts them: the target (int64, drawn in
    bounds of the row or as the ignore_index -100), the logits."""
    import torch
    import torch.nn.functional as F
    from test_rows_template import Fn, traced_row_tasks
    tasks = traced_row_tasks(Fn(lambda x, t: F.cross_entropy(x, t)), [torch.randn(32, 64), torch.arange(32) % 64])
    return tasks[0]


CE_PICKED = "-x.log_softmax(-1).gather(1, torch.where(t != -100, t, 0).unsqueeze(1)).squeeze(1)"


@pytest.mark.parametrize("body, status", [
    (f"return torch.where(t != -100, {CE_PICKED}, 0.0)", "passed"),
    ("return torch.where(t != -100, -x.log_softmax(-1)[:, 0], 0.0)", "incorrect"),  # the first element
    (f"return {CE_PICKED}", "incorrect"),  # ignored rows not masked
])
def test_a_gather_is_verified_on_indices_over_the_whole_row(env, body, status):
    """Integer inputs that index a row are drawn over it (as zeros, a kernel that reads the
    first element would pass) and as the values they are compared with (cross-entropy's
    ignore_index: never drawn, a kernel that skips the mask would pass), and the verifier's blank
    inputs hold integers too."""
    task = _cross_entropy_losses()
    assert [s.dtype for s in task.inputs] == ["int64", "float32"] and task.inputs[0].high == 64
    assert task.inputs[0].special == (-100,)
    ev = evaluate(env, make_candidate(body, args="t, x"), task)
    assert ev.status == status, ev.reason
