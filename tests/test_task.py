"""Task programs run standalone and match their subgraph; hashes are canonical."""
import subprocess
import sys

import pytest
import torch
import torch.nn as nn

from agent_backend.specs import Task, TensorSpec, random_inputs
from agent_backend.task import load_program
from helpers import collect_tasks
from models import SwishBiasScale, MLP


class Chain(nn.Module):
    def __init__(self, scale=0.5, act=torch.sigmoid):
        super().__init__()
        self.scale, self.act = scale, act

    def forward(self, x, y):
        return self.act(x * self.scale + y).sum(-1)


class RenamedChain(nn.Module):
    """Same computation as Chain(), other names everywhere."""

    def forward(self, first, second):
        scaled = first * 0.5
        return torch.sigmoid(scaled + second).sum(-1)


def _hashes(model, n=2):
    inputs = [torch.randn(4, 8) for _ in range(n)]
    return sorted(t.hash for t in collect_tasks(model, inputs, backward=False))


@pytest.fixture(scope="module")
def swish_tasks():
    torch.manual_seed(0)
    return collect_tasks(SwishBiasScale(), [torch.randn(16, 48), torch.randn(16, 48)])


def test_program_matches_subgraph(swish_tasks):
    assert swish_tasks, "no task extracted"
    for task in swish_tasks:
        ns = load_program(task.program)
        model = ns["Model"](*ns["get_init_inputs"]())
        for seed in range(3):
            inputs = random_inputs(task.inputs, seed)
            expected = task.graph_module(*inputs)
            got = model(*inputs)
            got = (got,) if isinstance(got, torch.Tensor) else got
            assert len(got) == len(expected) == len(task.outputs)
            for g, e, spec in zip(got, expected, task.outputs):
                assert torch.equal(g, e)
                assert tuple(g.shape) == spec.shape and str(g.dtype) == f"torch.{spec.dtype}"


def test_program_runs_standalone(swish_tasks, tmp_path):
    """Only torch is needed: run it in a fresh interpreter with get_inputs()."""
    task = swish_tasks[0]
    path = tmp_path / "task.py"
    path.write_text(task.program + "\nout = Model(*get_init_inputs())(*get_inputs())\nprint('ran', type(out).__name__)\n")
    out = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "ran" in out.stdout


def test_task_json_round_trip(swish_tasks):
    t = swish_tasks[0]
    back = Task.from_json(t.to_json())
    assert back == t and back.program == t.program


def test_hash_ignores_names():
    assert _hashes(Chain()) == _hashes(RenamedChain())


def test_hash_changes_with_constant_and_op():
    base = _hashes(Chain())
    assert _hashes(Chain(scale=0.25)) != base
    assert _hashes(Chain(act=torch.tanh)) != base


def test_hash_stable_across_processes():
    code = ("import torch, sys; sys.path.insert(0, 'tests'); from test_task import Chain, _hashes; "
            "print(' '.join(_hashes(Chain())))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == _hashes(Chain())


def test_mlp_tasks_cover_forward_and_backward():
    torch.manual_seed(0)
    tasks = collect_tasks(MLP(), [torch.randn(8, 32, requires_grad=True)])
    kinds = {t.kind for t in tasks}
    assert "matmul" in kinds
    assert all(t.inputs and t.outputs for t in tasks)


def test_random_inputs_follow_the_seed_spec_and_draw():
    specs = [TensorSpec((3, 4), (1, 3), "float32", "cpu"), TensorSpec((5,), (1,), "bfloat16", "cpu"),
             TensorSpec((2, 2), (2, 1), "bool", "cpu")]
    a, b = random_inputs(specs, 7), random_inputs(specs, 7)
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert not torch.equal(a[0], random_inputs(specs, 8)[0])
    assert a[0].stride() == (1, 3) and a[1].dtype == torch.bfloat16 and a[2].dtype == torch.bool
    big = random_inputs([TensorSpec((4096,), (1,), "float32", "cpu")], 0, scale=0.1, offset=3.0)[0]
    assert abs(big.mean().item() - 3.0) < 0.02 and abs(big.std().item() - 0.1) < 0.01


def test_a_constant_is_an_input_of_a_pointwise_task_and_computed_in_an_attention_task():
    """Llama's rotary frequencies times positions built from iota: the pointwise task takes the
    positions as an input, as a template's kernel reads them; a fused attention call's task
    computes its mask, whose value its rules read (tests/test_fused_attention_rules.py)."""
    class Rope(nn.Module):
        def forward(self, inv_freq):
            pos = torch.arange(16, device=inv_freq.device).float()
            return (inv_freq[:, None] * pos[None, :]).cos() + 1.0

    (task,) = collect_tasks(Rope(), [torch.randn(8)], backward=False, min_ops=2)
    assert task.kind == "pointwise" and "iota" not in task.program and len(task.inputs) == 2
