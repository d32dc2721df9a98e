"""What a candidate must leave as it found it, and how a worker notices that it did not.

Runs inside a worker process. Three kinds of state are watched around every candidate action
(loading it, each forward call, a timing run):
- torch's global switches (TF32, matmul precision, reduced-precision reductions, deterministic
  mode, default dtype/device, grad mode, ...): snapshotted, compared, restored;
- the functions and classes that verification and timing rely on (timers, events,
  synchronize, comparison ops, this package's own modules): a patched one is a rejection, and
  the worker is replaced because a patch cannot be undone reliably;
- Python threads: one left running after a call may still be doing the call's work.
The timing primitives the profiler uses are captured here at import, before any candidate runs,
so a candidate that patches torch.cuda.synchronize or time.perf_counter cannot fool the timer.
"""
from __future__ import annotations

import sys
import threading
import time
import types
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, NamedTuple

import torch
import torch.nn.functional
import torch.utils.deterministic

from agent_backend.env.results import Failure, precision_settings


class RealPrimitives(NamedTuple):
    """The timing and introspection functions as they were before any candidate ran."""

    perf_counter_ns: Callable[[], int]
    current_frames: Callable[[], dict]
    cuda_synchronize: Callable[[], None] | None  # device-wide, on the current device
    cuda_sleep: Callable[[int], None] | None
    cuda_event_type: type | None
    event_record: Callable | None
    event_elapsed_time: Callable | None
    event_query: Callable | None
    zero_: Callable  # the L2 flushes (profile.CudaTimer): a write, or a read
    sum: Callable


def _capture_real_primitives() -> RealPrimitives:
    event_base = getattr(torch._C, "_CudaEventBase", None)
    has_cuda = torch.cuda.is_available() and event_base is not None
    return RealPrimitives(
        perf_counter_ns=time.perf_counter_ns,
        current_frames=sys._current_frames,
        cuda_synchronize=torch._C._cuda_synchronize if has_cuda else None,
        cuda_sleep=torch._C._cuda_sleep if has_cuda else None,
        cuda_event_type=event_base if has_cuda else None,
        event_record=event_base.record if has_cuda else None,
        event_elapsed_time=event_base.elapsed_time if has_cuda else None,
        event_query=event_base.query if has_cuda else None,
        zero_=torch.Tensor.zero_,
        sum=torch.sum,
    )


REAL = _capture_real_primitives()


# ----------------------------------------------------------------------------- global switches

@dataclass(frozen=True)
class Switch:
    name: str
    get: Callable[[], Any]
    set: Callable[[Any], None] | None  # None: cannot be put back, the worker must be replaced


_UNREADABLE = "<unreadable>"
# Captured so that a candidate replacing torch.backends.cuda.matmul cannot change what we read.
_CUBLAS = torch.backends.cuda.matmul
# The new per-backend fp32 precision API (torch >= 2.9), parents before children: setting a
# parent resets its children, so restoring in this order reproduces a snapshot.
_FP32_PRECISION_KEYS = [("generic", "all"), ("cuda", "all"), ("cuda", "matmul"), ("cuda", "conv"),
                        ("cuda", "rnn"), ("mkldnn", "all"), ("mkldnn", "matmul"), ("mkldnn", "conv"),
                        ("mkldnn", "rnn")]


def _cublas_flag(name: str) -> Switch:
    return Switch(f"torch.backends.cuda.matmul.{name}", lambda: getattr(_CUBLAS, name),
                  lambda v: setattr(_CUBLAS, name, v))


def _fp32_precision(backend: str, op: str) -> Switch:
    return Switch(f"fp32_precision({backend}, {op})",
                  lambda: torch._C._get_fp32_precision_getter(backend, op),
                  lambda v: torch._C._set_fp32_precision_setter(backend, op, v))


def _sdp_flag(kind: str) -> Switch:
    return Switch(f"torch.backends.cuda.{kind}_sdp_enabled()", getattr(torch.backends.cuda, f"{kind}_sdp_enabled"),
                  getattr(torch.backends.cuda, f"enable_{kind}_sdp"))


def _build_switches(device_type: str) -> list[Switch]:
    C = torch._C
    # The legacy TF32 switches first: setting them also sets the new API's values, which are
    # then put back exactly.
    switches = [
        Switch("torch.get_float32_matmul_precision()", torch.get_float32_matmul_precision,
               torch.set_float32_matmul_precision),
        Switch("torch.backends.cuda.matmul.allow_tf32", C._get_cublas_allow_tf32, C._set_cublas_allow_tf32),
        Switch("torch.backends.cudnn.allow_tf32", C._get_cudnn_allow_tf32, C._set_cudnn_allow_tf32),
    ]
    if hasattr(C, "_get_fp32_precision_getter"):
        switches += [_fp32_precision(b, o) for b, o in _FP32_PRECISION_KEYS]
    switches += [
        _cublas_flag("allow_fp16_reduced_precision_reduction"),
        _cublas_flag("allow_bf16_reduced_precision_reduction"),
    ]
    if hasattr(C, "_get_cublas_allow_fp16_accumulation"):
        switches.append(_cublas_flag("allow_fp16_accumulation"))
    switches += [
        Switch("torch.are_deterministic_algorithms_enabled()",
               lambda: (C._get_deterministic_algorithms(), C._get_deterministic_algorithms_warn_only()),
               lambda v: torch.use_deterministic_algorithms(v[0], warn_only=v[1])),
        Switch("torch.utils.deterministic.fill_uninitialized_memory",
               C._get_deterministic_fill_uninitialized_memory, C._set_deterministic_fill_uninitialized_memory),
        Switch("torch.get_default_dtype()", torch.get_default_dtype, torch.set_default_dtype),
        Switch("torch.get_default_device()", torch.get_default_device, torch.set_default_device),
        Switch("torch.is_grad_enabled()", torch.is_grad_enabled, torch.set_grad_enabled),
        Switch("torch.get_num_threads()", torch.get_num_threads, torch.set_num_threads),
        Switch("torch.backends.cudnn.enabled", C._get_cudnn_enabled, C._set_cudnn_enabled),
        Switch("torch.backends.cudnn.benchmark", C._get_cudnn_benchmark, C._set_cudnn_benchmark),
        Switch("torch.backends.cudnn.deterministic", C._get_cudnn_deterministic, C._set_cudnn_deterministic),
        Switch("torch.backends.mkldnn.enabled", C._get_mkldnn_enabled, C._set_mkldnn_enabled),
        *[_sdp_flag(kind) for kind in ("flash", "mem_efficient", "math", "cudnn")],
        # A mode left on the stack would intercept every later op, the reference's too.
        Switch("torch function mode stack", C._len_torch_function_stack, None),
        Switch("torch dispatch mode stack", C._len_torch_dispatch_stack, None),
    ]
    if device_type == "cuda":
        switches += [
            Switch("torch.cuda.current_device()", torch.cuda.current_device, torch.cuda.set_device),
            Switch("torch.cuda.current_stream()", torch.cuda.current_stream, torch.cuda.set_stream),
            Switch("torch.backends.cuda.preferred_blas_library()", torch.backends.cuda.preferred_blas_library,
                   torch.backends.cuda.preferred_blas_library),
        ]
    return switches


def _read(switch: Switch) -> Any:
    try:
        return switch.get()
    except Exception:  # e.g. torch refuses to read TF32 after a mix of its legacy and new APIs
        return _UNREADABLE


class GlobalSwitches:
    """torch's process-wide settings that change numerics or timing."""

    def __init__(self, device_type: str):
        self._switches = _build_switches(device_type)

    def snapshot(self) -> dict[str, Any]:
        return {s.name: _read(s) for s in self._switches}

    def changed(self, before: dict[str, Any]) -> list[str]:
        """Names of the switches whose value differs from `before`, as 'name: old -> new'."""
        now = self.snapshot()
        return [f"{name}: {before[name]} -> {now[name]}" for name in before if now[name] != before[name]]

    def restore(self, before: dict[str, Any]) -> bool:
        """Put every switch back; False where one could not be (the worker must be replaced)."""
        for switch in self._switches:
            target = before[switch.name]
            if _read(switch) == target or target == _UNREADABLE or switch.set is None:
                continue
            try:
                switch.set(target)
            except Exception:
                return False
        return not self.changed(before)


def apply_precision(precision: dict) -> None:
    """Set torch's numerics to the user's precision settings (see results.precision_settings):
    by default strict fp32 (no TF32 in cuBLAS or cuDNN, matmul precision "highest", no
    reduced-precision reductions in fp16/bf16 GEMMs)."""
    p = precision_settings(precision)
    matmul = p["matmul_precision"]
    if matmul == "highest" and p["allow_tf32"]:
        matmul = "high"
    torch.set_float32_matmul_precision(matmul)
    torch._C._set_cudnn_allow_tf32(p["allow_cudnn_tf32"])
    _CUBLAS.allow_fp16_reduced_precision_reduction = p["allow_reduced_precision"]
    _CUBLAS.allow_bf16_reduced_precision_reduction = p["allow_reduced_precision"]


@contextmanager
def precision_context(switches: GlobalSwitches, precision: dict):
    before = switches.snapshot()
    apply_precision(precision)
    try:
        yield
    finally:
        switches.restore(before)


class PoisonedAllocations:
    """Makes torch fill every new uninitialised tensor (empty, empty_like, empty_strided, at::empty
    in C++) with NaN (floats) or the largest integer, so that an output element a candidate
    forgets to write reads as garbage instead of as whatever the memory held before. torch does
    this in deterministic mode; warn_only keeps ops without a deterministic version working.
    `tampered` says whether the block switched it off."""

    _ON = (True, True, True)

    @staticmethod
    def _flags() -> tuple[bool, bool, bool]:
        C = torch._C
        return (C._get_deterministic_algorithms(), C._get_deterministic_algorithms_warn_only(),
                C._get_deterministic_fill_uninitialized_memory())

    @staticmethod
    def _set(flags: tuple[bool, bool, bool]) -> None:
        torch.use_deterministic_algorithms(flags[0], warn_only=flags[1])
        torch._C._set_deterministic_fill_uninitialized_memory(flags[2])

    def __enter__(self) -> "PoisonedAllocations":
        self._saved = self._flags()
        self._set(self._ON)
        self.tampered = False
        return self

    def __exit__(self, *exc_info) -> None:
        self.tampered = self._flags() != self._ON
        self._set(self._saved)


# ----------------------------------------------------------------------------- patched functions

def _watched_modules() -> list[types.ModuleType]:
    # Lazy: this package's own modules import this one.
    from agent_backend import runtime, specs
    from agent_backend.env import candidate_loader, compare, launch_op, profile, verify, worker

    # graph_launch (what a profile calls) where loaded: importing it builds the launch op
    loaded = [m for m in (sys.modules.get("agent_backend.env.graph_launch"),) if m is not None]
    return [time, sys, threading, torch, torch._C, torch.cuda, torch.nn.functional, torch.backends.cuda,
            torch.backends.cudnn, specs, sys.modules[__name__], candidate_loader, compare, profile, verify,
            worker, runtime, launch_op, *loaded]


def _op_registrations() -> dict[str, str]:
    """The dispatcher's entries of the ops a candidate is timed through (runtime.as_called_by_a_graph):
    a kernel registered for one of them in the worker would run there, not where the winner runs."""
    from agent_backend.env import launch_op  # lazy, as in _watched_modules

    return {op: torch._C._dispatch_dump(op) for op in (*launch_op.OP_NAMES, "cuda_agent::run_winner")}


def _watched_classes() -> list[type]:
    return [torch.Tensor, torch.nn.Module, torch.cuda.Event, torch.cuda.Stream, type(_CUBLAS), threading.Thread]


def _resolved_attributes(cls: type) -> dict[str, Any]:
    """What attribute lookup on `cls` finds for each name: an attribute added to a subclass that
    shadows an inherited one counts as a change."""
    out: dict[str, Any] = {}
    for klass in reversed(cls.__mro__):
        out.update(vars(klass))
    return out


class PatchFingerprint:
    """The identity of every function and class verification and timing rely on."""

    def __init__(self):
        self._namespaces: dict[str, Callable[[], dict]] = {}
        self._objects: dict[tuple[str, str], Any] = {}
        for module in _watched_modules():
            own = module.__name__.startswith("agent_backend")
            self._namespaces[module.__name__] = lambda m=module: vars(m)
            for name, obj in vars(module).items():
                # This package's modules hold nothing a run may rebind; elsewhere only callables
                # matter (flags such as torch.cuda._initialized change legitimately).
                if callable(obj) or (own and not name.startswith("__")):
                    self._objects[(module.__name__, name)] = obj
        for cls in _watched_classes():
            label = f"{cls.__module__}.{cls.__qualname__}"
            self._namespaces[label] = lambda c=cls: _resolved_attributes(c)
            for name, obj in _resolved_attributes(cls).items():
                self._objects[(label, name)] = obj
        self._registrations = _op_registrations()

    def changed(self) -> list[str]:
        """'owner.name' of each watched object that was replaced or removed since this was taken,
        and the watched ops whose kernels changed."""
        now = {label: namespace() for label, namespace in self._namespaces.items()}
        registrations = _op_registrations()
        return ([f"{owner}.{name}" for (owner, name), obj in self._objects.items()
                 if now[owner].get(name, _UNREADABLE) is not obj]
                + [f"the kernels of {op}" for op, dump in self._registrations.items() if registrations[op] != dump])


# ----------------------------------------------------------------------------- threads

def live_threads() -> dict[int, str]:
    """Python threads alive now (any thread running Python code, also ones started through
    _thread), by id, with a name where threading knows one."""
    names = {t.ident: t.name for t in threading.enumerate()}
    return {ident: names.get(ident, f"thread {ident}") for ident in REAL.current_frames()}


def threads_started_since(before: dict[int, str]) -> list[str]:
    return [name for ident, name in live_threads().items() if ident not in before]


# ----------------------------------------------------------------------------- all of it

class StateWatch:
    """Everything a candidate must leave alone, as it was when the watch began."""

    def __init__(self, switches: GlobalSwitches, fingerprint: PatchFingerprint):
        self._switches = switches
        self._fingerprint = fingerprint
        self._threads = live_threads()
        self._settings = switches.snapshot()

    def settings_changed(self, during: str) -> Failure | None:
        """Cheap enough to run after every timed call. Puts changed settings back."""
        changed = self._switches.changed(self._settings)
        if not changed:
            return None
        restored = self._switches.restore(self._settings)
        return Failure("rejected", f"{during} changed torch's global settings ({'; '.join(changed)}): "
                                   "a candidate must set nothing process-wide", restart=not restored)

    def violation(self, during: str) -> Failure | None:
        started = threads_started_since(self._threads)
        if started:
            return Failure("rejected", f"{during} left a thread running ({', '.join(started)}): all work must be "
                                       "finished, or queued on the current CUDA stream, when forward returns",
                           restart=True)
        # Settings first: putting one back can undo what torch itself rebinds for it (the
        # default dtype rebinds torch.Storage); whatever stays replaced means a new worker.
        settings = self.settings_changed(during)
        patched = self._fingerprint.changed()
        if settings:
            return Failure(settings.status, settings.reason, settings.restart or bool(patched))
        if patched:
            return Failure("rejected", f"{during} replaced {', '.join(patched[:5])}: a candidate must not patch "
                                       "torch's or the verifier's functions", restart=True)
        return None
