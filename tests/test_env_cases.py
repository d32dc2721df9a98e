"""Tasks, candidates and a worker-pool fixture shared by the environment's tests (CPU and GPU),
built by hand in the formats of docs/CONTRACTS.md, and a check that each task's program
computes what its signature says."""
from __future__ import annotations

import textwrap

import pytest
import torch

from agent_backend.env import Environment, Timeouts
from agent_backend.env.candidate_loader import load_task
from agent_backend.env.guards import GlobalSwitches, PatchFingerprint
from agent_backend.env.results import precision_settings
from agent_backend.env.verify import CpuRunner, Verifier
from agent_backend.env.worker import _settle_torch
from agent_backend.specs import Candidate, Task, TensorSpec, random_inputs

_PROGRAM = """\
import torch
import torch.nn as nn
aten = torch.ops.aten


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, {args}):
{body}


def get_inputs():
    return [{inputs}]


def get_init_inputs():
    return []
"""


def module_environment(device: str, **limits):
    """A module-scoped `env` fixture: one worker on `device` with these Timeouts, shared by the
    module's tests (workers are slow to start)."""
    @pytest.fixture(scope="module")
    def env():
        with Environment([device], Timeouts(**limits)) as pool:
            yield pool
    return env


def contiguous(shape: tuple[int, ...], dtype: str, device: str) -> TensorSpec:
    stride, step = [], 1
    for n in reversed(shape):
        stride.insert(0, step)
        step *= n
    return TensorSpec(tuple(shape), tuple(stride), dtype, device)


def make_task(name: str, body: str, inputs: list[TensorSpec], outputs: list[TensorSpec], kind: str,
              ops: tuple[str, ...]) -> Task:
    """A task whose Model.forward(in0, in1, ...) runs `body` (which returns the outputs), made of `ops`."""
    args = ", ".join(f"in{i}" for i in range(len(inputs)))
    makers = ", ".join(f"torch.randn({s.shape}, dtype=torch.{s.dtype}, device={s.device!r})" for s in inputs)
    program = _PROGRAM.format(args=args, body=textwrap.indent(textwrap.dedent(body).strip(), " " * 8), inputs=makers)
    return Task(hash=name, program=program, inputs=tuple(inputs), outputs=tuple(outputs), ops=ops, kind=kind)


_CANDIDATE = """\
import torch
import torch.nn as nn
{header}


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
{init}

    def forward(self, {args}):
{body}
"""


def make_candidate(body: str, args: str = "a, b", init: str = "pass", header: str = "") -> Candidate:
    """A candidate whose forward(args) runs `body`; `init` runs in __init__, `header` at import."""
    source = _CANDIDATE.format(header=textwrap.dedent(header).strip(), args=args,
                               init=textwrap.indent(textwrap.dedent(init).strip(), " " * 8),
                               body=textwrap.indent(textwrap.dedent(body).strip(), " " * 8))
    return Candidate(source, "test")


def add_relu_task(device: str = "cpu", shape=(32, 64), dtype: str = "float32") -> Task:
    spec = contiguous(shape, dtype, device)
    return make_task(f"add_relu_{device}_{dtype}", "return aten.relu.default(aten.add.Tensor(in0, in1))",
                     [spec, spec], [spec], "pointwise", ("aten.add.Tensor", "aten.relu.default"))


class AddRelu(torch.nn.Module):
    """add_relu_task's program as an in-process module, `shift` off where asked."""

    def __init__(self, shift: float = 0.0):
        super().__init__()
        self.shift = shift

    def forward(self, a, b):
        return torch.relu(a + b) + self.shift


def cpu_verifier(candidate: torch.nn.Module, reference: torch.nn.Module, task: Task | None = None) -> Verifier:
    """An in-process verifier of `task` (add_relu_task's) on the CPU, taken as a worker takes it."""
    _settle_torch()  # what torch patches into itself on first use is not the candidate's doing
    return Verifier(candidate, reference, task or add_relu_task(), torch.device("cpu"), precision_settings(None),
                    CpuRunner(), GlobalSwitches("cpu"), PatchFingerprint(), seed=0)


def sum_diff_task(device: str = "cpu", shape=(16, 8)) -> Task:
    """Two outputs: in0 + in1 and in0 - in1."""
    spec = contiguous(shape, "float32", device)
    return make_task(f"sum_diff_{device}", "return aten.add.Tensor(in0, in1), aten.sub.Tensor(in0, in1)",
                     [spec, spec], [spec, spec], "pointwise", ("aten.add.Tensor", "aten.sub.Tensor"))


def matmul_task(device: str = "cpu", m: int = 256, k: int = 1024, n: int = 256, dtype: str = "float32") -> Task:
    a, b, out = contiguous((m, k), dtype, device), contiguous((k, n), dtype, device), contiguous((m, n), dtype, device)
    return make_task(f"mm_{device}_{dtype}_{m}x{k}x{n}", "return aten.mm.default(in0, in1)", [a, b], [out], "matmul",
                     ("aten.mm.default",))


GOOD_ADD_RELU = make_candidate("return torch.relu(a + b)")


@pytest.mark.parametrize("task", [add_relu_task(), sum_diff_task(), matmul_task(m=8, k=16, n=4)],
                         ids=lambda t: t.hash)
def test_task_program_matches_its_signature(task):
    _, model = load_task(task.program, torch.device("cpu"))
    outputs = model(*random_inputs(task.inputs, 0))
    outputs = outputs if isinstance(outputs, tuple) else (outputs,)
    assert [TensorSpec.of(o) for o in outputs] == list(task.outputs)


# A cheat that allocates its output on every verified call, then, once timed, writes every result
# into one buffer it keeps: correct values, but a caller holding an earlier result sees it change.
STATIC_OUTPUT_ONCE_TIMED = make_candidate("""
        self.calls += 1
        if self.calls <= 12:
            return torch.relu(a + b)
        if self.out is None:
            self.out = torch.empty_like(a)
        return torch.add(a, b, out=self.out).relu_()
    """, init="self.calls = 0\nself.out = None")


# A cheat that behaves while verified and replays cached results once timing repeats inputs.
CACHES_ONCE_TIMED = make_candidate("""
        self.calls += 1
        key = (a.data_ptr(), b.data_ptr())
        if self.calls > 12 and key in self.cache:
            return self.cache[key].clone()
        self.cache[key] = torch.relu(a + b)
        return self.cache[key].clone()
    """, init="self.calls = 0\nself.cache = {}")
