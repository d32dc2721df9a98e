"""Runtime dispatch: a verified winner runs in place of its subgraph through one custom op.

A winner whose candidate is a launch spec (env/launch_spec.py) is called as
`torch.ops.cuda_agent.launch.in<N>(key, program, *inputs)` (N inputs one by one; a list past
eight): the C++ op (env/launch_op.py) checks the
inputs, allocates the outputs and launches, with no Python in the call. Inductor's Python
wrapper calls that C++ kernel directly, past torch.ops (env/launch_lowering.py). Any other winner is
called as `torch.ops.cuda_agent.run_winner(key, program, inputs)`, an op with a Python kernel
that runs its ModelNew. Inductor sees an opaque extern kernel whose outputs come from the op's fake (Meta)
implementation, and compiles everything around it. A winner lives in this process's registry,
loaded only after it passed verification (or came from a trusted cache layer).

When Inductor's FX graph cache replays a compiled graph, our pass does not run, so the winner is
loaded on its first call from the local kernel cache (which holds only verified or trusted
entries; a launch spec comes back as data, no candidate code runs); the launch op hands a key it
does not know to run_winner, which loads it. Should it be gone from there, the subgraph's own
program (`program`, the task's reference in plain torch ops) computes the result instead:
slower, never wrong.
"""
from __future__ import annotations

import contextlib
import functools
import json
import logging
import threading
from dataclasses import dataclass, field
from typing import Callable

import torch

from .env import launch_lowering, launch_op  # launch_op defines torch.ops.cuda_agent.launch
from .env.compare import share_memory
from .env.launch_spec import LaunchSpec
from .specs import TensorSpec
from .task import load_program

log = logging.getLogger("cuda_agent")


def _instantiate(key: str, source: str, origin: str, device: torch.device) -> torch.nn.Module:
    """Execute a verified candidate's source with `device` current (kernels load into the
    current device's context) and return its ModelNew()."""
    namespace: dict = {"__name__": f"cuda_agent_winner_{key[:12]}"}
    context = torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()
    with context:
        exec(compile(source, f"<winner {key[:12]} {origin}>", "exec"), namespace)
        return namespace["ModelNew"]()


@dataclass
class Winner:
    """A verified kernel for one task signature, loaded once per device it runs on. `spec`: its
    launch spec, where its candidate is one (from the cache entry, or found by running the
    source); such a winner runs through the launch op, registered under `key`."""

    key: str
    source: str
    outputs: tuple[TensorSpec, ...]
    origin: str
    spec: LaunchSpec | None = None
    run_winner_calls: int = 0
    forwards: dict = field(default_factory=dict)  # torch.device -> forward(*inputs)

    def to_json(self) -> dict:
        """What a worker needs to load it again (its spec comes back from running the source)."""
        return {"key": self.key, "source": self.source, "origin": self.origin,
                "outputs": [s.to_json() for s in self.outputs]}

    @classmethod
    def from_json(cls, d: dict) -> "Winner":
        return cls(d["key"], d["source"], tuple(TensorSpec.from_json(s) for s in d["outputs"]), d["origin"])

    @property
    def calls(self) -> int:
        """Calls in this process: a launch spec's launches (through either op), else run_winner's."""
        return launch_op.launch_count(self.key) if self.spec is not None else self.run_winner_calls

    def forward_on(self, device: torch.device) -> Callable[..., object]:
        forward = self.forwards.get(device)
        if forward is None:
            if self.spec is None:
                model = _instantiate(self.key, self.source, self.origin, device)
                self.spec = launch_op.spec_of(type(model))
                forward = model.forward
            if self.spec is not None:
                launch_op.register(self.key, self.spec, device.index if device.type == "cuda" else None)
                forward = launch_op.launcher(self.key, "", len(self.spec.inputs))
            self.forwards[device] = forward
        return forward


_registry: dict[str, Winner] = {}
_lock = threading.Lock()
# Where winners not loaded by this process's compiles can be found: one lookup per kernel cache
# the backend opened, by cache directory (key digest -> Winner, or None).
_winner_sources: dict[str, Callable[[str], Winner | None]] = {}
_references: dict[str, Callable[..., object]] = {}  # key -> the task program's Model().forward


def register(winner: Winner) -> None:
    with _lock:
        _registry[winner.key] = winner


def registered(key: str) -> Winner | None:
    return _registry.get(key)


def add_winner_source(name: str, lookup: Callable[[str], Winner | None]) -> None:
    with _lock:
        _winner_sources[name] = lookup


def _load_from_sources(key: str, device: torch.device) -> Winner | None:
    """A winner for `key` from a kernel cache, loaded on `device` and registered; None if no
    cache has it or it no longer loads."""
    for lookup in list(_winner_sources.values()):
        winner = lookup(key)
        if winner is None:
            continue
        try:
            return load_winner(winner, device)
        except Exception as e:  # a cached winner that no longer loads: the program takes over
            log.warning("cuda_agent: cached kernel %s failed to load (%s)", key[:12], e)
            return None
    return None


def program_arg(program: str) -> str:
    """A task's program as our ops take it: on one line (JSON), because Inductor copies the
    arguments of the nodes a fused kernel reads into comments of the code it generates, where a
    newline ends the comment and the rest of the program becomes code (a SyntaxError; torch's
    get_kernel_metadata splits such lines only on ROCm)."""
    return json.dumps(program)


def _reference(key: str, program: str) -> Callable[..., object]:
    """The task's own program (`program`, as program_arg wrote it), for a winner that cannot be
    found (warned once per key)."""
    with _lock:
        forward = _references.get(key)
        if forward is None:
            log.warning("cuda_agent: kernel %s is not in the kernel cache any more; its subgraph runs as plain "
                        "torch ops. torch._dynamo.reset() and a new compile give Inductor's kernels back.", key[:12])
            namespace = load_program(json.loads(program), f"<task of {key[:12]}>")
            forward = _references[key] = namespace["Model"](*namespace["get_init_inputs"]()).forward
    return forward


def load_winner(winner: Winner, device: torch.device | str) -> Winner:
    """Load a verified winner on `device` now (at compile time a load failure shows where
    Inductor can still take over) and register it; other devices load on first use. A bare
    "cuda" means the current CUDA device."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    winner.forward_on(device)
    register(winner)
    return winner


PROFILED_KEY = "candidate being profiled"


def as_called_by_a_graph(model: torch.nn.Module, outputs: tuple[TensorSpec, ...], program: str,
                         device: torch.device) -> tuple[Callable[..., object], str]:
    """`model`, a verified candidate's ModelNew, called the way a compiled graph would call it
    as a winner (for timing what a user pays), and the op's name: the launch op for a launch
    spec; else run_winner, with the model registered under PROFILED_KEY until the next call
    (or forget(PROFILED_KEY))."""
    spec = launch_op.spec_of(type(model))
    if spec is not None:
        op = launch_op.launch_overload(len(spec.inputs))
        if launch_lowering.install():  # a graph's wrapper calls the op's C++ kernel directly
            from .env import graph_launch  # loads the op's extension

            return functools.partial(graph_launch.launch, spec.digest, program_arg(program)), f"{op.name()}, direct"
        return launch_op.launcher(spec.digest, program_arg(program), len(spec.inputs)), str(op.name())
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    register(Winner(PROFILED_KEY, "", outputs, "profiled", forwards={device: model.forward}))
    op, arg = torch.ops.cuda_agent.run_winner.default, program_arg(program)
    return (lambda *inputs: op(PROFILED_KEY, arg, list(inputs))), str(op.name())


def forget(key: str) -> None:
    with _lock:
        _registry.pop(key, None)


def call_for(key: str, program: str, inputs: list) -> tuple[torch._ops.OpOverload, tuple]:
    """The op a graph calls for the winner registered under `key`, and its arguments: the launch
    op for a launch spec (launch_op.launch_call; its lowering installed, so that Inductor's wrapper
    calls its kernel directly), else run_winner(key, program, inputs)."""
    winner = _registry.get(key)
    if winner is not None and winner.spec is not None:
        launch_lowering.install()
        return launch_op.launch_call(key, program, inputs)
    return torch.ops.cuda_agent.run_winner.default, (key, program, list(inputs))


def _conform(out: torch.Tensor, spec: TensorSpec) -> torch.Tensor:
    """Give the output the strides Inductor planned for (its fake tensor had them)."""
    if tuple(out.stride()) == spec.stride or out.numel() <= 1:
        return out
    fixed = torch.empty_strided(spec.shape, spec.stride, dtype=out.dtype, device=out.device)
    return fixed.copy_(out)


# Defined on a torch.library.Library, as the launch op is, rather than with
# torch.library.custom_op, whose autograd wrapper and aliasing check cost about 8 us of host
# time per call (benchmarks/run_winner_host.py, on the CPU of a 2-core build machine).
# Compiled graphs call it after autograd, and verified winners return fresh outputs (the
# verifier refuses one sharing an input's memory).
_library = torch.library.Library("cuda_agent", "FRAGMENT")
_library.define("run_winner(str key, str program, Tensor[] inputs) -> Tensor[]", tags=launch_op.EXACT_STRIDES)


def run_winner(key: str, program: str, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    device = inputs[0].device
    winner = _registry.get(key)
    if winner is None and key not in _references:  # a winner found missing once stays missing
        winner = _load_from_sources(key, device)
    if winner is None:
        return [_fresh(o, inputs) for o in _as_list(_reference(key, program)(*inputs))]
    winner.run_winner_calls += 1
    outs = _as_list(winner.forward_on(device)(*inputs))
    return [_conform(o, s) for o, s in zip(outs, winner.outputs)]


_library.impl("run_winner", run_winner, "CompositeExplicitAutograd")


def _as_list(result) -> list[torch.Tensor]:
    return [result] if isinstance(result, torch.Tensor) else list(result)


def _fresh(out: torch.Tensor, inputs: list[torch.Tensor]) -> torch.Tensor:
    """`out`, or a copy where it is (a view of) an input: the op's outputs are new tensors."""
    return out.clone() if any(share_memory(out, t) for t in inputs) else out


@torch.library.register_fake("cuda_agent::run_winner")
def _run_winner_fake(key: str, program: str, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    winner = _registry.get(key)
    if winner is None:
        raise RuntimeError(f"cuda_agent: no kernel registered for {key!r}")
    device = inputs[0].device if inputs else torch.device("cpu")
    return [torch.empty_strided(s.shape, s.stride, dtype=s.torch_dtype, device=device) for s in winner.outputs]
