"""The rows template on the CPU: what it claims from real traced tasks (the path `cuda-agent
explain` takes), the plans and launch shapes it chooses, what it refuses and why, and that the
CUDA and Python it writes compile. Whether the kernels compute the right numbers is
test_rows_gpu.py's job (it reuses CASES and traced_row_tasks from here)."""
from __future__ import annotations

import functools
import math
import re
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode

from agent_backend.env import float64
from agent_backend.env.compare import compare_values
from agent_backend.env.launch_spec import Arg
from agent_backend.explain import tasks_of, trace_tasks
from agent_backend.specs import Task, TensorSpec, random_inputs
from agent_backend.task import load_program
from helpers import launch_spec_of
from skills.rows import propose, supports
from skills.rows.candidates import NO_L1_SHAPES, _fits_registers, _words, launch_configs, model_source, tag
from skills.rows.codegen import (Launch, counter_bytes, grid_blocks, kernel_source, lanes_fit, shared_bytes,
                                 streamed_access, workspace_bytes)
from skills.rows.plan import build_plan
from skills.rows.placement import refine, runs

f32, f16, bf16 = torch.float32, torch.float16, torch.bfloat16


class Fn(nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *args):
        return self.fn(*args)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, dtype: torch.dtype):
        super().__init__()
        self.weight = nn.Parameter(torch.linspace(0.5, 1.5, dim, dtype=dtype))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight


class ResidualLayerNorm(nn.Module):
    def __init__(self, dim: int, dtype: torch.dtype):
        super().__init__()
        self.norm = nn.LayerNorm(dim, dtype=dtype)

    def forward(self, x, residual):
        return self.norm(x + residual)


class LayerNormGelu(nn.Module):
    """Inference (frozen weights, so no fp32 statistics are saved): every output is in x's dtype."""

    def __init__(self, dim: int, dtype: torch.dtype):
        super().__init__()
        self.norm = nn.LayerNorm(dim, dtype=dtype).requires_grad_(False)

    def forward(self, x):
        return F.gelu(self.norm(x), approximate="tanh")


def _randn(shape, dtype, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=torch.float64).to(dtype).to(device)


def _one(shape):
    return lambda dtype, device: [_randn(shape, dtype, device)]


def _two(shape):
    return lambda dtype, device: [_randn(shape, dtype, device), _randn(shape, dtype, device, seed=1)]


# name -> (model(dtype), inputs(dtype, device), default shape of the reduced input). Each is
# traced through the backend's pass and gives one task of kind "reduction".
CASES = {
    "softmax": (lambda dt: nn.Softmax(-1), _one, (8, 1000)),
    "log_softmax": (lambda dt: nn.LogSoftmax(-1), _one, (8, 1000)),
    "layernorm": (lambda dt: nn.LayerNorm(1000, dtype=dt), _one, (8, 1000)),
    "rmsnorm": (lambda dt: RMSNorm(1000, dt), _one, (8, 1000)),
    "logsumexp": (lambda dt: Fn(lambda x: torch.logsumexp(x, -1)), _one, (8, 1000)),
    "logsumexp_dim1": (lambda dt: Fn(lambda x: torch.logsumexp(x, 1)), _one, (4, 16, 32)),  # across rows
    "sum_last": (lambda dt: Fn(lambda x: x.sum(-1)), _one, (8, 1000)),
    "mean_dim1": (lambda dt: Fn(lambda x: x.mean(1)), _one, (4, 16, 32)),
    "sum_columns": (lambda dt: Fn(lambda x: x.sum(0)), _one, (300, 40)),
    "mse_loss": (lambda dt: Fn(lambda x, y: F.mse_loss(x, y)), _two, (8, 100)),
    "amax_last": (lambda dt: Fn(lambda x: x.amax(-1)), _one, (8, 1000)),
    "amin_keepdim": (lambda dt: Fn(lambda x: x.amin(-1, keepdim=True) * 2), _one, (8, 1000)),
    "var_last": (lambda dt: Fn(lambda x: x.var(-1)), _one, (8, 1000)),
    "var_dim1": (lambda dt: Fn(lambda x: x.var(1)), _one, (4, 16, 32)),  # across rows, two passes
    "mean_hw": (lambda dt: Fn(lambda x: x.mean((2, 3))), _one, (2, 8, 5, 7)),
    "softmax_dim1": (lambda dt: nn.Softmax(1), _one, (4, 16, 32)),
    "residual_layernorm": (lambda dt: ResidualLayerNorm(1000, dt),
                           lambda shape: lambda dtype, device: [_randn(shape, dtype, device),
                                                                _randn(shape, dtype, device, seed=1)], (8, 1000)),
    "batchnorm": (lambda dt: nn.BatchNorm2d(8, dtype=dt), _one, (4, 8, 5, 7)),  # over (N, H, W), training
    # over (C/G, H, W) of x seen as (N, G, C/G, H * W), scale and shift per channel of x itself
    "groupnorm": (lambda dt: nn.GroupNorm(4, 16, dtype=dt), _one, (2, 16, 5, 6)),
    "layernorm_gelu_tanh": (lambda dt: LayerNormGelu(1000, dt), _one, (8, 1000)),
    "softmax_transposed": (lambda dt: nn.Softmax(-1),
                           lambda shape: lambda dtype, device: [_randn(shape[::-1], dtype, device).t()], (8, 1000)),
}


def _on_cuda(task: Task) -> Task:
    return task.on_device("cuda")


def traced_row_tasks(model: nn.Module, inputs: list[torch.Tensor], kind: str = "reduction") -> list[Task]:
    """The tasks of `kind` of `model`'s forward graph, as the backend's pass extracts them."""
    tasks = tasks_of(trace_tasks(model, inputs, backward=False, min_ops=1))
    return [t for t in tasks if t.kind == kind]


@functools.cache
def backward_tasks(name: str, dtype: torch.dtype, device: str = "cpu") -> tuple[Task, ...]:
    """The reduction tasks of the backward graph of case `name` (inputs needing grad too)."""
    model, inputs, shape = CASES[name]
    xs = [x.requires_grad_() for x in inputs(shape)(dtype, device)]
    reports = trace_tasks(model(dtype).to(device), xs, backward=True, min_ops=1)
    tasks = [d.task for d in reports[-1].decisions if d.task is not None and d.task.kind == "reduction"]
    return tuple(_on_cuda(t) for t in tasks)


@functools.cache
def case_task(name: str, dtype: torch.dtype = f32, shape: tuple[int, ...] | None = None) -> Task:
    model, inputs, default = CASES[name]
    tasks = traced_row_tasks(model(dtype), inputs(shape or default)(dtype, "cpu"))
    assert len(tasks) == 1, f"{name}: {[t.ops for t in tasks]}"
    return _on_cuda(tasks[0])


def resized(task: Task, *shapes: tuple[int, ...]) -> Task:
    """`task` (whose graph spells out no shape) on contiguous inputs of `shapes`, on its device;
    outputs from running the graph on meta tensors. Its hash names the shapes too (a worker keeps
    one compiled reference per task hash)."""
    specs = tuple(TensorSpec(tuple(shape), torch.empty(shape, device="meta").stride(), s.dtype, s.device)
                  for shape, s in zip(shapes, task.inputs, strict=True))
    with FakeTensorMode(allow_non_fake_inputs=True):  # the graph's constants may name a device
        outs = task.graph_module(*(torch.empty(s.shape, dtype=s.torch_dtype, device=s.device) for s in specs))
    outs = outs if isinstance(outs, (tuple, list)) else (outs,)
    out_specs = tuple(TensorSpec(tuple(o.shape), tuple(o.stride()), str(o.dtype).removeprefix("torch."), specs[0].device)
                      for o in outs)
    signature = "_".join("x".join(map(str, s.shape)) for s in specs)
    return Task(f"{task.hash}-{signature}", task.program, specs, out_specs, task.ops, task.kind, task.graph_module)


# name -> fn of x: a cumsum along rows, traced through the backend's pass into one task of kind
# "scan"; "cumsum_cast" adds a prologue and an epilogue (for bf16: a cast up before, down after).
SCAN_CASES = {
    "cumsum": lambda x: torch.cumsum(x, -1),
    "cumsum_cast": lambda x: (torch.cumsum(x.float() * 2, -1) + 1).to(x.dtype) * x,
}


@functools.cache
def scan_task(name: str, dtype: torch.dtype = f32, shape: tuple[int, ...] = (8, 1000)) -> Task:
    (task,) = traced_row_tasks(Fn(SCAN_CASES[name]), [_randn((8, 64), dtype, "cpu")], kind="scan")
    return resized(_on_cuda(task), shape)


# name -> (fn, shapes of its inputs): matrix-vector products as the backend's pass claims them
# (one task of kind "matmul"), which the template plans as sums over k (skills/rows/gemv.py):
# nn.Linear at batch 1 (x @ W.t()), with a bias and an epilogue, and a matrix times a column.
GEMV_CASES = {
    "linear_batch1": (lambda x, w: F.linear(x, w), [(1, 1000), (37, 1000)]),
    "linear_bias_relu_batch1": (lambda x, w, b: torch.relu(F.linear(x, w, b)), [(1, 1000), (37, 1000), (37,)]),
    "matrix_column": (lambda a, v: (a @ v) * 2, [(37, 1000), (1000, 1)]),
    "linear_batch2": (lambda x, w: F.linear(x, w), [(2, 1000), (37, 1000)]),  # a row an output, two a W row
    "linear_bias_batch3": (lambda x, w, b: F.linear(x, w, b), [(3, 1000), (37, 1000), (37,)]),
    "linear_batch8": (lambda x, w: F.linear(x, w), [(8, 1000), (37, 1000)]),
}
GEMV_BATCH = {"linear_batch2": 2, "linear_bias_batch3": 3, "linear_batch8": 8}  # rows of x; else 1
# (case, dtype) the template takes: more than 2 vectors in fp32 only (gemv.MAX_VECTORS)
GEMV_PARAMS = [(n, dt) for n in GEMV_CASES for dt in (f32, bf16) if dt == f32 or GEMV_BATCH.get(n, 1) <= 2]


@functools.cache
def gemv_task(name: str, dtype: torch.dtype = f32, device: str = "cpu", shapes: tuple | None = None) -> Task:
    """Case `name` traced on `device` at `shapes` (its fn's arguments', default the case's)."""
    fn, default = GEMV_CASES[name]
    inputs = [_randn(s, dtype, device, seed=k) for k, s in enumerate(shapes or default)]
    (task,) = traced_row_tasks(Fn(fn), inputs, kind="matmul")
    return _on_cuda(task)


TOLERANCE = {f32: 1e-4, f16: 1e-2, bf16: 1e-2, torch.bool: 0.0}


def assert_computes_the_task(task: Task, inputs: list[torch.Tensor], got: tuple[torch.Tensor, ...], what: str) -> None:
    """`got` is what the task computes on `inputs`, by the verifier's two rules: elementwise close
    (relative to the values' scale) to the task evaluated in float64, and no more than twice as
    far from it as the task's program run eagerly (which rounds after every op, where the
    kernels, as Inductor, keep fp32 between ops)."""
    model = load_program(task.program)["Model"]()
    with torch.no_grad():
        eager = model(*inputs)
    eager = eager if isinstance(eager, tuple) else (eager,)
    exact = float64.evaluate(model, inputs)
    assert len(got) == len(eager), what
    for k, (g, e, x) in enumerate(zip(got, eager, exact)):
        assert (g.dtype, g.shape, g.stride()) == (e.dtype, e.shape, e.stride()), f"{what} output {k}"
        check = compare_values(k, g, x.to(torch.float64) if e.dtype != torch.bool else x, TOLERANCE[e.dtype])
        assert check.problem is None, f"{what}: {check.problem}"
        accuracy = float64.accuracy_problem(k, float64.relative_error(g, x), float64.relative_error(e, x), e.dtype)
        assert accuracy is None, f"{what}: {accuracy}"


# ------------------------------------------------------------------------------------ plans

@pytest.mark.parametrize("name, dtype", [(n, dt) for n in CASES for dt in (f32, bf16)] + [("softmax", f16)])
def test_every_case_is_supported_with_a_few_launch_shapes(name, dtype):
    task = case_task(name, dtype)
    assert supports(task) is None
    candidates = propose(task)
    assert 1 <= len(candidates) <= 6 + NO_L1_SHAPES
    assert len({c.origin for c in candidates}) == len(candidates)
    assert all(c.origin.startswith("builtin:rows:") for c in candidates)


def test_softmax_plan_holds_the_row_and_takes_three_passes():
    plan = build_plan(case_task("softmax", bf16))
    assert (plan.outer, plan.inner, plan.along_rows, plan.vector_width) == ((8,), (1000,), True, 8)
    assert [[p.combine for p in ps.partials] for ps in plan.passes] == [["max"], ["sum"]]
    assert plan.stored == (0,)  # read by both passes and the epilogue: held on chip
    assert plan.epilogue.body[-1] == "const float v7 = v6;"  # the graph's conversion to bf16: fp32, as Inductor's
    assert plan.outputs[0].value == "v7"  # rounded once, by the store
    assert not any("round_" in line for ps in plan.passes + (plan.epilogue,) for line in ps.body)


def test_softmax_keeps_its_exp_and_multiplies_by_the_sums_reciprocal():
    """The sum's pass computes each element's exp and keeps it; the epilogue takes it rather than
    computing it again, and in bf16 multiplies by 1 / sum, computed once a row after the sum."""
    plan = build_plan(case_task("softmax", bf16))
    (kept,) = plan.passes[1].keeps
    assert kept[0] == "float" and any(f"{kept[1]} = pw_exp_fast_nonpositive(" in line for line in plan.passes[1].body)
    assert plan.epilogue.reusing.takes == (kept,) and plan.epilogue.reusing.reads == ()
    assert not any("exp" in line for line in plan.epilogue.reusing.body)
    assert any("pw_exp_fast_nonpositive(" in line for line in plan.epilogue.body)  # where nothing is kept
    assert plan.passes[1].after[-1] == "const float rcp0 = pw_div_fast(1.0f, v5);"
    assert "(v4 * rcp0)" in plan.epilogue.reusing.body[0] and not any("div" in line for line in plan.epilogue.body)
    assert plan.kept_words == 1
    # fp32: the exp is kept and stays expf; the sum's reciprocal is correctly rounded (within an
    # ulp of the division once multiplied), and so in the online plan
    wide = build_plan(case_task("softmax", f32))
    assert wide.passes[1].keeps and wide.passes[1].after[-1] == "const float rcp0 = (1.0f / v4);"
    assert "(v3 * rcp0)" in wide.epilogue.reusing.body[0] and not any("/" in line for line in wide.epilogue.body)
    assert any("pw_exp(" in line for line in wide.epilogue.body)
    online = build_plan(case_task("softmax", f32), online=True)
    assert any(line.endswith(" * rcp0);") for line in online.epilogue.body)
    # a row's other divisors in fp32 stay divisions: 1 / x may overflow where x is subnormal
    (task,) = traced_row_tasks(Fn(lambda x: x / x.norm(dim=-1, keepdim=True)), [_randn((8, 1000), f32, "cpu")])
    norm = build_plan(_on_cuda(task))
    assert not any("rcp" in line for p in norm.sweeps for line in p.after)
    assert any(re.search(r"= \(a0 / v\d+\);", line) for line in norm.epilogue.body)
    # nothing costly is computed twice in log_softmax, layernorm or a sum
    for name in ("log_softmax", "layernorm", "sum_last"):
        assert build_plan(case_task(name, bf16)).kept_words == 0, name


def test_one_plus_tanh_is_the_fast_sigmoid_form_where_results_are_bf16():
    """A decomposed tanh GELU's 1 + tanh(z) becomes 2 sigmoid(2 z) (pw_one_plus_tanh_fast) where
    every output is rounded to bf16; in fp32 it stays tanhf's, and so where fp32 statistics are
    saved for a backward (a LayerNorm whose weights train). (torch's own decomposition of the GELU
    is one function: test_a_decomposed_tanh_gelu_is_one_fast_function_where_results_are_bf16.)"""
    gated = Fn(lambda x: (lambda h: h * (1 + torch.tanh(0.8 * h)))(F.layer_norm(x, (1000,))))
    (task,) = traced_row_tasks(gated, [_randn((8, 1000), bf16, "cpu")])
    fast = build_plan(_on_cuda(task)).epilogue.body
    assert sum("pw_one_plus_tanh_fast(" in line for line in fast) == 1
    assert not any(re.search(r"= \(v\d+ \+ 1\.0f\);", line) for line in fast)
    assert not any("one_plus_tanh" in line for line in build_plan(case_task("layernorm_gelu_tanh", f32)).epilogue.body)
    training = Fn(lambda x, w: F.gelu(F.layer_norm(x, (1000,), w), approximate="tanh"))
    inputs = [_randn((8, 1000), bf16, "cpu"), _randn((1000,), bf16, "cpu").requires_grad_()]
    (task,) = traced_row_tasks(training, inputs)
    assert not any("one_plus_tanh" in line for line in build_plan(_on_cuda(task)).epilogue.body)


def test_a_decomposed_tanh_gelu_is_one_fast_function_where_results_are_bf16():
    """0.5 x (1 + tanh(c (x + k x^3))) becomes x / (1 + exp(-2 c (x + k x^3))) in one function
    (ops.pw_gelu_tanh_fast), its exp's argument x (a + b x^2) in log2 units with a = -2 c log2(e)
    and b = a k, where every output is bf16, its operands in any order and its cube a product or
    Hugging Face's pow(x, 3.0); not in fp32, nor where the chain is another (a gate without the
    cube keeps the fast 1 + tanh alone: test_one_plus_tanh_is_the_fast_sigmoid_form_where_results_are_bf16)."""
    def gelu_line(task) -> list[str]:
        return [line for line in build_plan(task).epilogue.body if "pw_gelu_tanh_fast(" in line]

    (line,) = gelu_line(case_task("layernorm_gelu_tanh", bf16))
    a, b = map(float, re.fullmatch(r"const float v\d+ = pw_gelu_tanh_fast\(v\d+, (\S+)f, (\S+)f\);", line).groups())
    c = math.sqrt(2 / math.pi)
    assert a == pytest.approx(-2 * c * math.log2(math.e), rel=1e-6) and b == pytest.approx(a * 0.044715, rel=1e-6)
    assert not gelu_line(case_task("layernorm_gelu_tanh", f32))
    inputs = [_randn((8, 1000), bf16, "cpu")]
    def swapped_gelu(h):
        return (1 + torch.tanh(0.8 * ((h * h) * h * 0.04 + h))) * (0.5 * h)
    swapped = Fn(lambda x: swapped_gelu(F.layer_norm(x, (1000,))))
    (task,) = traced_row_tasks(swapped, inputs)
    (line,) = gelu_line(_on_cuda(task))
    assert float(line.split(", ")[1].rstrip("f")) == pytest.approx(-2 * 0.8 * math.log2(math.e), rel=1e-6)
    def gelu_new(h, power=3.0):  # transformers.activations.NewGELUActivation's, at power 3.0
        return 0.5 * h * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (h + 0.044715 * torch.pow(h, power))))
    for power, fast in ((3.0, True), (3, True), (2.0, False)):
        (task,) = traced_row_tasks(Fn(lambda x: gelu_new(F.layer_norm(x, (1000,)), power)), inputs)
        assert len(gelu_line(_on_cuda(task))) == fast, power
    # the chain it replaces is not computed beside it (nvcc warned of its unused values)
    body = build_plan(case_task("layernorm_gelu_tanh", bf16)).epilogue.body
    assert not any("tanh" in line or "0.5f" in line for line in body if "pw_gelu_tanh_fast(" not in line)


def test_kept_values_live_in_registers_only():
    """Held in registers, a thread's kept exps are an array its unrolled loops index by constants;
    in shared memory the epilogue computes the exp again."""
    plan = build_plan(case_task("softmax", bf16))
    registers = kernel_source(plan, "k", Launch(64, 1, 8))
    assert "float keep_v4[2][8];" in registers and "keep_v4[e][v] = v4;" in registers
    assert "const float v4 = keep_v4[e][v];" in registers and registers.count("pw_exp_fast_nonpositive(v3)") == 1
    shared = kernel_source(plan, "k", Launch(64, 1, 8, "shared"))
    assert "keep_" not in shared and shared.count("pw_exp_fast_nonpositive(v3)") == 2


def test_layernorm_training_forward_writes_mean_and_rstd_per_row():
    plan = build_plan(case_task("layernorm", f32))
    # two-pass variance on the on-chip row: the mean, then squared deviations from it
    assert [[p.combine for p in ps.partials] for ps in plan.passes] == [["sum"], ["sum"]]
    assert "mean" in plan.passes[1].partials[0].source
    assert [o.per_row for o in plan.outputs] == [True, True, False]
    assert [a.per_row for a in plan.accesses] == [False, False, False]
    assert [a.outer for a in plan.accesses] == [(1000,), (0,), (0,)]  # weight and bias repeat per row
    assert plan.epilogue.reads == (0, 1, 2)


def test_rmsnorm_and_residual_layernorm_fuse_their_pointwise_work():
    rms = build_plan(case_task("rmsnorm", bf16))
    assert len(rms.passes) == 1 and "(a0 * a0)" in rms.passes[0].body[0]
    residual = build_plan(case_task("residual_layernorm", f32))
    assert residual.stored == (0, 1)  # x and the residual, both read by every pass
    assert "(a0 + a1)" in residual.passes[0].body[0]


def test_pure_reductions_stream_their_rows():
    for name in ("sum_last", "amax_last", "mean_hw", "mean_dim1"):
        plan = build_plan(case_task(name, f32))
        assert plan.stored == () and len(plan.passes) == 1 and [o.per_row for o in plan.outputs] == [True]
    assert build_plan(case_task("mean_hw", f32)).inner == (35,)  # the reduced trailing dims, merged


def test_reductions_over_a_strided_dim_run_threads_across_rows():
    for name in ("mean_dim1", "softmax_dim1", "softmax_transposed"):
        plan = build_plan(case_task(name, f32))
        assert not plan.along_rows and plan.vector_width == 1, name
    plan = build_plan(case_task("softmax_dim1", f32))
    assert (plan.outer, plan.inner) == ((4, 32), (16,))
    assert plan.accesses[0].outer == (512, 1) and plan.accesses[0].inner == (32,)
    assert all(launch.threads <= 32 and launch.rows >= 32 for launch in launch_configs(plan))


@pytest.mark.parametrize("name, dtype", GEMV_PARAMS)
def test_a_matrix_vector_product_is_planned_as_a_sum_over_k_per_output(name, dtype):
    """A row per output: W's row (Linear at batch 1) or the matrix's (times a column), read along
    its memory; the vector read by every row (its access strides 0 over them); a bias per row."""
    plan = build_plan(gemv_task(name, dtype))
    batch = GEMV_BATCH.get(name, 1)
    # the rows of x inner, so that those reading a W row are neighbours (a thread takes them all: Launch.lanes)
    assert (plan.outer, plan.inner, plan.along_rows) == ((37, batch) if batch > 1 else (37,), (1000,), True)
    assert len(plan.passes) == 1 and plan.stored == () and [o.per_row for o in plan.outputs] == [True]
    vector_rows, matrix_rows = ((0, 1000), (1000, 0)) if batch > 1 else ((0,), (1000,))  # strides over the rows
    assert sorted(a.outer for a in plan.accesses if not a.per_row) == sorted([vector_rows, matrix_rows])
    assert all(a.inner == (1,) for a in plan.accesses if not a.per_row)
    assert propose(gemv_task(name, dtype))
    assert [c.lanes for c in launch_configs(plan)][:1] == [batch]


@pytest.mark.parametrize("name, dtype, lanes", [("linear_batch8", f32, 8), ("linear_batch2", bf16, 2)])
def test_a_thread_takes_every_vector_of_a_matrix_row_and_loads_the_row_once(name, dtype, lanes):
    """Linear at batch 8 (2 in bf16): each thread takes the rows (outputs) that read one W row
    (Launch.lanes), loading each vector of the W row once and each x row's, as many partial sums,
    combined and stored a row each. Offered first, beside the shapes that take a row a thread. At
    batch 1 there is nothing to share; bf16 at batch 3 or more is left to cuBLAS."""
    plan = build_plan(gemv_task(name, dtype))
    configs = launch_configs(plan)
    assert {c.lanes for c in configs} == {lanes, 1} and configs[0].lanes == lanes
    source = kernel_source(plan, "k", configs[0])
    matrix, vector = sorted(range(2), key=lambda k: plan.accesses[k].outer[-1])  # W steps 0 between the rows
    assert source.count(f"l{matrix} = ") == 1 and source.count(f"l{vector}_w") == 2 * lanes  # declared, then read
    assert [source.count(f"out0[out0_base + {w * 37}] = ") for w in range(lanes)] == [1] * lanes
    assert re.search(rf"const idx_t row = .* \* {lanes};", source)  # the first of its rows
    assert all(c.lanes == 1 for c in launch_configs(build_plan(gemv_task("linear_batch1", dtype))))
    if dtype == bf16:
        assert "more than 2 vectors on either side in torch.bfloat16" in supports(gemv_task("linear_batch8", bf16))


def test_a_matrix_vector_plan_follows_a_resize():
    task = gemv_task("linear_bias_relu_batch1", bf16)
    # the traced graph (and its metadata) say 1 row of x; the task now has 2 rows of x, then 3
    assert [s.shape for s in task.inputs] == [(37, 1000), (37,), (1, 1000)]  # W, the bias, x
    assert build_plan(resized(task, (37, 1000), (37,), (2, 1000))).outer == (37, 2)
    assert "more than 2 vectors" in supports(resized(task, (37, 1000), (37,), (3, 1000)))  # bf16


def test_a_product_of_two_matrices_is_not_taken():
    (task,) = traced_row_tasks(Fn(lambda a, b: (a @ b) * 2), [_randn((37, 1000), f32, "cpu"),
                                                              _randn((1000, 9), f32, "cpu", seed=1)], kind="matmul")
    assert "a 37 x 1000 matrix by a 1000 x 9 one: more than 8 vectors on either side" in supports(_on_cuda(task))


def test_few_long_rows_are_split_over_a_cooperative_grid():
    """16 rows of 393216 fill 16 blocks, or 128 in clusters of 8: they are also offered split
    over 512 blocks of a cooperative grid (four an SM), each block's partials through the
    workspace, then a barrier of the row's 32 blocks on two counters of the row's own; a loss
    over a whole tensor (one row) over 512 blocks too."""
    plan = build_plan(resized(case_task("sum_last", f32), (16, 393216)))
    split = [c for c in launch_configs(plan) if c.split > 1 and not c.no_l1]
    assert [(c.threads, c.split) for c in split] == [(256, 32), (256, 16)]
    assert tag(plan, split[0]) == "t256r1v4g32" and grid_blocks(plan, split[0]) == 512
    assert workspace_bytes(plan, split[0]) == 8 * 16 * 32
    source = kernel_source(plan, "k", split[0])
    assert "unsigned char* ws, unsigned int* bar)" in source and "if (t == 0) ws0[blockIdx.x] = acc" in source
    assert "rows_split_barrier(bar + 32 * (blockIdx.x / 32), bar + 32 * (blockIdx.x / 32) + 512, 32u);" in source
    assert "grid.sync()" not in source and counter_bytes(plan, split[0]) == 128 * 2 * 16
    assert "MAIN_LAUNCH = (512, (256,), 0, 1, 4096, False, 4096)" in model_source(plan, split[0])
    assert "if (row_ok && t == 0 && blockIdx.x % 32 == 0)" in source
    whole = build_plan(resized(case_task("mse_loss", f32), (8192, 4096), (8192, 4096)))
    assert (whole.rows, whole.row_length) == (1, 8192 * 4096)
    assert [c.split for c in launch_configs(whole) if c.split > 1 and not c.no_l1] == [512, 256]
    # a long row held on chip: split at 32 where a slice takes 25 KB of shared memory at most (bf16:
    # 24 KB); where it would take more (fp32: 48 KB), at 16, two blocks an SM of 96 KB; many rows:
    # no split, nor where even half the split's slice would take over 100 KB
    # (bf16 in registers: each element's exp kept too, 12 words a vector, too many); and no cluster
    # shapes where the rows split (they lost to the split ones on a GPU)
    softmax = build_plan(resized(case_task("softmax", bf16), (16, 393216)))
    assert [tag(softmax, c) for c in launch_configs(softmax)] == ["t256r1v8sg32"]
    wide = build_plan(resized(case_task("softmax", f32), (16, 393216)))
    (half,) = [c for c in launch_configs(wide) if c.split > 1]
    assert (half.threads, half.storage, half.split, grid_blocks(wide, half)) == (256, "shared", 16, 256)
    assert shared_bytes(wide, half) == 96 * 1024
    # online (nothing kept), a row also in registers: 16 blocks of 256 threads a row, two an SM
    # (the launch bounds say so), and 32 blocks of 128; fp32 takes 96 words a thread, what the
    # register file leaves two blocks an SM less 32 (four blocks of 256 would leave 64: refused)
    for dtype, words in ((bf16, 48), (f32, 96)):
        online = build_plan(resized(case_task("softmax", dtype), (16, 393216)), online=True)
        held = [c for c in launch_configs(online) if c.split > 1 and c.storage == "registers"]
        assert [(c.threads, c.split, grid_blocks(online, c)) for c in held] == [(256, 16, 256), (128, 32, 512)]
        assert _words(online, held[0]) == words and "__launch_bounds__(256, 2)" in kernel_source(online, "k", held[0])
    assert not _fits_registers(online, Launch(256, 1, 4, split=32))
    assert all(c.split == 1 for c in launch_configs(build_plan(resized(case_task("softmax", f32), (64, 393216)))))
    for name in ("softmax", "sum_last"):
        assert all(c.split == 1 for c in launch_configs(build_plan(case_task(name, f32))))


def test_columns_are_read_a_vector_across_them_and_few_are_split():
    """A bias's gradient (a column sum over 4096 x 768): each thread takes 8 consecutive columns
    (a 16-byte vector across them a step; 4 in fp32), 8 threads across by 32 along a block or 32
    across by 8 along, and too few columns to fill the GPU are split along their length over a cooperative grid, each
    block's partials through the workspace, folded in order by the thread that stores the sum;
    many columns are not split. Columns
    that cannot be read so (no vector across them) are split a warp of them a block."""
    plan = build_plan(resized(case_task("sum_columns", bf16), (4096, 768)))
    configs = [c for c in launch_configs(plan) if not c.no_l1]
    assert [tag(plan, c) for c in configs] == ["y32r8w8g16", "y32r8w8g8", "y8r32w8g64", "y8r32w8g32", "y32r32"]
    assert grid_blocks(plan, configs[0]) == 768 // 64 * 16 and workspace_bytes(plan, configs[0]) == 8 * 768 * 16
    source = kernel_source(plan, "k", configs[0])
    assert "const idx_t row = ((idx_t)(blockIdx.x / 16) * 8 + slot) * 8;" in source
    assert "const Vec<bf16, 8> l0 = *reinterpret_cast<const Vec<bf16, 8>*>(in0 + a0_base + j0 * 768);" in source
    assert "if (row_ok && t == 0) ws0_w7[(row + 7) * 16 + blockIdx.x % 16] = acc1_w7;" in source
    # each column's first thread wrote its partials: the block's barrier, then its blocks'
    barrier = ("  __syncthreads();\n"
               "  rows_split_barrier(bar + 32 * (blockIdx.x / 16), bar + 32 * (blockIdx.x / 16) + 384, 16u);\n")
    assert source.count(barrier) == 1 and source.count("__syncthreads();") == 3  # one in rows_split_barrier
    # only the thread that stores a column folds its slots: nothing else reads the sum
    assert ("for (int g = 0; row_ok && t == 0 && blockIdx.x % 16 == 0 && g < 16; g += 1) "
            "acc1_w3 = (acc1_w3 + __ldcg(&ws0_w3[(row + 3) * 16 + g]));") in source
    assert "out0[out0_base + 7] = float_to_bf16(v1_w7);" in source
    # where the data is not aligned, one element an access: 8 times the blocks, an eighth the split
    program = model_source(plan, configs[0])
    assert "MAIN_ALIGNMENT = (16,)" in program
    assert "FALLBACK_LAUNCH = (192, (8, 32), 0, 1, 12288, False, 24576)" in program
    tall = build_plan(resized(case_task("sum_columns", f32), (16384, 4096)))
    assert [tag(tall, c) for c in launch_configs(tall) if not c.no_l1] == [
        "y32r8w4g4", "y32r8w4g2", "y8r32w4g16", "y8r32w4g8", "y32r32"]
    many_plan = build_plan(resized(case_task("mean_dim1", f32), (64, 512, 256)))
    many = launch_configs(many_plan)  # 16384 columns: 32 across fill the GPU unsplit, 8 across take a short split
    assert [tag(many_plan, c) for c in many if not c.no_l1] == ["y32r8w4", "y8r32w4g4", "y8r32w4g2", "y16r32", "y32r32"]
    odd = build_plan(resized(case_task("sum_columns", f32), (100003, 37)))
    assert [tag(odd, c) for c in launch_configs(odd) if not c.no_l1] == ["y32r32", "y8r32g256", "y8r32g128"]
    assert not lanes_fit(odd, 2) and lanes_fit(tall, 4) and not lanes_fit(build_plan(case_task("softmax_dim1")), 2)


def test_logsumexp_is_one_task_with_its_views_and_constant():
    plan = build_plan(case_task("logsumexp", f32))
    assert [o.spec.shape for o in plan.outputs] == [(8,)]
    assert any("0.0f" in line for line in plan.prelude)  # the masked max's constant


def _plan_lines(plan) -> str:
    """The plan's C lines, an online sum's exp among them."""
    return "\n".join([*plan.prelude, *(line for p in plan.passes for line in (*p.body, *p.after)),
                      *(q.term for p in plan.passes for q in p.partials), *plan.epilogue.body])


@pytest.mark.parametrize("name", ["softmax", "logsumexp", "cross_entropy"])
@pytest.mark.parametrize("online", [False, True])
def test_exps_take_the_fast_form_where_every_output_is_bf16_or_they_are_only_summed(name, online):
    """A bf16 softmax computes in fp32 and rounds its outputs to bf16, which hides the few fp32 ulps
    of exp2.approx (Triton's own exp): the row's exps are then one multiply and one MUFU op, not
    expf's range reduction. Where an output stays fp32, an exp that is an output (softmax's) keeps
    the accurate expf, and one only summed beside the row's max (softmax's too, in the online plan,
    which takes it again for the output) takes the fast form, as Inductor's own fp32 kernels do."""
    def lines(dtype):
        task = _cross_entropy_tasks(dtype)[0] if name == "cross_entropy" else case_task(name, dtype)
        return _plan_lines(build_plan(task, online))
    assert re.search(r"pw_exp_fast(_ftz|_nonpositive)?\(", lines(bf16)) and "pw_exp(" not in lines(bf16)
    assert ("pw_exp_fast_ftz(" in lines(f32)) == (name != "softmax" or online)
    assert "pw_exp_fast(" not in lines(f32) and ("pw_exp(" in lines(f32)) == (name == "softmax")


@pytest.mark.parametrize("shape, launch, fp32", [
    ((6, 300), Launch(32, 1, 4), True),  # 10 terms a thread, a warp a row
    ((6, 300), Launch(16, 2, 4), False),  # under a warp a row: a thread's sum is most of the row's
    ((16, 393216), Launch(256, 1, 8, split=16), True),  # 96 terms a thread over a cooperative grid
    ((1024, 393216), Launch(512, 1, 8, "registers", 8, persistent=True), True),  # 96 over a cluster
    ((4, 393216), Launch(256, 1, 8), False),  # 1536 terms a thread
])
def test_online_sums_are_fp32_where_each_thread_sums_few_terms(shape, launch, fp32):
    """An online sum of exp (positive terms, nothing cancels) stays in fp32 in the thread and
    across threads where each thread sums at most ONLINE_FP32_TERMS of a row's terms and a warp
    or more share the row; elsewhere it accumulates in double (a conversion and add a vector, and
    double shuffles: on an H200 a persistent bf16 softmax took 609 us so, 468 us in fp32)."""
    source = kernel_source(build_plan(resized(case_task("softmax", bf16), shape), online=True), "k", launch)
    kernel = source[source.index('extern "C"'):]
    assert ("double" in kernel) != fp32
    assert bool(re.search(r"const float acc\d+_at = ", kernel)) == (launch.threads > 1)  # shuffled (_shuffles)
    assert ("+ (float)__shfl_xor_sync" in kernel) == fp32


@pytest.mark.parametrize("dtype, launch, kept", [
    (f32, Launch(256, 1, 4, split=16), True),  # held in registers over a grid: the terms take the row's place
    (f32, Launch(1024, 1, 4, "registers", 4), True),  # over a cluster
    (bf16, Launch(256, 1, 8, split=16), True),  # twice the row's registers, within the grid's budget
    (bf16, Launch(1024, 1, 8, "registers", 4), False),  # twice the row's registers, no budget known
    (f32, Launch(256, 1, 4, "shared", 4), False),  # nothing kept out of registers
    (f32, Launch(512, 1, 4, "registers", 4, persistent=True), False),  # its stores load the next row
])
def test_a_softmax_held_in_registers_keeps_its_online_terms_for_its_output(dtype, launch, kept):
    """A softmax's exps are its sum's terms and its output: where the fp32 terms fit in the
    registers of the row they replace (or a cooperative grid's launch bounds leave them room), a
    thread keeps each term, exp(x - acc<k>_top), as it sums it, and the output takes it times
    exp(acc<k>_top - the row's max): one exp a thread rather than one an element. Over a grid,
    bf16, acc<k>_top is the floor of the thread's first element, the terms made as its vectors
    land (again from memory against its max where that max is too far above); elsewhere the
    thread's max, taken first. Where nothing is kept the online sweep rescales the sum as the max grows,
    a vector at a time."""
    plan = build_plan(resized(case_task("softmax", dtype), (16, 393216)), online=True)
    (term,) = [p for p in plan.passes[0].partials if p.kept]
    assert plan.epilogue.rescaled.takes == (("float", term.kept[0]),) and not plan.epilogue.rescaled.reads
    kernel = kernel_source(plan, "k", launch)
    kernel = kernel[kernel.index('extern "C"'):]
    assert (f"keep_{term.kept[0]}[e][v] = {term.kept[0]};" in kernel) == kept
    rescale = f"const float {term.acc}_rescale = pw_exp\\w*\\({term.acc}_top - {term.kept[2]}\\);"
    assert bool(re.search(rescale, kernel)) == kept
    epilogue = kernel[kernel.rindex("for (int e = 0;"):]
    assert ("pw_exp" in epilogue) != kept and ("buf0" in epilogue) != kept
    # a kept term over the sum: the rescale and the sum's reciprocal multiplied once a row, one
    # multiply an element
    scale = rf"const float {term.acc}_scale = {term.acc}_rescale \* (rcp\d+);"
    assert bool(re.search(scale, kernel)) == kept and ("* rcp" in epilogue) != kept
    assert (f"= keep_{term.kept[0]}[e][v] * {term.acc}_scale;" in epilogue) == kept
    first_value = kept and launch.split > 1 and dtype == bf16  # an fp32 output's terms keep the max's rounding
    assert bool(re.search(r"if \(e == 0 && v == 0\) acc\d+_top = floorf\(fmaxf\([av]\d+, ", kernel)) == first_value
    assert bool(re.search(r"if \(!\(acc\d+ - acc\d+_top <= 64.0f\)\) {\n *acc\d+_top = fmaxf", kernel)) == first_value
    assert bool(re.search(r"const float acc\d+_top = fmaxf", kernel)) == (kept and not first_value)
    assert bool(re.search(r"_from = acc\d+;", kernel)) != kept


def test_online_terms_are_not_kept_where_the_row_is_streamed_or_its_exps_only_summed():
    """logsumexp reads its row once (nothing held); log_softmax's output takes no exp. Both sum
    online, rescaling as the max grows."""
    for name, launch in (("logsumexp", Launch(32, 1, 4, split=4)), ("log_softmax", Launch(256, 1, 4, split=4))):
        plan = build_plan(resized(case_task(name, f32), (16, 8192)), online=True)
        assert not any(p.kept for w in plan.passes for p in w.partials) and plan.epilogue.rescaled is None
        kernel = kernel_source(plan, "k", launch)
        assert "_top = fmaxf" not in kernel and re.search(r"_from = acc\d+;", kernel)


@pytest.mark.parametrize("rows, persistent, wide", [
    (4096, True, False),  # 1.6e9 elements: the persistent kernel forms no offset past the last row
    (4096, False, True),  # a grid of clusters may form offsets of rows past the last
    (1024, False, False),
    (5462, True, True),  # 2^31 elements and more
])
def test_persistent_kernels_take_32_bit_offsets_while_the_tensors_offsets_fit(rows, persistent, wide):
    plan = build_plan(resized(case_task("softmax", bf16), (rows, 393216)), online=True)
    source = kernel_source(plan, "k", Launch(512, 1, 8, "registers", 8, persistent=persistent))
    assert ("typedef long long idx_t;" in source) == wide and ("typedef int idx_t;" in source) != wide


def _masked_max_sum_exp(x):
    m = x.amax(-1, keepdim=True)
    return (x - torch.where(x[:, :1] < 0, 0.0, m)).exp().sum(-1)


@pytest.mark.parametrize("fn, ftz", [
    (lambda x: torch.logsumexp(x, -1), True), (lambda x: torch.log_softmax(x, -1), True),
    (lambda x: torch.softmax(x, -1), False),  # its exps are outputs too
    (lambda x: x.float().exp().sum(-1).to(x.dtype), False),  # not relative to the row's max
    (lambda x: (x.float() - x.float().mean(-1, keepdim=True)).exp().sum(-1).to(x.dtype), False),
    # the max replaced by 0 where the row's first element is negative: every term may be subnormal
    (lambda x: _masked_max_sum_exp(x.float()).to(x.dtype), False),
])
def test_exps_summed_beside_the_max_flush_subnormals(fn, ftz):
    """exp(x - max) read only by the row's sum takes ex2's .ftz form in bf16 and fp32 programs: a
    term below 2^-126 is nothing beside the max's exp(0) = 1. Elsewhere a flushed term could be the
    whole sum: a bf16 program's exps take the fast form without .ftz, an fp32 one's expf."""
    for dtype, other in ((bf16, r"pw_exp_fast(_nonpositive)?\("), (f32, r"pw_exp\(")):
        (task,) = traced_row_tasks(Fn(fn), [_randn((8, 100), dtype, "cpu")])
        lines = _plan_lines(build_plan(_on_cuda(task)))
        assert ("pw_exp_fast_ftz(" in lines) == ftz
        assert bool(re.search(other, lines)) != ftz


def _guarded_softmax(x):
    m = x.amax(-1, keepdim=True)
    e = (x - torch.where(m.abs() == float("inf"), 0.0, m)).exp()
    return e / e.sum(-1, keepdim=True)


@pytest.mark.parametrize("fn, nonpositive", [
    (lambda x: torch.softmax(x, -1), True),
    (lambda x: torch.softmax(x.float(), -1), False),  # an fp32 output keeps expf
    (lambda x: (x - x.amax(-1, keepdim=True)).exp() * 2.0, True),
    (lambda x: (x - x.mean(-1, keepdim=True)).exp(), False),  # x - mean may be positive
    (_guarded_softmax, False),  # behind logsumexp's guard the constant may stand below x
])
def test_exps_of_x_less_its_max_take_the_nonpositive_form_where_outputs_are_bf16(fn, nonpositive):
    """exp(x - max(x)) that reaches a bf16 output is pw_exp_fast_nonpositive (its argument is never
    above 0), which keeps subnormal results without the fast form's compare and two multiplies."""
    (task,) = traced_row_tasks(Fn(fn), [_randn((8, 100), bf16, "cpu")])
    lines = _plan_lines(build_plan(_on_cuda(task)))
    assert ("pw_exp_fast_nonpositive(" in lines) == nonpositive


BACKWARD = [(name, dt) for name in ("softmax", "log_softmax", "layernorm", "rmsnorm") for dt in (f32, bf16)]


@pytest.mark.parametrize("name, dtype", BACKWARD)
def test_backward_reductions_are_supported(name, dtype):
    """Softmax's backward (with Inductor's prims.fma), a norm's input gradient (RMSNorm's expands
    its per-row factor) and its weight and bias gradients (reductions over the batch)."""
    tasks = backward_tasks(name, dtype)
    assert tasks
    assert [supports(t) for t in tasks] == [None] * len(tasks)
    if name == "layernorm":
        assert sum(not build_plan(t).along_rows for t in tasks) >= 2  # sums down the columns


@pytest.mark.parametrize("make", [lambda: case_task("layernorm", bf16),
                                  lambda: gemv_task.__wrapped__("linear_bias_relu_batch1", bf16)],
                         ids=["layernorm", "linear_bias_relu_batch1"])  # a fresh trace: its metadata is cleared
def test_plan_needs_no_node_metadata(make):
    task = make()
    expected = build_plan(task)
    for node in task.graph_module.graph.nodes:
        node.meta.clear()
    assert build_plan(task) == expected


@functools.cache
def _cross_entropy_tasks(dtype: torch.dtype = f32, rows: int = 8, classes: int = 64) -> list[Task]:
    """Cross-entropy's two tasks: each row's loss (log-softmax, the target's entry), their mean."""
    model = Fn(lambda x, t: F.cross_entropy(x, t))
    inputs = [_randn((rows, classes), dtype, "cpu"), torch.arange(rows) % classes]
    return [_on_cuda(t) for t in traced_row_tasks(model, inputs)]


@functools.cache
def cross_entropy_backward_task(dtype: torch.dtype = f32, rows: int = 8, classes: int = 64,
                                device: str = "cpu") -> Task:
    """Cross-entropy's backward row task: the one-hot of each row's target times the loss's
    gradient, less the softmax times its row sum (traced on `device`: its iota is made there)."""
    x = _randn((rows, classes), dtype, device).requires_grad_()
    target = torch.arange(rows, device=device) % classes
    reports = trace_tasks(Fn(lambda x, t: F.cross_entropy(x, t)), [x, target], backward=True, min_ops=1)
    (task,) = [d.task for d in reports[-1].decisions if d.task is not None and d.task.kind == "reduction"]
    return _on_cuda(task)


@pytest.mark.parametrize("dtype", [f32, bf16])
def test_cross_entropy_backward_makes_its_one_hot_from_the_target(dtype):
    """eq(where(t != -100, t, 0), iota) in the kernel, the iota as each element's place in its
    row. Inductor wrote that mask before the task as a bool of the logits' shape (131 MB at
    4096 x 32000), for the task to read. The one-hot's sum needs no pass over the row: the
    value where the target's place is, plus the value elsewhere times the rest (0 here)."""
    task = cross_entropy_backward_task(dtype)
    assert "prims.iota.default" in task.ops and "aten.eq.Tensor" in task.ops
    assert supports(task) is None and not any(s.dtype == "bool" for s in task.inputs)
    (target,) = [s for s in task.inputs if s.dtype == "int64"]
    assert (target.shape, target.high, target.special) == ((8,), 64, (-100,))  # drawn over the row and as -100
    plan = build_plan(task)
    assert plan.passes == () and any("hits" in line for line in plan.prelude)
    assert any("(long long)(j0 + v)" in line for line in plan.epilogue.body)


def test_cross_entropy_is_a_loss_per_row_then_their_mean():
    """The target's log-probability is gathered in the log-softmax's group, so no log-softmax of
    the whole input is written (Inductor writes none either): each row's loss, then the mean. The
    loss task takes the target itself: the mask of rows whose target is not the ignore_index, and
    the index the gather reads (where(target != -100, target, 0)), are made in it, not by a kernel
    of Inductor's before it."""
    losses, mean = _cross_entropy_tasks()
    assert supports(losses) is None and supports(mean) is None
    assert "aten.gather.default" in losses.ops and "aten.ne.Scalar" in losses.ops
    target, x = losses.inputs
    assert (x.dtype, target.dtype, target.shape, target.high, target.special) == ("float32", "int64", (8,), 64,
                                                                                   (-100,))
    assert [o.shape for o in losses.outputs] == [(8,)]  # no (8, 64) log-softmax
    plan = build_plan(losses, online=True)
    # the max and the sum of exp(x - max) online in one sweep: nothing held, no pass gathers
    assert (plan.rows, plan.row_length, len(plan.passes), plan.stored) == (8, 64, 1, ())
    assert [p.combine for p in plan.passes[0].partials] == ["max", "online"]
    assert [a.per_row for a in plan.accesses] == [True, False]
    # the mask and the index from the row's target, in its own type
    assert "(a0 != -100LL)" in "\n".join(plan.prelude)
    # once the sum is known, each row's target element is loaded alone and its log-probability computed
    assert "a1 = in1[a1_base + at * 1];" in "".join(plan.passes[0].after).replace("    const float ", "")
    plan = build_plan(mean)
    assert (plan.rows, plan.row_length) == (1, 8)
    assert [a.per_row for a in plan.accesses] == [False, True]  # the divisor is a 0-dim input


def test_random_indices_of_a_gather_lie_in_its_dim_or_take_the_values_compared_with():
    """Cross-entropy's target: drawn over the row, and a quarter of the time as the ignore_index
    (a kernel that skips the mask would pass on draws that never hit it)."""
    losses = _cross_entropy_tasks(rows=256)[0]
    program = load_program(losses.program.replace("'cuda'", "'cpu'"))
    for drawn in (torch.cat([random_inputs([losses.inputs[0]], seed, device="cpu")[0] for seed in range(4)]),
                  program["get_inputs"]()[0]):
        ignored = drawn == -100
        kept = drawn[~ignored]
        assert drawn.dtype == torch.int64 and 0 <= kept.min() and kept.max() < 64 and len(kept.unique()) > 16
        assert 0.1 < ignored.float().mean() < 0.4


@pytest.mark.parametrize("fn, inputs", [
    (lambda x, t: x.log_softmax(-1).gather(1, t) * 2, [_randn((8, 64), f32, "cpu"), torch.zeros(8, 2).long()]),
    (lambda x, t: x.log_softmax(-1) + t, [_randn((8, 64), f32, "cpu"), torch.zeros(8, 1).long()]),
])
def test_a_gather_joins_a_row_group_only_for_one_element_a_row(fn, inputs):
    """Two elements a row are no per-row value; an integer input used otherwise stays outside
    (the partition claims no op on integers but a gather)."""
    tasks = [_on_cuda(t) for t in traced_row_tasks(Fn(fn), inputs)]
    assert all("aten.gather.default" not in t.ops for t in tasks)
    assert all(s.dtype != "int64" for t in tasks for s in t.inputs)


@pytest.mark.parametrize("model, inputs, reason", [
    (Fn(lambda x: x.prod(-1)), [_randn((8, 64), f32, "cpu")], "op aten.prod.dim_int not supported"),
])
def test_unsupported_tasks_say_why(model, inputs, reason):
    tasks = [_on_cuda(t) for t in traced_row_tasks(model, inputs)]
    assert tasks
    assert reason in supports(tasks[0])
    assert propose(tasks[0]) == []


def test_rows_of_one_element_are_computed_per_row():
    task = _on_cuda(traced_row_tasks(nn.LayerNorm(1), [_randn((8, 1), f32, "cpu")])[0])
    plan = build_plan(task)
    assert (plan.rows, plan.row_length, plan.epilogue.body) == (8, 1, ())
    assert all(o.per_row for o in plan.outputs) and [launch.threads for launch in launch_configs(plan)] == [1]


def test_the_builtin_policy_proposes_the_rows_candidates():
    from agent_backend.policies.builtin import BuiltinPolicy
    policy, task = BuiltinPolicy(), case_task("softmax", bf16)
    assert policy.why_not(task) is None
    assert [c.origin for c in policy.propose(task, [])] == [c.origin for c in propose(task)]
    unsupported = _on_cuda(traced_row_tasks(Fn(lambda x: x.prod(-1)), [_randn((8, 64), f32, "cpu")])[0])
    assert "rows: op aten.prod.dim_int not supported" in policy.why_not(unsupported)


@pytest.mark.parametrize("dtype", [f32, bf16])
def test_groupnorm_is_one_task_that_reads_x_once(dtype):
    """Inductor's GroupNorm reads x as (N, G, C/G, H*W) for the statistics and as (N, C, H, W)
    for the per-channel scale and shift (reshaped by as_strided): one task, on the space
    (N, G, C/G, H, W), whose one access to x is held on chip between the passes."""
    task = case_task("groupnorm", dtype)
    assert "aten.as_strided.default" in task.ops and "aten.var_mean.correction" in task.ops
    plan = build_plan(task)
    assert (plan.outer, plan.inner) == ((2, 4), (4, 30))
    x_reads = [k for k, a in enumerate(plan.accesses) if a.input == 0]
    assert len(x_reads) == 1 and plan.stored == tuple(x_reads)


def test_long_rows_of_many_rows_are_also_offered_prefetched():
    """GroupNorm's 512 rows of 32768 (64 KB in bf16): one block an SM loops over them, taking each
    row from shared memory (64 KB) and loading the next there meanwhile, at the first register
    shape and at half its threads. Not where rows are short (softmax's 16 KB), fewer than the SMs
    or more than 8 an SM (cross-entropy's 4096), nor in the fallback (2-byte elements)."""
    plan = build_plan(case_task("groupnorm", bf16, (128, 16, 64, 128)))  # 4 groups of 16 channels
    assert (plan.rows, plan.row_length) == (512, 32768)
    launch, half = [c for c in launch_configs(plan) if c.prefetch]
    assert tag(plan, launch) == "t512r1v8p" and grid_blocks(plan, launch) == 132
    assert tag(plan, half) == "t256r1v8p" and shared_bytes(plan, half) == 64 * 1024
    assert any(c.prefetch for c in launch_configs(build_plan(resized(case_task("logsumexp", bf16), (1056, 16384)))))
    assert not any(c.prefetch for c in launch_configs(build_plan(resized(case_task("logsumexp", bf16), (1057, 16384)))))
    assert shared_bytes(plan, launch) == 64 * 1024
    source = kernel_source(plan, "k", launch)
    assert "for (idx_t row = (idx_t)blockIdx.x; row < 512; row += gridDim.x) {" in source
    assert "cp.async.cg.shared.global" in source and source.count("rows_prefetch16(&next0[e * 512 + t]") == 2
    program = model_source(plan, launch)
    assert "MAIN_LAUNCH = (132, (512,), 65536, 1, 0, False, 0)" in program
    assert "FALLBACK_LAUNCH = (512, (512,), 0, 1, 0, False, 0)" in program
    assert not any(c.prefetch for c in launch_configs(build_plan(resized(case_task("softmax", bf16), (4096, 8192)))))
    assert not any(c.prefetch for c in launch_configs(build_plan(case_task("groupnorm", bf16, (32, 16, 64, 128)))))
    with pytest.raises(ValueError, match="prefetching block"):
        kernel_source(plan, "k", Launch(512, 1, 1, prefetch=True))


def test_the_space_is_refined_only_where_reshapes_line_up():
    assert refine((2, 4, 4, 30), [(2, 16, 5, 6)]) == (2, 4, 4, 5, 6)
    assert runs((2, 4, 4, 5, 6), (2, 16, 5, 6)) == ((0,), (1, 2), (3,), (4,))
    assert runs((2, 4, 4, 5, 6), (2, 4, 4, 1, 30)) == ((0,), (1,), (2,), None, (3, 4))
    assert refine((2, 3), [(3, 2)]) is None  # 6 as 2 x 3 and 3 x 2: no common split


def test_cpu_tasks_are_not_taken():
    task = case_task("softmax")
    cpu = Task(task.hash, task.program, tuple(TensorSpec(s.shape, s.stride, s.dtype, "cpu") for s in task.inputs),
               task.outputs, task.ops, task.kind, task.graph_module)
    assert "CUDA" in supports(cpu)


# --------------------------------------------------------------------------- launch shapes

def _tags(task: Task) -> list[str]:
    return [c.origin.rsplit(":", 1)[1] for c in propose(task)]


def test_launch_shapes_follow_the_row_length():
    softmax = case_task("softmax", bf16)
    assert _tags(resized(softmax, (4096, 7))) == ["t1r32v1", "t2r16v1", "t4r16v1"]
    # 125 vectors of 8, each held (4 words) with its exp kept (8 words): at most two vectors a thread
    assert _tags(softmax) == ["t64r1v8", "t128r1v8"]
    # 393216 elements of fp32: 16 blocks of a cooperative grid hold a row (96 KB of shared memory
    # each); of bf16, 32 blocks of one (24 KB each) ("o": the max and the sum of exp in one pass,
    # online, then the outputs; rows over 64 KB); online, also in registers over 16 blocks of 256
    # threads (fp32: 96 words a thread, bf16: 48) and 32 of 128; the two-pass plan keeps each exp
    # too, too many words for that; no cluster shapes beside split ones
    assert _tags(resized(case_task("softmax", f32), (16, 393216))) == [
        "t256r1v4sg16o", "t256r1v4g16o", "t128r1v4g32o", "t256r1v4sg16"]
    assert _tags(resized(case_task("softmax", bf16), (16, 393216))) == [
        "t256r1v8sg32o", "t256r1v8g16o", "t128r1v8g32o", "t256r1v8sg32"]
    # fewer rows than SMs, too many to split: a cluster each (fp32: 8 blocks of 192 KB), and more
    # than fit at once, so also persistent clusters holding them in registers ("P")
    assert _tags(resized(case_task("softmax", f32), (64, 393216))) == ["t1024r1v4sc8o", "t512r1v4c8Po", "t1024r1v4sc8"]
    # a sum streams: few long rows are split over a grid, or a cluster; it writes a value a row,
    # so its first two shapes that give every SM a block are offered loading past L1 too ("n"):
    # none for one row of 393216 (64 blocks at most), the splits of 16 such rows or of a loss
    # over a whole 8192 x 4096 tensor
    assert _tags(resized(case_task("sum_last", f32), (1, 393216))) == [
        "t1024r1v4", "t256r1v4g64", "t256r1v4g32", "t1024r1v4c8", "t1024r1v4c4", "t512r1v4c8"]
    assert _tags(resized(case_task("sum_last", f32), (16, 393216))) == [
        "t1024r1v4", "t256r1v4g32", "t256r1v4g32n", "t256r1v4g16", "t256r1v4g16n", "t1024r1v4c8", "t1024r1v4c4",
        "t512r1v4c8"]
    assert _tags(resized(case_task("mse_loss", f32), (8192, 4096), (8192, 4096)))[1:5] == [
        "t256r1v4g512", "t256r1v4g512n", "t256r1v4g256", "t256r1v4g256n"]
    assert _tags(resized(case_task("sum_last", f32), (4096, 1000))) == ["t32r4v4", "t32r4v4n", "t128r1v4", "t128r1v4n"]
    # rows of 32000 fp32 streamed (an online logsumexp, "o"): 1024 threads take 8 vectors each,
    # and with a block for every SM, 512, 256 and 128 take more
    losses = resized(_cross_entropy_tasks()[0], (4096,), (4096, 32000))
    # and, holding the rows for two passes, the shapes those take; rows of 64 KB (bf16) are held only;
    # none prefetched: 4096 rows are more than 8 an SM
    assert _tags(losses) == ["t1024r1v4o", "t1024r1v4no", "t512r1v4o", "t512r1v4no", "t256r1v4o", "t128r1v4o",
                             "t1024r1v4", "t1024r1v4n", "t512r1v4", "t512r1v4n", "t256r1v4c2", "t1024r1v4s"]
    bf16_losses = resized(_cross_entropy_tasks(bf16)[0], (4096,), (4096, 32000))
    assert _tags(bf16_losses) == ["t512r1v8", "t512r1v8n", "t1024r1v8", "t1024r1v8n", "t256r1v8", "t128r1v8c2",
                                  "t1024r1v8s"]


def test_rows_no_other_row_reads_may_be_loaded_past_l1():
    """Launch.no_l1: the rows' own elements are loaded without a place in L1 (rows_ld_stream); a
    LayerNorm's weight and bias, read by every row, are not. Offered only where a kernel writes
    a value a row (not where every element is written: softmax, LayerNorm; nor for a scan), for
    its first shapes that give every SM a block."""
    layernorm = build_plan(case_task("layernorm", bf16))
    launch = replace(launch_configs(layernorm)[0], no_l1=True)
    source = kernel_source(layernorm, "k", launch)
    assert [streamed_access(layernorm, k) for k in range(len(layernorm.accesses))] == [True, False, False]
    assert source.count("rows_ld_stream(reinterpret_cast<const Vec<bf16, 8>*>(in0 + a0_base") == 1
    assert "rows_ld_stream(reinterpret_cast<const Vec<bf16, 8>*>(in1" not in source
    assert "ld.global.L1::no_allocate.v4.u32" in source
    assert "rows_ld_stream" not in kernel_source(layernorm, "k", launch_configs(layernorm)[0])
    for name in ("softmax", "layernorm"):
        assert not any(c.no_l1 for c in launch_configs(build_plan(case_task(name, bf16))))
    assert not any(c.no_l1 for c in launch_configs(build_plan(scan_task("cumsum", bf16, (8192, 4096)))))
    logsumexp = build_plan(resized(case_task("logsumexp", bf16), (4096, 8192)))
    shapes = launch_configs(logsumexp)
    assert [c.no_l1 for c in shapes[:2 * NO_L1_SHAPES]] == [False, True] * NO_L1_SHAPES
    assert shapes[1] == replace(shapes[0], no_l1=True) and not any(c.no_l1 for c in shapes[2 * NO_L1_SHAPES:])
    # 8 rows give no SM-filling shape a twin
    assert not any(c.no_l1 for c in launch_configs(build_plan(case_task("logsumexp", bf16))))


def test_scan_launch_shapes_stream_each_row_in_one_block():
    """128 to 256 threads a row where rows are long (no cluster, split or shared-memory shape)."""
    assert _tags(scan_task("cumsum", bf16, (8192, 4096))) == ["t64r2v8", "t128r1v8", "t256r1v8"]
    assert _tags(scan_task("cumsum", f32, (8192, 4096))) == ["t128r1v4", "t256r1v4"]
    assert _tags(scan_task("cumsum", f32, (4096, 7))) == ["t1r32v1", "t2r16v1", "t4r16v1"]
    assert _tags(scan_task("cumsum", bf16, (16, 393216))) == ["t256r1v8"]


def test_rows_too_long_for_a_cluster_are_refused():
    task = resized(case_task("softmax", f32), (2, 8 * 2**20))
    assert "do not fit on chip" in supports(task)
    assert supports(resized(case_task("sum_last", f32), (2, 8 * 2**20))) is None  # streamed


# ----------------------------------------------------------------------------------- scans

@pytest.mark.parametrize("name, dtype", [(n, dt) for n in SCAN_CASES for dt in (f32, bf16)])
def test_a_scan_is_one_streaming_sweep(name, dtype):
    """No passes and nothing held on chip: the scan's source computed per element (a cast up and
    a scale for bf16), its running sum, then the epilogue reading it (the cast down and the
    product with x, which reads x again from the tile just loaded)."""
    task = scan_task(name, dtype)
    assert task.kind == "scan" and "aten.cumsum.default" in task.ops
    plan = build_plan(task)
    assert (plan.rows, plan.row_length, plan.passes, plan.stored, plan.along_rows) == (8, 1000, (), (), True)
    assert plan.vector_width == (8 if dtype == bf16 else 4)  # 16 bytes: 1000 = 125 x 8
    assert plan.scan.work.reads == (0,)
    if name == "cumsum":
        assert (plan.scan.work.body, plan.scan.source, plan.epilogue.body) == ((), "a0", ())
        assert plan.outputs[0].value == plan.scan.value
    else:
        assert plan.scan.source in plan.scan.work.body[-1] and plan.epilogue.reads == (0,)
        assert plan.scan.value in plan.epilogue.body[0]
        assert not any("round_" in line for line in plan.epilogue.body)  # the cast down stays fp32, as Inductor's


def test_a_scan_that_rounds_its_input_sums_the_rounded_values():
    (task,) = traced_row_tasks(Fn(lambda x: torch.cumsum(x, -1, dtype=bf16)), [_randn((8, 64), f32, "cpu")], "scan")
    assert build_plan(_on_cuda(task)).scan.source == "round_bf16(a0)"


def test_a_scan_over_rows_of_one_element_is_its_source_per_row():
    plan = build_plan(scan_task("cumsum_cast", bf16, (8, 1)))
    assert plan.scan is None and all(o.per_row for o in plan.outputs)
    assert [launch.threads for launch in launch_configs(plan)] == [1]


def test_a_scan_kernel_scans_thread_totals_in_double_across_warps():
    plan = build_plan(scan_task("cumsum", bf16, (8192, 4096)))
    source = kernel_source(plan, "k", Launch(128, 1, 8))
    assert "double carry = 0.0;" in source and "__shfl_up_sync(0xffffffffu, incl[i], d, 32)" in source
    assert "__shared__ double scan_warps[1][4][1][4];" in source and source.count("__syncthreads();") == 1
    # sub-warp rows: shuffles within the row's lanes, the tile's total from its last lane, no shared memory
    short = kernel_source(build_plan(scan_task("cumsum", f32, (64, 33))), "k", Launch(8, 4, 1))
    assert "__shfl_sync(0xffffffffu, incl[i], 7, 8)" in short and "__shared__" not in short


@pytest.mark.parametrize("fn, reason", [
    (lambda x: torch.cumsum(x, 0), "a scan along rows that are not one dim of consecutive elements"),
    (lambda x: torch.cumsum(x.t(), -1), "a scan along rows that are not one dim of consecutive elements"),
])
def test_unsupported_scans_say_why(fn, reason):
    (task,) = traced_row_tasks(Fn(fn), [_randn((8, 64), f32, "cpu")], "scan")
    assert reason in supports(_on_cuda(task))


def test_the_builtin_policy_proposes_the_rows_candidates_for_a_scan():
    from agent_backend.policies.builtin import BuiltinPolicy
    from skills import pointwise
    task = scan_task("cumsum_cast", bf16)
    assert "op aten.cumsum.default not supported" in pointwise.supports(task)
    assert [c.origin for c in BuiltinPolicy().propose(task, [])] == [c.origin for c in propose(task)]


# ----------------------------------------------------------------------------- compilation

def _nvcc() -> str | None:
    return shutil.which("nvcc") or next((str(p) for p in sorted(Path("/usr/local").glob("cuda*/bin/nvcc"))), None)


def _kernel_sources() -> dict[str, str]:
    """Every kernel (main and fallback) the candidates of a dozen tasks carry, over fp32/bf16/fp16,
    short and long rows, clusters, rows split over a grid and rows strided in memory, scans, loads
    past L1 of each width; the first candidate's kernel of every other case; and one with 64-bit
    indexing."""
    every = {
        "softmax_bf16": case_task("softmax", bf16), "softmax_fp16": case_task("softmax", f16),
        "logsumexp_fp32": case_task("logsumexp", f32), "var_bf16": case_task("var_last", bf16),
        "softmax_dim1_fp32": case_task("softmax_dim1", f32), "mean_hw_bf16": case_task("mean_hw", bf16),
        "layernorm_fp16_4097": resized(case_task("layernorm", f16), (3, 4097), (4097,), (4097,)),
        "rmsnorm_bf16_32768": resized(case_task("rmsnorm", bf16), (4, 32768), (32768,)),
        "softmax_fp32_long": resized(case_task("softmax", f32), (16, 393216)),
        "softmax_bf16_long": resized(case_task("softmax", bf16), (16, 393216)),
        "softmax_bf16_many_long": resized(case_task("softmax", bf16), (1024, 393216)),  # persistent
        "sum_fp32_one_long_row": resized(case_task("sum_last", f32), (1, 393216)),
        "sum_bf16_short_rows": resized(case_task("sum_last", bf16), (4096, 7)),
        "amax_bf16_long": resized(case_task("amax_last", bf16), (16, 393216)),
        "mse_fp16_whole": resized(case_task("mse_loss", f16), (8192, 4096), (8192, 4096)),
        # loaded past L1 a float at a time, and 8 bytes of bf16
        "sum_fp32_long_odd": resized(case_task("sum_last", f32), (16, 393217)),
        "logsumexp_bf16_1004": resized(case_task("logsumexp", bf16), (4096, 1004)),
        "cross_entropy_losses": _cross_entropy_tasks(bf16, 64, 32000)[0],
        "cross_entropy_mean": _cross_entropy_tasks()[1],
        "cumsum_bf16": scan_task("cumsum", bf16, (8192, 4096)),
        "cumsum_fp32": scan_task("cumsum", f32, (8192, 4096)),
        "cumsum_cast_bf16_4097": scan_task("cumsum_cast", bf16, (3, 4097)),
        "cumsum_cast_fp32_short": scan_task("cumsum_cast", f32, (4096, 7)),
        "cumsum_fp16_one": scan_task("cumsum", f16, (5, 1)),
    }
    first = {f"{name}_{str(dt)[6:]}": case_task(name, dt) for name in CASES for dt in (f32, bf16)}
    sources = {}
    for label, task in list(every.items()) + list(first.items()):
        for candidate in propose(task)[:None if label in every else 1]:
            kernels = re.findall(r"_SOURCE = r'''(.*?)'''", candidate.source, re.DOTALL)
            for k, kernel in enumerate(kernels[:None if label in every else 1]):
                sources[f"{label}_{candidate.origin.rsplit(':', 1)[1]}_{k}"] = kernel
    plan = build_plan(resized(case_task("softmax", bf16), (2**17, 16384)))
    assert plan.wide_index
    sources["wide_index"] = kernel_source(plan, "k", Launch(1024, 1, 8))
    return sources


@pytest.mark.skipif(_nvcc() is None, reason="needs nvcc")
def test_generated_cuda_compiles_cleanly(tmp_path):
    def compile_one(job):
        name, source = job
        path = tmp_path / f"{name}.cu"
        path.write_text(source)
        command = [_nvcc(), "-cubin", "-arch=sm_90", "-o", str(path.with_suffix(".cubin")), str(path)]
        return name, subprocess.run(command, capture_output=True, text=True)

    unique = {}
    for name, source in _kernel_sources().items():
        unique.setdefault(source, name)
    assert len(unique) >= 40
    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(compile_one, [(name, source) for source, name in unique.items()]))
    problems = {name: r.stderr for name, r in results if r.returncode or r.stderr.strip()}
    assert problems == {}


def test_candidates_are_launch_specs_of_the_planned_kernels(monkeypatch):
    """The spec launches the kernel codegen writes and a scalar fallback for unaligned inputs,
    on the grid and block the launch shape gives, inputs then outputs as arguments, on tensors
    of exactly the task's signature."""
    task = case_task("layernorm", bf16)
    plan = build_plan(task)
    for launch in launch_configs(plan):
        spec = launch_spec_of(model_source(plan, launch), monkeypatch)
        assert spec.inputs == task.inputs and spec.outputs == task.outputs
        name = f"rows_{tag(plan, launch)}"
        scalar = Launch(launch.threads, launch.rows, 1, launch.storage)
        args = tuple(map(Arg.input, range(3))) + tuple(map(Arg.output, range(3)))  # x, weight, bias; y, mean, rstd
        for kernel, shape, alignment in ((spec.kernels[0], launch, (16, 16, 16)), (spec.kernels[1], scalar, ())):
            assert kernel.cubin == f"cubin of {kernel_source(plan, name, shape)}".encode()
            assert (kernel.name, kernel.args, kernel.alignment) == (name, args, alignment)
            assert (kernel.grid, kernel.block, kernel.shared_mem) == (
                (-(-8 // launch.rows), 1, 1), (launch.threads * launch.rows, 1, 1), shared_bytes(plan, shape))


def test_split_rows_are_cooperative_launch_specs_with_a_workspace(monkeypatch):
    """A row split over a cooperative grid: the op launches it cooperatively (so it fails, not
    hangs, where the grid cannot all be resident: its blocks wait for each other) and gives it
    its workspace and its barrier's counters, the fallback too."""
    plan = build_plan(resized(case_task("amax_last", bf16), (16, 393216)))
    launch = next(c for c in launch_configs(plan) if c.split > 1)
    spec = launch_spec_of(model_source(plan, launch), monkeypatch)
    split = [Arg.workspace(workspace_bytes(plan, launch)), Arg.counters(counter_bytes(plan, launch))]
    assert [(k.grid, k.block, k.cooperative, list(k.args[-2:])) for k in spec.kernels] == [
        ((grid_blocks(plan, launch), 1, 1), (256, 1, 1), True, split)] * 2
    assert spec.to_json()[0]["kernels"][0]["cooperative"] is True


def test_split_rows_with_nothing_to_combine_are_plain_launches(monkeypatch):
    """Cross-entropy's backward over few long rows (its one-hot's sum taken per row, no pass):
    its split rows' blocks exchange nothing, so the kernel takes no workspace and the launch is
    not cooperative. The kernel asked for a workspace its launch did not pass (an H100 failed
    the launch, 'invalid argument', 2026-11-27)."""
    plan = build_plan(cross_entropy_backward_task(f32, 3, 50257))
    launch = next(c for c in launch_configs(plan) if c.split > 1)
    assert plan.passes == () and workspace_bytes(plan, launch) == 0
    assert "unsigned char* ws" not in kernel_source(plan, "k", launch)
    spec = launch_spec_of(model_source(plan, launch), monkeypatch)
    assert [(k.cooperative, len(k.args)) for k in spec.kernels] == [(False, 7)]  # 6 inputs, 1 output; no vectors


def test_cluster_candidates_are_launch_specs_with_their_cluster(monkeypatch):
    """A row held across a cluster of 8 blocks: the C++ launch op launches it as a cluster (no
    Python per call), its scalar fallback too."""
    task = resized(case_task("softmax", f32), (64, 393216))
    plan = build_plan(task)
    launch = launch_configs(plan)[0]
    spec = launch_spec_of(model_source(plan, launch), monkeypatch)
    assert [(k.grid, k.block, k.shared_mem, k.cluster) for k in spec.kernels] == [
        ((512, 1, 1), (1024, 1, 1), 196608, (8, 1, 1)),
        ((512, 1, 1), (1024, 1, 1), shared_bytes(plan, Launch(1024, 1, 1, launch.storage, 8)), (8, 1, 1))]
    assert spec.kernels[0].alignment == (16,)


def test_many_long_rows_are_offered_persistent_clusters():
    """KernelBench's softmax rows (393216), more of them than clusters fit at once: a row over a
    persistent cluster of 8 blocks, held in registers, at the fewest threads holding at most 96
    elements a thread within the registers a thread of one block an SM has (512 threads in both
    dtypes; fp32's 1024 of 48 words spilled, bf16's 256 too); its source loops over rows by the
    clusters launched, loads the next row's vector (the last row's own again: no branch) where
    it stores this row's, and keeps the cluster's partials in two slots by row parity; its
    program asks for a persistent launch.
    Few rows (16: split over a grid instead) and plans writing a value a row get none."""
    for dtype, shapes in ((bf16, [(512, 48)]), (f32, [(512, 96)])):
        plan = build_plan(resized(case_task("softmax", dtype), (1024, 393216)), online=True)
        persistent = [c for c in launch_configs(plan) if c.persistent]
        assert [(c.threads, _words(plan, c)) for c in persistent] == shapes
        launch = persistent[-1]
        assert (launch.cluster, launch.storage) == (8, "registers")
        assert tag(plan, launch) == f"t512r1v{plan.vector_width}c8Po"
        source = kernel_source(plan, "k", launch)
        assert "for (idx_t row = (idx_t)blockIdx.x / 8; row < 1024; row += clusters, parity ^= 1) {" in source
        assert "const idx_t next_row = row + clusters < 1024 ? row + clusters : row;" in source
        assert re.search(r"\n +buf0\[e\] = \*reinterpret_cast<[^;]*a0_next \+ j0\);", source)
        assert re.search(r"cred0\[parity\] = acc\d+;", source) and "__shared__ float cred0[2];" in source
        assert "MAIN_LAUNCH = (8192, (512,), 0, 8, 0, True, 0)" in model_source(plan, launch)
    assert not any(c.persistent for c in launch_configs(build_plan(resized(case_task("softmax", bf16), (16, 393216)))))
    logsumexp = build_plan(resized(case_task("logsumexp", f32), (1024, 393216)))
    assert not any(c.persistent for c in launch_configs(logsumexp))
    with pytest.raises(ValueError, match="persistent cluster"):
        kernel_source(plan, "k", Launch(1024, 1, 4, "shared", 8, persistent=True))


def test_a_cluster_block_is_a_warp_or_more():
    """A cluster's blocks' partials are folded by the first warp of each block, a block a lane:
    a block of fewer threads than a warp is refused."""
    plan = build_plan(resized(case_task("softmax", f32), (3, 2000)))
    with pytest.raises(ValueError, match="a warp or more"):
        kernel_source(plan, "k", Launch(16, 1, 4, "registers", 4))
    assert "cluster.map_shared_rank(&cred" in kernel_source(plan, "k", Launch(32, 1, 4, "registers", 4))
