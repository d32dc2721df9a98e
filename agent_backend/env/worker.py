"""A worker process: the only place a candidate's code runs.

Started by pool.WorkerHandle as `python -c "from agent_backend.env.worker import main; main()"
FD DEVICE PARENT_PID`, in a session of its own, with stdout and stderr going to a log file. It
serves one request at a time over the socket FD, as JSON (never pickle: what comes back must
not be able to run code in the caller). The caller enforces the time limits and kills the
worker when one passes; faulthandler dumps the stacks to the log shortly before, so the caller
can say where a candidate hung or crashed.

Requests ("op"): "prepare" (compile the task's reference with Inductor, once per task),
"load" (execute the candidate's source, build ModelNew), "verify", "profile". The candidate is
dropped after the last phase of its evaluation. "reference" times Inductor's reference alone,
as "profile" times it beside a candidate, and reports this GPU's floors (for the gate).
"context" times a whole graph with and without our winners in it (the in-context check).
"""
from __future__ import annotations

import faulthandler
import gc
import importlib
import json
import os
import sys
import threading
import time
import traceback
from collections import OrderedDict
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from types import ModuleType
from typing import Callable

import torch

from agent_backend import runtime
from agent_backend.env import float64, launch_op
from agent_backend.env.candidate_loader import CandidateError, describe_exception, load_candidate, load_task, unload
from agent_backend.env.compare import compare_values, layout_problem, tolerance
from agent_backend.env.floors import copy_call, gpu_key, load_or_measure, measure_floors
from agent_backend.env.guards import REAL, GlobalSwitches, PatchFingerprint, StateWatch, precision_context
from agent_backend.env.profile import (INPUT_SETS, CudaTimer, less_favourable_flush, make_timer, profile_candidate,
                                       time_contenders)
from agent_backend.env.results import Failure, counted_ms
from agent_backend.env.verify import (CpuRunner, CudaRunner, TorchOpRecorder, Verifier, cuda_usable,
                                      failure_from_exception, new_seed, output_list, sleep_cycles_per_ms)
from agent_backend.specs import Candidate, Task, random_inputs

_TASKS_KEPT = 8  # task references (and their Inductor compilations) kept per worker
CACHE_KEPT_BYTES = 1 << 30  # freed GPU memory a worker keeps cached between requests


@dataclass
class TaskState:
    module: ModuleType
    model: torch.nn.Module
    compiled: torch.nn.Module | None = None
    inductor_error: str | None = None


@dataclass
class Loaded:
    task: Task
    state: TaskState
    module: ModuleType
    model: torch.nn.Module
    precision: dict
    fingerprint: PatchFingerprint
    verifier: Verifier | None = None  # set by verify, used by profile


def _settle_torch() -> None:
    """Trigger what torch patches into itself on first use (importing dynamo wraps
    torch.manual_seed; its first compile replaces nn.Module.__init__), so that the patch check
    does not blame it on the first candidate."""
    with TorchOpRecorder():
        torch.ones(1).add(1)
    torch.compile(lambda x: x + 1, backend="eager")(torch.ones(1))


class Worker:
    def __init__(self, device: str):
        self.start_s: dict[str, float] = {}  # seconds of each part of the start-up (sent with "ready")
        clock = time.monotonic()

        def part(name: str) -> None:
            nonlocal clock
            now = time.monotonic()
            self.start_s[name] = round(now - clock, 3)
            clock = now
        _settle_torch()
        part("torch")
        self.device = torch.device(device)
        self.cycles_per_ms = 0.0
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
            torch.ones(1, device=self.device).add_(1).item()  # create the context now, not in a timed phase
            part("cuda_context")
            try:
                launch_op.native()  # built (once) here, not in a candidate's compile phase
                importlib.import_module("agent_backend.env.graph_launch")  # what a profile calls: watched from now
            except Exception as exc:  # launch-spec candidates then fail to load, saying why
                print(f"cuda_agent worker: the launch op does not build: {exc}", file=sys.stderr)
            part("launch_op")
            self.cycles_per_ms = sleep_cycles_per_ms(self.device)
            part("sleep_calibration")
        self.switches = GlobalSwitches(self.device.type)
        self.tasks: OrderedDict[str, TaskState] = OrderedDict()
        self.loaded: Loaded | None = None
        self.floors: dict | None = None  # this GPU's floors, once asked for
        self._handlers = {"prepare": self._prepare, "load": self._load, "verify": self._verify,
                          "profile": self._profile, "reference": self._reference,
                          "context": self._context}

    def handle(self, request: dict) -> dict:
        timeout_s = float(request.get("timeout_s", 60.0))
        # Dump every stack to the log just before the caller's limit, so it can say where it hung.
        faulthandler.dump_traceback_later(max(timeout_s - 1.0, 0.8 * timeout_s))
        try:
            reply = self._handlers[request["op"]](request)
        except torch.OutOfMemoryError as exc:  # the task's trials or timing beside what else holds the GPU
            self._unload()  # the context is sound: the worker stays, without the candidate's trials
            reply = Failure("runtime_error", f"out of GPU memory: {describe_exception(exc)}").to_json()
        except Exception:  # our own failure; the candidate's are caught where it runs
            return Failure("runtime_error", f"the verifier failed: {traceback.format_exc(limit=-6)}",
                           restart=True).to_json()
        finally:
            faulthandler.cancel_dump_traceback_later()
        if not reply.get("restart"):  # a worker about to be replaced may have a broken context
            self._give_back_cached_memory()
        return reply

    def _give_back_cached_memory(self) -> None:
        """Return the allocator's cache to the device where more than CACHE_KEPT_BYTES of it is
        free: a worker idles between requests, and what a big task's trials left cached (on an
        H200, 105-120 GB after softmax over 4096 x 393216 fp32) ran the user's process out of
        memory as it went on to compile and run the model."""
        if self.device.type == "cuda" and (torch.cuda.memory_reserved(self.device)
                                           - torch.cuda.memory_allocated(self.device)) > CACHE_KEPT_BYTES:
            torch.cuda.empty_cache()

    def _task_state(self, task: Task) -> TaskState:
        if task.hash in self.tasks:
            self.tasks.move_to_end(task.hash)
        else:
            self.tasks[task.hash] = TaskState(*load_task(task.program, self.device))
            while len(self.tasks) > _TASKS_KEPT:
                self.tasks.popitem(last=False)
        return self.tasks[task.hash]

    def _sync(self) -> None:
        if self.device.type == "cuda":
            REAL.cuda_synchronize()

    def _prepare(self, request: dict) -> dict:
        """Compile the reference with Inductor before any candidate of this task runs here."""
        state = self._compiled(Task.from_json(request["task"]), request["precision"])
        return {"ok": state.compiled is not None, "error": state.inductor_error}

    def _compiled(self, task: Task, precision: dict) -> TaskState:
        """The task's state, its program compiled by Inductor (once; or why that failed)."""
        state = self._task_state(task)
        if state.compiled is None and state.inductor_error is None:
            try:
                with precision_context(self.switches, precision), torch.no_grad():
                    compiled = torch.compile(state.model, backend="inductor", dynamic=False)
                    compiled(*random_inputs(task.inputs, 0, device=str(self.device)))
                    self._sync()
                state.compiled = compiled
            except Exception as exc:
                state.inductor_error = f"Inductor could not compile the task: {describe_exception(exc)}"
        return state

    def _context(self, request: dict) -> dict:
        """A whole graph as Inductor compiles it ("before") against the same graph calling our
        winners ("after"), both compiled with Inductor: they must agree on one input set, then
        they are timed interleaved (agent_backend/in_context.py). The winners are verified
        kernels from the caller's cache, loaded here as a compiled graph loads them. A graph that
        draws random numbers ("compare": false) is timed without the agreement check."""
        before, after = Task.from_json(request["before"]), Task.from_json(request["after"])
        precision = request["precision"]
        winners = [runtime.Winner.from_json(w) for w in request["winners"]]
        try:
            for winner in winners:
                runtime.load_winner(winner, self.device)
            compiled = {}
            for name, task in (("inductor", before), ("ours", after)):
                state = self._compiled(task, precision)
                if state.compiled is None:
                    return {"status": "compile_error", "reason": f"{name}: {state.inductor_error}"}
                compiled[name] = state.compiled
            input_sets = self._input_sets(before, new_seed())
            with precision_context(self.switches, precision), torch.no_grad():
                problem = request.get("compare", True) and _disagreement(
                    compiled["ours"](*input_sets[0]), compiled["inductor"](*input_sets[0]), before, precision,
                    lambda: float64.evaluate(self._task_state(before).model, input_sets[0]))
                if problem:
                    return {"status": "incorrect", "reason": f"the graph with our kernels disagrees: {problem}"}
                timer = make_timer(self.device, self.cycles_per_ms)
                stats, _ = time_contenders(compiled, input_sets, timer)
            ours, inductor, flush = less_favourable_flush(stats["ours"], stats["inductor"])
            return {"status": "passed", "reason": "", "ours_ms": counted_ms(ours), "inductor_ms": counted_ms(inductor),
                    "ours_gpu_ms": ours["median"], "inductor_gpu_ms": inductor["median"],
                    "ours_host_ms": ours["host_median"], "inductor_host_ms": inductor["host_median"],
                    "timer": timer.description, "judged_flush": flush}
        finally:
            for winner in winners:
                runtime.forget(winner.key)
            self.tasks.pop(after.hash, None)  # it calls winners no longer registered here

    def _reference(self, request: dict) -> dict:
        """Time Inductor's reference (compiled by "prepare") with the profiler's method, on a GPU
        interleaved with a copy of `copy_bytes` where the request names them (the gate's floor:
        the two see the same clocks and the same fixed costs), and add this GPU's floors when
        `floors_path` names their file."""
        task = Task.from_json(request["task"])
        state = self._task_state(task)
        if state.compiled is None:
            return {"status": "runtime_error",
                    "reason": state.inductor_error or "Inductor's reference is not compiled in this worker"}
        input_sets = self._input_sets(task, new_seed())
        contenders = {"inductor": state.compiled}
        copy_bytes = request.get("copy_bytes")
        # where the copy's two buffers would take more than half the free memory (a model's logits),
        # no copy: no gate, rather than a worker lost to running out of memory
        if copy_bytes and self.device.type == "cuda" and copy_bytes <= torch.cuda.mem_get_info(self.device)[0] // 2:
            contenders["copy"] = copy_call(copy_bytes, self.device)
        with precision_context(self.switches, request["precision"]), torch.no_grad():
            timer = make_timer(self.device, self.cycles_per_ms)
            stats, _ = time_contenders(contenders, input_sets, timer)
        reply = {"status": "passed", "reason": "", "inductor_ms": stats["inductor"], "copy_ms": stats.get("copy"),
                 "timer": timer.description}
        if request.get("floors_path"):
            reply.update(self._floors(Path(request["floors_path"])))
        return reply

    def _floors(self, path: Path) -> dict:
        if self.device.type != "cuda":
            return {"floors": None, "floors_note": "floors are measured on CUDA GPUs only"}
        if self.floors is None:
            key = gpu_key(self.device.index)
            floors = load_or_measure(path, key, lambda: measure_floors(
                self.device, CudaTimer(self.device, self.cycles_per_ms), lambda p: precision_context(self.switches, p)))
            self.floors = {"floors": floors.to_json(), "floors_key": key}
        return self.floors

    def _input_sets(self, task: Task, seed: int) -> list[list[torch.Tensor]]:
        """Input sets for timing `task` here, drawn from seed, seed + 1, ...: INPUT_SETS, or fewer
        (at least one) where they would take more than half the GPU's free memory. A whole graph's
        inputs can be a model's weights; one op's, 6 GB tensors (softmax over 4096 x 393216 fp32)
        beside the verifier's trials, which took the rest of an H200, so timing ran out of memory
        with four sets."""
        return [random_inputs(task.inputs, seed + k, device=str(self.device))
                for k in range(self._input_sets_that_fit(task))]

    def _input_sets_that_fit(self, task: Task) -> int:
        if self.device.type != "cuda":
            return INPUT_SETS
        free, _ = torch.cuda.mem_get_info(self.device)
        per_set = max(sum(s.storage_bytes() for s in task.inputs), 1)
        return max(1, min(INPUT_SETS, int(0.5 * free // per_set)))

    def _load(self, request: dict) -> dict:
        self._unload()
        task, candidate = Task.from_json(request["task"]), Candidate.from_json(request["candidate"])
        state = self._task_state(task)
        fingerprint = PatchFingerprint()
        start = time.perf_counter()
        with precision_context(self.switches, request["precision"]):
            watch = StateWatch(self.switches, fingerprint)
            try:
                module, model = load_candidate(candidate.source, state.module, self.device, request.get("build_root"))
                failure = watch.violation("loading the candidate")
            except CandidateError as exc:
                module, failure = None, watch.violation("loading the candidate") or Failure("compile_error", str(exc))
        compile_s = time.perf_counter() - start
        if failure is None:
            self.loaded = Loaded(task, state, module, model, request["precision"], fingerprint)
            return {"status": "loaded", "compile_s": compile_s}
        if module is not None:
            unload(module)
        if self.device.type == "cuda" and not cuda_usable(self.device):
            failure = Failure("crash", f"loading the candidate broke the CUDA context: {failure.reason}", restart=True)
        return {**failure.to_json(), "compile_s": compile_s}

    def _runner(self) -> CpuRunner | CudaRunner:
        return CudaRunner(self.device, self.cycles_per_ms) if self.device.type == "cuda" else CpuRunner()

    def _verify(self, request: dict) -> dict:
        loaded = self.loaded
        with precision_context(self.switches, loaded.precision):
            loaded.verifier = Verifier(loaded.model, loaded.state.model, loaded.task, self.device, loaded.precision,
                                       self._runner(), self.switches, loaded.fingerprint, new_seed())
            failure = loaded.verifier.run()
        details = loaded.verifier.details()
        if not (failure and failure.restart or request.get("keep")):
            self._unload()  # not where the worker is about to be replaced: freeing may touch a broken context
        if failure:
            return {**failure.to_json(), "verification": details}
        return {"status": "passed", "reason": "", "verification": details}

    def _profile(self, request: dict) -> dict:
        loaded = self.loaded
        task, state, verifier = loaded.task, loaded.state, loaded.verifier
        verifier.before_timing()
        input_sets = self._input_sets(task, verifier.seed + 1000)
        ours, dispatch = runtime.as_called_by_a_graph(loaded.model, task.outputs, task.program, self.device)
        contenders = {"ours": ours, "eager": state.model}
        if state.compiled is not None:
            contenders["inductor"] = state.compiled
        note = None if state.compiled is not None else (request.get("inductor_note") or state.inductor_error
                                                        or "Inductor's reference was not compiled in this worker")
        with precision_context(self.switches, loaded.precision), torch.no_grad():
            watch = StateWatch(self.switches, loaded.fingerprint)
            try:
                timer = make_timer(self.device, self.cycles_per_ms)
                profile, failure = profile_candidate(verifier, contenders, input_sets, timer, watch,
                                                     float(request["min_speedup"]), note)
            except BaseException as exc:
                profile, failure = None, failure_from_exception(exc, self.device, "timing")
        if not (failure and failure.restart):
            self._unload()
        if failure:
            return {**failure.to_json(), "verification": verifier.details()}
        return {"status": "passed", "reason": "", "profile": {**profile, "dispatch": dispatch},
                "verification": verifier.details()}

    def _unload(self) -> None:
        if self.loaded is not None:
            runtime.forget(runtime.PROFILED_KEY)
            unload(self.loaded.module)
            self.loaded = None
            gc.collect()


def _disagreement(got, expected, task: Task, precision: dict, exact: Callable[[], list[torch.Tensor]]) -> str | None:
    """Where the graph with our kernels (`got`) differs from Inductor's (`expected`) beyond the
    outputs' tolerance, if it does. Values beyond it are judged as the verifier judges a
    candidate: against `exact()`, the graph evaluated in float64, ours may be at most
    float64.ACCURACY_FACTOR times less accurate than Inductor's (a deep bf16 graph's two
    roundings drift apart further than any fixed tolerance, and ours may be the closer one)."""
    got, expected = output_list(got), output_list(expected)
    if len(got) != len(expected):
        return f"{len(got)} outputs, expected {len(expected)}"
    differ = None  # the first output whose values differ beyond tolerance
    for i, (g, e, spec) in enumerate(zip(got, expected, task.outputs)):
        layout = layout_problem(i, g, e)
        if layout:  # a layout is never a matter of rounding
            return layout
        differ = differ or compare_values(i, g, e, tolerance(spec.torch_dtype, precision, task.ops)).problem
    if differ is None:
        return None
    try:
        exact_outputs = exact()
    except Exception as exc:  # no float64 evaluation here (an op without a float64 kernel, memory)
        return f"{differ} (no float64 evaluation to judge by: {describe_exception(exc)})"
    for i, (g, e, ex) in enumerate(zip(got, expected, exact_outputs)):
        problem = float64.accuracy_problem(i, float64.relative_error(g, ex), float64.relative_error(e, ex), e.dtype)
        if problem:
            return f"{differ}; {problem}"
    return None


def _exit_when_orphaned(parent_pid: int) -> None:
    """A worker whose caller died must not run on (it may be stuck in a candidate's loop)."""
    while True:
        time.sleep(1.0)
        if os.getppid() != parent_pid:
            os._exit(1)


def _send(conn: Connection, message: dict) -> None:
    conn.send_bytes(json.dumps(message).encode())


def main() -> None:
    fd, device, parent_pid = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    os.set_inheritable(fd, False)  # programs a candidate starts must not hold the caller's line open
    conn = Connection(fd)
    faulthandler.enable()
    threading.Thread(target=_exit_when_orphaned, args=(parent_pid,), daemon=True, name="orphan-watch").start()
    worker = Worker(device)
    _send(conn, {"ready": True, "pid": os.getpid(), "start_s": worker.start_s})
    while True:
        try:
            request = json.loads(conn.recv_bytes())
        except EOFError:
            return
        _send(conn, worker.handle(request))
