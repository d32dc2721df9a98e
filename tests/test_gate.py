"""The gate's arithmetic (agent_backend/gate.py): bytes each storage once, FLOPs from the task's
graph at the precisions the user allows, the floor as the longest bound, and the decision to
skip a search only where no kernel could beat Inductor by min_speedup."""
import dataclasses

import pytest
import torch

from agent_backend import gate
from agent_backend.gate import Floor, Floors, Work
from agent_backend.options import resolve
from agent_backend.specs import Task, TensorSpec
from helpers import collect_tasks

FLOORS = Floors(host_ms=0.004, peak_tflops={"fp32": 50.0, "tf32": 400.0, "bf16": 800.0, "fp16": 800.0})
STRICT = {"allow_tf32": False, "allow_cudnn_tf32": False, "matmul_precision": "highest",
          "allow_reduced_precision": False}


def spec(shape, stride, dtype="float32"):
    return TensorSpec(tuple(shape), tuple(stride), dtype, "cuda")


def test_a_tensor_counts_its_distinct_elements():
    assert gate.tensor_bytes(spec((64, 32), (32, 1))) == 64 * 32 * 4
    assert gate.tensor_bytes(spec((64, 32), (0, 1), "bfloat16")) == 32 * 2, "a broadcast row is read once"
    assert gate.tensor_bytes(spec((64, 32), (64, 1))) == 64 * 32 * 4, "the gaps of a slice are not read"


def test_each_storage_counts_once_as_its_largest_tensor():
    whole, half = spec((64, 32), (32, 1)), spec((32, 32), (32, 1))
    assert gate.moved_bytes([("a", whole), ("a", half), ("b", half)]) == (64 * 32 + 32 * 32) * 4


class TransposeAdd(torch.nn.Module):
    def forward(self, x):
        return torch.relu(x.t() + x) * 2


class MatmulRelu(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(32, 16))

    def forward(self, x):
        return torch.relu(x @ self.w) * 2


def _task(model, *inputs) -> Task:
    (task,) = collect_tasks(model, list(inputs), backward=False, min_ops=1)
    return task


def test_a_view_and_its_base_are_one_storage_of_the_task():
    task = _task(TransposeAdd(), torch.randn(16, 16))
    assert len(task.inputs) == 2, "x.t() and x reach the task as two inputs"
    assert gate.task_bytes(task) == 2 * 16 * 16 * 4, "x once, the output once"
    # A task read back from a cache has no graph: each tensor is then its own storage.
    assert gate.task_bytes(Task.from_json(task.to_json())) == 3 * 16 * 16 * 4


def test_matmul_flops_come_from_the_task_graph():
    task = _task(MatmulRelu(), torch.randn(8, 32))
    assert gate.task_work(task, STRICT) == [Work("aten.mm.default", 2 * 8 * 32 * 16, ("fp32",))]
    assert gate.task_work(Task.from_json(task.to_json()), STRICT) == []
    assert gate.task_work(_task(TransposeAdd(), torch.randn(4, 4)), STRICT) == []


@pytest.mark.parametrize("dtype, conv, settings, allowed", [
    ("float32", False, {}, ("fp32",)),
    ("float32", False, {"allow_tf32": True}, ("fp32", "tf32")),
    ("float32", False, {"matmul_precision": "high"}, ("fp32", "tf32")),
    ("float32", False, {"matmul_precision": "medium"}, ("fp32", "tf32", "bf16")),
    ("float32", True, {"allow_tf32": True}, ("fp32",)),
    ("float32", True, {"allow_cudnn_tf32": True}, ("fp32", "tf32")),
    ("float32", False, {"allow_reduced_precision": True}, ("fp32", "tf32", "bf16")),
    ("bfloat16", False, {}, ("bf16",)),
    ("float16", True, {}, ("fp16",)),
    ("float64", False, {"allow_tf32": True}, ()),
])
def test_precisions_follow_the_users_settings(dtype, conv, settings, allowed):
    assert gate.allowed_precisions(dtype, conv, {**STRICT, **settings}) == allowed


def test_the_floor_is_the_longest_of_the_timed_copy_compute_and_the_host():
    """The copy of the task's bytes, timed beside Inductor's kernel, holds its launch and what the
    GPU does that day; FLOPs over the fastest allowed peak and the host time of a launch bound it too."""
    mm = [Work("aten.mm.default", 2 * 4096**3, ("fp32", "tf32"))]
    floor = gate.task_floor(0.05, mm, FLOORS, rewritable=False)
    assert floor.compute_ms == pytest.approx(2 * 4096**3 / 400e12 * 1e3), "the fastest allowed precision"
    assert (floor.bound, floor.ms, floor.memory_ms) == ("compute", floor.compute_ms, 0.05)
    rewritable = gate.task_floor(0.05, mm, FLOORS, rewritable=True)
    assert (rewritable.bound, rewritable.ms) == ("memory", 0.05) and "rewrite" in rewritable.note
    assert gate.task_floor(0.0098, [], FLOORS, rewritable=False).bound == "memory"
    assert (gate.task_floor(0.0021, [], FLOORS, rewritable=False).bound,
            gate.task_floor(0.0021, [], FLOORS, rewritable=False).ms) == ("host", 0.004)
    no_peak = gate.task_floor(0.01, [Work("aten.mm.default", 1e12, ("fp64",))], FLOORS, rewritable=False)
    assert no_peak.compute_ms == 0.0 and "no measured peak" in no_peak.note


@pytest.mark.parametrize("problem, inductor_ms, copy_ms, searched", [
    ("gelu", 0.1071, 0.0947, True), ("bias_gelu_mul", 0.0751, 0.0740, False),
    ("scale_shift_tanh", 0.0506, 0.0499, False), ("scalar_chain", 0.0731, 0.0722, False),
    ("gpt2_train, 8 tasks", 0.0113, 0.0117, False), ("gpt2_train, 1 task", 0.0136, 0.0129, False)])
def test_the_default_bar_against_an_h100_run(problem, inductor_ms, copy_ms, searched):
    """Inductor's time and the copy of the task's bytes, timed side by side for the pointwise tasks
    of `gpu_session.sh gate` and GPT-2's bf16 training step on an H100 (2026-11-25): only gelu
    (1.13x the copy) has room, and there our kernel beat Inductor by 1.11x at 1.02x the copy. A
    full search of the others found no candidate above 1.01x."""
    settings = resolve({})
    floor = gate.task_floor(copy_ms, [], FLOORS, rewritable=False)
    assert gate.judge(inductor_ms, floor, settings.min_speedup, settings.gate_slack).skip != searched
    assert 0.0969 <= 0.0947 * (1 + settings.gate_slack), "the slack covers how far above the copy our gelu ran"


def test_skips_only_where_a_kernel_at_the_floor_cannot_win():
    floor = Floor(memory_ms=0.048, compute_ms=0.0, host_ms=0.004)
    # Inductor at 91% of the copy floor (relu(x + y) * 2 on an H200): 1.099x of the floor.
    near = gate.judge(0.048 * 1.099, floor, min_speedup=1.05, slack=0.05)
    assert near.skip and near.ratio == pytest.approx(1.099) and near.threshold == pytest.approx(1.1025)
    assert near.reason().startswith("Inductor at floor: Inductor 0.0528 ms, floor 0.0480 ms (memory), margin 9.9%")
    # Inductor at 78% (gelu(x) * y in bf16), where a kernel of ours won 1.10x: searched.
    assert not gate.judge(0.048 * 1.28, floor, min_speedup=1.05, slack=0.05).skip
    assert not gate.judge(0.048 * 1.099, floor, min_speedup=1.05, slack=0.0).skip, "slack 0: only the floor itself"
    assert gate.judge(0.048 * 1.05, floor, min_speedup=1.05, slack=0.0).skip, "a tie at the bar is no win"


def test_a_recorded_verdict_is_judged_again_under_todays_bar():
    floor = Floor(memory_ms=0.050, compute_ms=0.0, host_ms=0.004)
    recorded = gate.judge(0.054, floor, min_speedup=1.05, slack=0.05).to_json()
    assert recorded["skipped"] and recorded["bound"] == "memory" and recorded["margin"] == pytest.approx(0.08)
    assert gate.still_skips(recorded, 1.05, 0.05)
    assert not gate.still_skips(recorded, 1.02, 0.0), "a lower bar reopens the search"
    assert not gate.still_skips(gate.judge(0.2, floor, 1.05, 0.05).to_json(), 5.0, 0.0), "a searched task stays searched"


def test_floors_round_trip_as_json():
    assert Floors.from_json(FLOORS.to_json()) == FLOORS
    assert dataclasses.asdict(FLOORS)["peak_tflops"]["bf16"] == 800.0
