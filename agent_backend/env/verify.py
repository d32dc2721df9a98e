"""Verification of one candidate against its task's reference, inside a worker.

Each trial draws a fresh input set (several value ranges; one trial writes new values into the
previous trial's input tensors, so pointers and shapes repeat while values change), runs the
candidate BEFORE the reference, and checks, in this order:
  1. the state the candidate must leave alone (threads, patched functions, global settings),
  2. the outputs' structure: their count, and that each is exactly a torch.Tensor (a subclass
     could defer its work until it is read),
  3. the inputs are bitwise unchanged,
  4. no output shares memory with an input, with an output of an earlier call, or with
     another output where the reference's outputs do not; a launch-spec kernel's counters
     (launch_spec.Arg.counters, kept from launch to launch) are zeroed again, so no launch
     hands anything on to the next,
  5. device, shape and dtype; then values within tolerance, with NaN/Inf never passing; where
     the reference itself strays (bf16 attention scores rounded before a peaked softmax), a
     candidate that is within tolerance of the float64 evaluation instead, and closer to it
     than the reference, is right (the input sets where that decided are recorded);
  6. accuracy: against the task evaluated in float64, the candidate's relative error is at most
     twice the reference's own and never held below a few fp32 roundings (float64.py), so a
     rewrite that rounds differently passes and a lossy one (bf16 arithmetic for an fp32 task)
     does not.
Every new tensor the candidate allocates through torch is filled with NaN (guards.
PoisonedAllocations), so an element it forgets to write fails in step 5.

On CUDA, the candidate runs with a non-default current stream, and its inputs are written on
that stream behind a long sleep just before the call: work the candidate launches on any other
stream (a side stream, the legacy default stream of a `<<<grid, block>>>` launch) reads inputs
that are not there yet, and its outputs are copied on the current stream as soon as forward
returns, before anything synchronizes. Work not ordered on the current stream therefore shows
up as a mismatch, deterministically, whenever forward returns before the sleep ends (the sleep
adapts to forward's own duration; `stream_checked_trials` counts the trials where it did).
"""
from __future__ import annotations

import hashlib
import os
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from agent_backend.env.candidate_loader import describe_exception
from agent_backend.env import float64, launch_op
from agent_backend.env.compare import (bitwise_equal, compare_values, differing_elements, layout_problem, memory_span,
                                       overlapping_pairs, share_memory, spans_overlap, stride_note,
                                       tolerance)
from agent_backend.env.guards import REAL, GlobalSwitches, PatchFingerprint, PoisonedAllocations, StateWatch
from agent_backend.env.results import Failure
from agent_backend.env.retained import Retained, retention_budget, span_bytes, tensor_bytes
from agent_backend.specs import Task, TensorSpec, random_inputs


@dataclass(frozen=True)
class InputDraw:
    """Inputs drawn from N(offset, scale^2), or 0s and 1s where `binary`."""

    scale: float
    offset: float
    binary: bool = False

    def describe(self) -> str:
        if self.binary:
            return "inputs of 0s and 1s, as masks hold"
        return f"inputs drawn from a normal distribution with mean {self.offset:g} and std {self.scale:g}"


# Values from about -30 to 150, as logits and unscaled scores reach: an exp not taken against
# its row's max overflows (above 88.7, in every dtype but fp64), a fast form's range guard is
# crossed (a thread's values span far over 64) and a variance's mean lies far from 0. The other
# draws stay within +-15 and passed a softmax computed as exp(x) / sum(exp(x)).
WIDE_DRAW = InputDraw(30.0, 60.0)

# (value range, whether the values are written into the previous trial's input tensors)
VERIFICATION_PLAN = (
    (InputDraw(1.0, 0.0), False),
    (InputDraw(0.5, 2.0), False),
    (InputDraw(2.0, -1.0), False),
    (InputDraw(0.1, 0.0), False),
    (InputDraw(1.0, 0.0, binary=True), False),  # a mask's `== 0` or a variance's zero is met at least once
    (InputDraw(1.0, 0.5), True),
    (InputDraw(3.0, 0.0), False),
    (WIDE_DRAW, False),
)


# Bump when a rule changes so that a candidate that passed before might fail now (a tolerance, a
# check added); the input sets count on their own. A cached kernel whose verification recorded
# other rules is verified again before it runs (dispatch.Dispatcher.decide), signed or local.
RULES_REVISION = 1


# The verification rules' identity, recorded with each verification: a kernel passed by rules
# that let more through (a plan without the wide input set) is not trusted by these.
RULES = f"{RULES_REVISION}-{hashlib.sha256(repr(VERIFICATION_PLAN).encode()).hexdigest()[:12]}"


def verified_under_these_rules(verification: dict) -> bool:
    return verification.get("rules") == RULES


def new_seed() -> int:
    return int.from_bytes(os.urandom(4), "little") >> 1


# ----------------------------------------------------------------------------- torch ops record

# Ops that allocate, fill, copy or alias memory without computing anything; views are left out
# through their schema. Everything else a candidate calls is recorded.
_NOT_COMPUTE = {f"aten::{name}" for name in (
    "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "zeros", "zeros_like",
    "new_zeros", "ones", "ones_like", "new_ones", "full", "full_like", "new_full", "fill_", "zero_",
    "copy_", "clone", "detach", "alias", "lift_fresh", "resize_", "set_", "_unsafe_view", "_reshape_alias")}


class TorchOpRecorder(TorchDispatchMode):
    """Records the aten ops run under it (also those called from C++ extensions)."""

    def __init__(self):
        super().__init__()
        self.ops: set[str] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not func.is_view and func._schema.name not in _NOT_COMPUTE:
            self.ops.add(str(func))
        return func(*args, **(kwargs or {}))


# ----------------------------------------------------------------------------- calling a candidate

def output_list(raw: Any) -> list:
    return list(raw) if isinstance(raw, (tuple, list)) else [raw]


def structure_failure(outputs: list, n_expected: int) -> Failure | None:
    for i, out in enumerate(outputs):
        if type(out) is torch.Tensor:
            continue
        if isinstance(out, torch.Tensor):
            return Failure("rejected", f"output {i} is a {type(out).__name__}, a subclass of torch.Tensor: outputs must "
                                       "be plain tensors (a subclass can defer its work until it is read)")
        return Failure("incorrect", f"output {i} is a {type(out).__name__}, expected a tensor")
    if len(outputs) != n_expected:
        return Failure("incorrect", f"forward returned {len(outputs)} outputs, expected {n_expected}")
    return None


def blank_like(source: torch.Tensor) -> torch.Tensor:
    """A tensor with the layout (shape, strides, storage extent) of `source`, holding garbage
    (NaN, True for bool, -1 for integers: no index) until the candidate's inputs are written into it."""
    base = torch.empty(TensorSpec.of(source).storage_elements(), dtype=source.dtype, device=source.device)
    base.fill_(True if source.dtype == torch.bool else float("nan") if source.is_floating_point() else -1)
    return base.as_strided(source.shape, source.stride())


def write_input(dst: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
    """Write `src`'s values into `dst`, a tensor of the same layout. Through the storage both views
    span: an input expanded over a dim (stride 0, as in backward graphs) cannot be written
    element by element ("more than one element of the written-to tensor refers to a single
    memory location")."""
    n = TensorSpec.of(src).storage_elements()
    flat = (n,), (1,)
    dst.as_strided(*flat, dst.storage_offset()).copy_(src.as_strided(*flat, src.storage_offset()))
    return dst


def cuda_usable(device: torch.device) -> bool:
    """False once the CUDA context is broken (an illegal address, a device-side assert)."""
    try:
        REAL.cuda_synchronize()
        return torch.ones(1, device=device).add_(1).item() == 2.0
    except Exception:
        return False


def failure_from_exception(exc: BaseException, device: torch.device, during: str) -> Failure:
    message = describe_exception(exc)
    if device.type == "cuda" and not cuda_usable(device):
        return Failure("crash", f"{during} broke the CUDA context: {message}", restart=True)
    return Failure("runtime_error", f"{during} raised: {message}")


@dataclass
class CallResult:
    outputs: list  # as returned
    copies: list[torch.Tensor]  # taken on the current stream as soon as forward returned
    failure: Failure | None  # an output of the wrong kind (then nothing was copied)
    stream_checked: bool  # forward returned before its inputs had been written on its stream


def _copy_outputs(raw: Any, n_outputs: int) -> tuple[list, list[torch.Tensor], Failure | None]:
    outputs = output_list(raw)
    failure = structure_failure(outputs, n_outputs)
    return outputs, ([] if failure else [o.clone() for o in outputs]), failure


class CpuRunner:
    checks_stream_order = False

    def call(self, forward: Callable[[], Any], inputs: list, sources: list, n_outputs: int) -> CallResult:
        for inp, src in zip(inputs, sources):
            write_input(inp, src)
        return CallResult(*_copy_outputs(forward(), n_outputs), stream_checked=False)


_INITIAL_SLEEP_MS = 5.0
_MAX_SLEEP_MS = 500.0


def sleep_cycles_per_ms(device: torch.device) -> float:
    """GPU clock cycles per millisecond of torch.cuda._sleep, measured."""
    stream = torch.cuda.current_stream(device)
    start, end = REAL.cuda_event_type(enable_timing=True), REAL.cuda_event_type(enable_timing=True)
    for _ in range(2):  # the first run includes one-off start-up costs
        REAL.cuda_synchronize()
        REAL.event_record(start, stream)
        REAL.cuda_sleep(1_000_000)
        REAL.event_record(end, stream)
        REAL.cuda_synchronize()
    return 1_000_000 / max(REAL.event_elapsed_time(start, end), 1e-3)


class CudaRunner:
    """Runs forward on a non-default stream whose inputs arrive late (see the module doc)."""

    checks_stream_order = True

    def __init__(self, device: torch.device, cycles_per_ms: float):
        self.stream = torch.cuda.Stream(device)
        self.cycles_per_ms = cycles_per_ms
        self.sleep_ms = _INITIAL_SLEEP_MS

    def call(self, forward: Callable[[], Any], inputs: list, sources: list, n_outputs: int) -> CallResult:
        REAL.cuda_synchronize()
        with torch.cuda.stream(self.stream):
            REAL.cuda_sleep(int(self.sleep_ms * self.cycles_per_ms))
            for inp, src in zip(inputs, sources):
                write_input(inp, src)
            written = REAL.cuda_event_type()
            REAL.event_record(written, self.stream)
            start = REAL.perf_counter_ns()
            raw = forward()
            forward_ms = (REAL.perf_counter_ns() - start) / 1e6
            stream_checked = not REAL.event_query(written)
            outputs, copies, failure = _copy_outputs(raw, n_outputs)
        REAL.cuda_synchronize()
        # Keep the window wider than forward's own host time, so later trials are conclusive.
        self.sleep_ms = min(_MAX_SLEEP_MS, max(self.sleep_ms, 3 * forward_ms))
        return CallResult(outputs, copies, failure, stream_checked)


# ----------------------------------------------------------------------------- the verifier

@dataclass
class _Trial:
    """What the latest trial leaves: its inputs (for the trial that reuses them), its outputs'
    copies and the reference's (for the explanation of a mismatch in the next trial; None once
    that trial passes)."""
    inputs: list[torch.Tensor] | None
    copies: list[torch.Tensor] | None
    expected: list[torch.Tensor] | None


class Verifier:
    """Runs trials of one candidate against the task's reference and keeps their evidence."""

    def __init__(self, candidate: torch.nn.Module, reference: torch.nn.Module, task: Task, device: torch.device,
                 precision: dict, runner: CpuRunner | CudaRunner, switches: GlobalSwitches,
                 fingerprint: PatchFingerprint, seed: int):
        self.candidate, self.reference, self.task, self.device = candidate, reference, task, device
        self.runner, self.switches, self.fingerprint, self.seed = runner, switches, fingerprint, seed
        self.tolerances = [tolerance(spec.torch_dtype, precision, task.ops) for spec in task.outputs]
        self.trials = 0
        self.stream_checked_trials = 0
        self.max_abs_err = 0.0
        self.max_rel_err = 0.0
        self.torch_ops: list[str] = []
        self.stride_notes: list[str] = []
        self.float64_err = 0.0  # the candidate's worst relative error against float64
        self.float64_ref_err = 0.0  # the reference's, on the same inputs
        self.float64_note: str | None = None  # why there is no float64 evaluation
        self.judged_by_float64: list[str] = []  # input sets where the reference strayed, the candidate did not
        # The outputs returned so far stay alive, so their memory is never handed out again and
        # a candidate returning the same buffer twice is seen doing so. Inputs stay alive for the
        # latest trial only; the address ranges of earlier ones are kept instead, and new inputs
        # are never placed in one (_fresh_blanks): pointers repeat only where a trial reuses
        # inputs on purpose. Both within a budget (retained.py): where a task's tensors are too
        # large for it, only the newest calls' are kept, at least the previous call's (a wrong
        # result replayed from an older one still fails on its values). The copies and the
        # reference's outputs stay for the latest trial only: a result cached by input pointer
        # (the reusing trial follows the one whose inputs it reuses) or by shape (the second trial
        # already fails) returns the previous trial's bits. Keeping the rest took as much memory
        # again per trial (KernelBench's 4096 x 393216 softmax fp32: 114 GB of an H200 by the
        # fifth trial).
        budget = retention_budget(device)
        self._latest: _Trial | None = None
        self._input_spans: Retained[tuple[str, int, int]] = Retained(budget, span_bytes)
        self._returned: Retained[torch.Tensor] = Retained(budget, tensor_bytes)
        self._poisoning: PoisonedAllocations | None = None  # of the last forward
        spec = launch_op.spec_of(type(candidate))
        counted = spec is not None and any(a.kind == "counters" for k in spec.kernels for a in k.args)
        self._counters_key = spec.digest if counted else None  # whose counters each call must leave zeroed

    def run(self) -> Failure | None:
        for number, (draw, reuse) in enumerate(VERIFICATION_PLAN):
            reuse_inputs = self._latest.inputs if reuse and self._latest else None
            failure = self.trial(draw, reuse_inputs, record_ops=number == 0)
            if failure:
                return failure
        return None

    def before_timing(self) -> None:
        """Let go of the latest trial: timing draws inputs of its own, and the check after it
        reuses the inputs timed last, where a result cached while timed would replay a timed
        call's bits, not the latest trial's (softmax over 4096 x 393216 fp32: 18 GB that timing
        ran out of memory without)."""
        self._latest = None

    def keep_returned(self, raw: Any) -> None:
        """Keep what a call outside the trials returned (timing's) alive as the trials' outputs
        are, so a later trial returning the same buffer is seen doing so."""
        self._returned.add([t for t in output_list(raw) if isinstance(t, torch.Tensor)])

    def details(self) -> dict:
        details = {
            "rules": RULES,
            "trials": self.trials,
            "seed": self.seed,
            "max_abs_err": self.max_abs_err,
            "max_rel_err": self.max_rel_err,
            "atol": max(self.tolerances, default=0.0),
            "rtol": max(self.tolerances, default=0.0),
            "torch_ops": self.torch_ops,
            "stride_notes": self.stride_notes,
            "float64_err": self.float64_err,
            "float64_ref_err": self.float64_ref_err,
        }
        if self.float64_note:
            details["float64_note"] = self.float64_note
        if self.judged_by_float64:
            details["judged_by_float64"] = self.judged_by_float64
        if self.runner.checks_stream_order:
            details["stream_checked_trials"] = self.stream_checked_trials
        return details

    def trial(self, draw: InputDraw, reuse_inputs: list[torch.Tensor] | None = None,
              record_ops: bool = False) -> Failure | None:
        """One call of the candidate and of the reference on a new input set; `reuse_inputs`:
        write the new values into these tensors instead of new ones."""
        self.trials += 1
        where = f" [input set {self.trials}: {draw.describe()}]"
        if self._latest is not None and reuse_inputs is None:
            self._latest.inputs = None  # their memory may hold the new values; _fresh_blanks keeps out of it
        sources = random_inputs(self.task.inputs, self.seed + self.trials, scale=draw.scale, offset=draw.offset,
                                binary=draw.binary, device=str(self.device))
        inputs = reuse_inputs or self._fresh_blanks(sources)
        watch = StateWatch(self.switches, self.fingerprint)
        recorder = TorchOpRecorder() if record_ops else None
        self._poisoning = None
        try:
            call = self.runner.call(lambda: self._forward(inputs, recorder), inputs, sources, len(self.task.outputs))
        except BaseException as exc:  # the candidate's own, or a CUDA error its kernels left behind
            return failure_from_exception(exc, self.device, "forward")
        self.stream_checked_trials += call.stream_checked
        if recorder is not None:
            self.torch_ops = sorted(recorder.ops)
        return (watch.violation("forward") or self._poisoning_failure() or call.failure
                or self._inputs_failure(inputs, sources) or self._memory_failure(call.outputs, inputs)
                or self._counters_failure() or self._compare(call, sources, inputs, where))

    def _fresh_blanks(self, sources: list[torch.Tensor]) -> list[torch.Tensor]:
        """Blank inputs for `sources` at addresses no kept earlier trial's inputs had (all of
        them within the retention budget, the previous trial's always): a blank that lands in one
        (the allocator hands freed memory out again) is held aside while the next is allocated,
        then let go."""
        held, blanks = [], []
        for source in sources:
            blank = blank_like(source)
            while any(spans_overlap(memory_span(blank), span) for span in self._input_spans):
                held.append(blank)
                blank = blank_like(source)
            blanks.append(blank)
        self._input_spans.add([memory_span(b) for b in blanks])
        return blanks

    def _forward(self, inputs: list[torch.Tensor], recorder: TorchOpRecorder | None) -> Any:
        with torch.no_grad(), PoisonedAllocations() as self._poisoning, recorder or nullcontext():
            return self.candidate(*inputs)

    def _poisoning_failure(self) -> Failure | None:
        if self._poisoning is None or not self._poisoning.tampered:
            return None
        return Failure("rejected", "forward changed torch.use_deterministic_algorithms or torch.utils.deterministic."
                                   "fill_uninitialized_memory, which verification uses to poison new tensors")

    def _inputs_failure(self, inputs: list[torch.Tensor], sources: list[torch.Tensor]) -> Failure | None:
        for i, (inp, src) in enumerate(zip(inputs, sources)):
            changed = differing_elements(inp, src)
            if changed:
                return Failure("rejected", f"forward changed input {i} ({changed} of {src.numel()} elements): "
                                           "inputs must be left unchanged")
        return None

    def _memory_failure(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor]) -> Failure | None:
        for i, out in enumerate(outputs):
            for j, inp in enumerate(inputs):
                if share_memory(out, inp):
                    return Failure("rejected", f"output {i} shares memory with input {j}: return a newly allocated tensor")
            if any(share_memory(out, earlier) for earlier in self._returned):
                return Failure("rejected", f"output {i} reuses the memory of an output returned by an earlier call: "
                                           "allocate outputs on every call, a caller may still hold the earlier ones")
        self._returned.add(list(outputs))
        return None

    def _counters_failure(self) -> Failure | None:
        """A launch must leave its counters as it found them, zeroed: what it left there would
        reach the next launch (a result kept for the same inputs, a barrier that never waits)."""
        left = launch_op.counters_left(self._counters_key) if self._counters_key else 0
        if left == 0:
            return None
        return Failure("rejected", f"the kernel left its counters non-zero ({left} bytes): each launch must "
                                   "zero them again (a barrier's last block to leave resets its counters)")

    def _reference(self, sources: list[torch.Tensor]) -> list[torch.Tensor]:
        with torch.no_grad():
            return output_list(self.reference(*sources))

    def _compare(self, call: CallResult, sources: list[torch.Tensor], inputs: list[torch.Tensor],
                 where: str) -> Failure | None:
        expected = self._reference(sources)
        shared = overlapping_pairs(call.outputs) - overlapping_pairs(expected)
        if shared:
            i, j = min(shared)
            return Failure("rejected", f"outputs {i} and {j} share memory; the reference's do not")
        for i, (got, exp) in enumerate(zip(call.outputs, expected)):
            problem = layout_problem(i, got, exp)
            if problem:
                return Failure("incorrect", problem + where)
            note = stride_note(i, got, exp)
            if note and note not in self.stride_notes:
                self.stride_notes.append(note)
        first_problem = None
        for i, (copy, exp, tol) in enumerate(zip(call.copies, expected, self.tolerances)):
            check = compare_values(i, copy, exp, tol)
            self.max_abs_err = max(self.max_abs_err, check.max_abs_err)
            self.max_rel_err = max(self.max_rel_err, check.max_rel_err)
            first_problem = first_problem or check.problem
        previous, self._latest = self._latest, _Trial(inputs, call.copies, expected)
        if first_problem is None:  # the latest trial's evidence is all an explanation needs
            previous = None  # (its memory goes back before the float64 evaluation takes more)
        exact = self._exact(sources)
        if first_problem is not None and exact is not None and self._closer_to_exact(call.copies, expected, exact):
            self.judged_by_float64.append(f"{where.strip()}: {first_problem}")
            first_problem = None
        if first_problem is None:
            problem = self._accuracy_problem(call.copies, expected, exact)
            return Failure("incorrect", problem + where) if problem else None
        return self._explain(first_problem + where, call, sources, expected, previous)

    def _exact(self, sources: list[torch.Tensor]) -> list[torch.Tensor] | None:
        """The task evaluated in float64 on `sources`, or None where it cannot be (noted once)."""
        if self.float64_note:
            return None
        try:
            return float64.evaluate(self.reference, sources)
        except torch.OutOfMemoryError:  # a task that fits in its own dtypes need not in float64
            self.float64_note = "the task evaluated in float64 does not fit in memory"
        except Exception as exc:  # an op with no float64 kernel here
            self.float64_note = f"no float64 evaluation of the task: {describe_exception(exc)}"
        # Either way the check cannot run. The float64 tensors went with the exception: give the
        # memory they held back to the device, for the comparisons and trials to come.
        if torch.cuda.is_initialized():
            torch.cuda.empty_cache()
        return None

    def _closer_to_exact(self, copies: list[torch.Tensor], expected: list[torch.Tensor],
                         exact: list[torch.Tensor]) -> bool:
        """Every output within tolerance of the float64 result and no further from it than the
        reference's: the mismatch was the reference's own rounding, not the candidate's."""
        return all(compare_values(i, copy, ex, tol).problem is None
                   and float64.relative_error(copy, ex) <= float64.relative_error(exp, ex)
                   for i, (copy, exp, ex, tol) in enumerate(zip(copies, expected, exact, self.tolerances)))

    def _accuracy_problem(self, copies: list[torch.Tensor], expected: list[torch.Tensor],
                          exact: list[torch.Tensor] | None) -> str | None:
        if exact is None:
            return None
        for i, (copy, exp, ex) in enumerate(zip(copies, expected, exact)):
            err, ref_err = float64.relative_error(copy, ex), float64.relative_error(exp, ex)
            self.float64_err, self.float64_ref_err = max(self.float64_err, err), max(self.float64_ref_err, ref_err)
            problem = float64.accuracy_problem(i, err, ref_err, exp.dtype)
            if problem:
                return problem
        return None

    def _explain(self, problem: str, call: CallResult, sources: list[torch.Tensor], expected: list[torch.Tensor],
                 previous: _Trial | None) -> Failure:
        """Name the rule behind a mismatch where the evidence shows one."""
        if (previous is not None and all(map(bitwise_equal, call.copies, previous.copies))
                and not all(map(bitwise_equal, expected, previous.expected))):
            return Failure("rejected", "forward returned exactly what it returned for the last, different input "
                                       "values: its result is cached (by input pointer or shape) or does not depend on "
                                       f"the inputs. {problem}")
        if self.runner.checks_stream_order and self._right_on_default_stream(sources, expected):
            return Failure("rejected", f"{problem}. The output is right when forward runs on the default stream after a "
                                       "full synchronize, but wrong when forward runs on another current stream that "
                                       "writes its inputs just before the call: launch every kernel on "
                                       "torch.cuda.current_stream() and leave no work on other streams")
        return Failure("incorrect", problem)

    def _right_on_default_stream(self, sources: list[torch.Tensor], expected: list[torch.Tensor]) -> bool:
        inputs = [write_input(blank_like(s), s) for s in sources]
        REAL.cuda_synchronize()
        try:
            with torch.no_grad(), PoisonedAllocations():
                outputs = output_list(self.candidate(*inputs))
            REAL.cuda_synchronize()
        except Exception:
            return False
        return (structure_failure(outputs, len(expected)) is None
                and all(layout_problem(i, o, e) is None and compare_values(i, o, e, t).problem is None
                        for i, (o, e, t) in enumerate(zip(outputs, expected, self.tolerances))))
