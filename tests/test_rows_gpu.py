"""Every candidate the rows template proposes computes what the task computes, on a GPU: tasks
traced on CUDA through the backend's pass (as `cuda-agent explain` traces them), run directly
against the task's own program in eager, and judged by the real environment (a worker process,
Inductor's reference, the verifier's rules); over rows of 1, 7, 1000, 4097 and 393216 elements,
one row and many, strided and transposed inputs, unaligned inputs, fp32/bf16/fp16, backward
graphs, cumsum along rows. The last tests profile benchmark shapes and print the speedups over
Inductor."""
from __future__ import annotations

import functools

import pytest
import torch
import torch.nn.functional as F

from agent_backend.specs import Task, random_inputs
from skills.rows import propose
from test_env_cases import module_environment
from test_rows_template import (BACKWARD, CASES, GEMV_PARAMS, SCAN_CASES, Fn, assert_computes_the_task, backward_tasks,
                                cross_entropy_backward_task, gemv_task, resized, traced_row_tasks)

pytestmark = pytest.mark.gpu
env = module_environment("cuda:0", compile_s=300, verify_s=300, profile_s=600, start_s=300)

f32, f16, bf16 = torch.float32, torch.float16, torch.bfloat16


@functools.cache
def gpu_task(name: str, dtype: torch.dtype, shape: tuple[int, ...] | None = None) -> Task:
    model, inputs, default = CASES[name]
    (task,) = traced_row_tasks(model(dtype).to("cuda"), inputs(shape or default)(dtype, "cuda"))
    return task


@functools.cache
def gpu_scan_task(name: str, dtype: torch.dtype, shape: tuple[int, ...]) -> Task:
    (task,) = traced_row_tasks(Fn(SCAN_CASES[name]), [torch.randn(8, 64, dtype=dtype, device="cuda")], kind="scan")
    return resized(task, shape)


def _run(candidate, inputs):
    namespace = {}
    exec(compile(candidate.source, candidate.origin, "exec"), namespace)
    out = namespace["ModelNew"]()(*inputs)
    return out if isinstance(out, tuple) else (out,)


def _assert_candidates_match_eager(task: Task, inputs: list[torch.Tensor]):
    """Every candidate computes the task (test_rows_template.assert_computes_the_task)."""
    candidates = propose(task)
    assert candidates, task.ops
    for candidate in candidates:
        assert_computes_the_task(task, inputs, _run(candidate, inputs), candidate.origin)


def _assert_all_pass(env, task: Task):
    candidates = propose(task)
    for candidate, ev in zip(candidates, env.evaluate_many(task, candidates, profile=False)):
        assert ev.status == "passed", f"{candidate.origin}: {ev.status}: {ev.reason}"


MEMBERS = [(name, dt) for name in CASES for dt in (f32, bf16)] + [("softmax", f16), ("layernorm", f16)]


@pytest.mark.parametrize("name, dtype", MEMBERS)
def test_every_candidate_matches_eager(name, dtype):
    task = gpu_task(name, dtype)
    for seed in (0, 1):
        _assert_candidates_match_eager(task, random_inputs(task.inputs, seed, scale=2.0, device="cuda"))


@pytest.mark.parametrize("name, dtype", MEMBERS)
def test_every_candidate_passes_the_environment(env, name, dtype):
    _assert_all_pass(env, gpu_task(name, dtype))


@pytest.mark.parametrize("name, dtype", BACKWARD)
def test_backward_tasks_pass_the_environment(env, name, dtype):
    for task in backward_tasks(name, dtype, "cuda"):
        _assert_candidates_match_eager(task, random_inputs(task.inputs, 0, scale=2.0, device="cuda"))
        _assert_all_pass(env, task)


# Matrix-vector products (traced on the GPU, kind "matmul"): as the cases are, then Linear at batch 1 at
# a decoding step's size, an odd k (no vector loads), a matrix of few long rows times a column
# (rows split over a grid), and Linear at batch 2 at size.
GEMV_SHAPES = [
    ("linear_batch1", bf16, [(1, 4096), (11008, 4096)]),
    ("linear_bias_relu_batch1", f32, [(1, 4097), (1000, 4097), (1000,)]),
    ("matrix_column", f32, [(16, 131072), (131072, 1)]),
    ("matrix_column", bf16, [(4097, 1000), (1000, 1)]),
    ("linear_batch2", f32, [(2, 4096), (14336, 4096)]),
]


@pytest.mark.parametrize("name, dtype, shapes", [(n, dt, None) for n, dt in GEMV_PARAMS]
                         + GEMV_SHAPES, ids=lambda v: str(v))
def test_matrix_vector_products(env, name, dtype, shapes):
    task = gemv_task(name, dtype, "cuda", tuple(map(tuple, shapes)) if shapes else None)
    _assert_candidates_match_eager(task, random_inputs(task.inputs, 0, scale=2.0, device="cuda"))
    _assert_all_pass(env, task)


# (case, dtype, shapes of its inputs): odd row lengths, one row and many, long rows (clusters where
# too many to split over a grid: 64 x 393216; persistent clusters too where more than fit at once,
# an odd count of them: 33 x 393216)
SHAPES = [
    ("softmax", f16, [(1, 7)]), ("softmax", f16, [(64, 7)]), ("softmax", f32, [(5, 1)]),
    ("softmax", f16, [(1, 4097)]), ("softmax", bf16, [(4096, 1000)]), ("softmax", f32, [(16, 393216)]),
    ("softmax", f32, [(64, 393216)]), ("softmax", bf16, [(33, 393216)]), ("log_softmax", f32, [(40, 393216)]),
    ("softmax", bf16, [(3, 393216)]), ("softmax", bf16, [(16, 393216)]), ("log_softmax", bf16, [(16, 393216)]),
    ("log_softmax", bf16, [(16, 32000)]),
    ("layernorm", bf16, [(5, 1), (1,), (1,)]), ("layernorm", f16, [(1, 4097), (4097,), (4097,)]),
    ("layernorm", bf16, [(2, 65536), (65536,), (65536,)]), ("rmsnorm", f32, [(3, 4097), (4097,)]),
    ("rmsnorm", bf16, [(4, 393216), (393216,)]), ("logsumexp", f32, [(3, 4097)]),
    ("logsumexp", bf16, [(4096, 1000)]),  # enough rows that its first shapes load past L1 too
    ("sum_last", bf16, [(1, 393216)]), ("sum_last", f32, [(4096, 7)]), ("amax_last", f32, [(2, 4097)]),
    ("var_last", f16, [(7, 4097)]), ("mean_dim1", bf16, [(3, 4097, 5)]), ("softmax_dim1", f16, [(2, 100, 33)]),
    # column sums, tall and odd, and a bias's gradient (few columns: split over a cooperative grid,
    # as is a softmax over dim 1 of few columns); long rows split likewise (a sweep, rows held on
    # chip, a loss over a whole tensor)
    ("sum_columns", bf16, [(16384, 4096)]), ("sum_columns", f32, [(100003, 37)]),
    ("sum_columns", bf16, [(4096, 768)]), ("softmax_dim1", f32, [(4, 4096, 50)]),
    ("amax_last", bf16, [(16, 393216)]), ("sum_last", f32, [(16, 393217)]),
    ("mse_loss", bf16, [(8192, 4096), (8192, 4096)]), ("mse_loss", f32, [(1000, 999), (1000, 999)]),
]


@pytest.mark.parametrize("name, dtype, shapes", SHAPES, ids=lambda v: str(v))
def test_shapes(env, name, dtype, shapes):
    task = resized(gpu_task(name, dtype), *shapes)
    _assert_candidates_match_eager(task, random_inputs(task.inputs, 0, scale=2.0, device="cuda"))
    _assert_all_pass(env, task)


@pytest.mark.parametrize("dtype", [bf16, f32])
def test_long_softmaxes_over_wide_ranges(dtype):
    """Rows whose values span more than a thread's first value's range (a split bf16 softmax's
    kept terms are taken against it: rows codegen FIRST_VALUE_RANGE), beside random ones: every
    candidate over 16 x 393216 matches eager. Random inputs alone span too little to show it."""
    task = resized(gpu_task("softmax", dtype), (16, 393216))
    (x,) = random_inputs(task.inputs, 0, scale=2.0, device="cuda")
    x[0] = torch.linspace(-100, 100, 393216, device="cuda").to(dtype)  # a ramp: 64 and more within a thread
    x[1, ::8] = -200.0  # each vector's first element far below the rest
    x[2] = x[2] * 20  # wide random values
    _assert_candidates_match_eager(task, [x])


@pytest.mark.parametrize("dtype, shape", [(f16, (3, 16, 7, 9)), (bf16, (5, 16, 1, 1)), (f32, (2, 16, 64, 64)),
                                          (bf16, (4, 16, 128, 128)), (bf16, (128, 16, 64, 128)),
                                          (f32, (40, 16, 64, 64))], ids=str)
def test_groupnorm_shapes(env, dtype, shape):
    """GroupNorm traces with its shapes written into its reshapes, so each size is traced anew:
    rows without vectors (H * W = 63), rows of C/G elements (H * W = 1), long rows (clusters),
    more long rows than SMs (prefetched: 512 rows of 64 KB, 160 of 64 KB)."""
    task = gpu_task("groupnorm", dtype, shape)
    _assert_candidates_match_eager(task, random_inputs(task.inputs, 0, scale=2.0, device="cuda"))
    _assert_all_pass(env, task)


@pytest.mark.parametrize("dtype, rows, classes", [(bf16, 7, 32000), (f32, 3, 50257), (f16, 64, 1000),
                                                  (bf16, 300, 32000)], ids=str)
def test_cross_entropy_losses(env, dtype, rows, classes):
    """Each row's loss, its target's log-probability gathered in the kernel: a vocabulary's rows,
    an odd vocabulary (no vector access), many short rows, more rows than SMs (prefetched);
    targets drawn over the whole row and as the ignore_index."""
    inputs = [torch.randn(rows, classes, dtype=dtype, device="cuda"), torch.randint(0, classes, (rows,), device="cuda")]
    losses = traced_row_tasks(Fn(lambda x, t: F.cross_entropy(x, t)), inputs)[0]
    target = losses.inputs[0]  # drawn over the row, and as the ignore_index a quarter of the time
    assert "aten.gather.default" in losses.ops and (target.high, target.special) == (classes, (-100,))
    _assert_candidates_match_eager(losses, random_inputs(losses.inputs, 0, scale=2.0, device="cuda"))
    _assert_all_pass(env, losses)


@pytest.mark.parametrize("dtype, rows, classes", [(bf16, 7, 32000), (f32, 3, 50257), (bf16, 300, 32000)], ids=str)
def test_cross_entropy_backward(env, dtype, rows, classes):
    """The logits' gradient, each row's one-hot made in the kernel from its target (drawn over the
    row and as the ignore_index): a vocabulary's rows, an odd one (no vector access), more rows
    than SMs."""
    task = cross_entropy_backward_task(dtype, rows, classes, "cuda")
    _assert_candidates_match_eager(task, random_inputs(task.inputs, 0, scale=2.0, device="cuda"))
    _assert_all_pass(env, task)


def test_strided_rows_and_unaligned_inputs_take_the_scalar_fallback(env):
    """A slice of a wider tensor: rows 1024 apart; shifted by one element, the vector kernel's
    alignment fails and the width-1 kernel runs."""
    (task,) = traced_row_tasks(Fn(lambda x: torch.softmax(x[:, :1000], -1)),
                               [torch.randn(8, 1024, dtype=bf16, device="cuda")])
    assert task.inputs[0].stride == (1024, 1)
    candidates = propose(task)
    assert candidates[0].params["vector_width"] == 8
    wide = torch.randn(8, 1025, dtype=bf16, device="cuda")
    shifted = wide.as_strided((8, 1000), (1024, 1), 1)
    assert shifted.data_ptr() % 16
    _assert_candidates_match_eager(task, [shifted])
    _assert_all_pass(env, task)


# cumsum along rows: the suite's 8192 x 4096, with a cast prologue and epilogue, odd row lengths
# (no vectors), rows of one element, few long rows (one block a row)
SCAN_SHAPES = [
    ("cumsum", bf16, (8192, 4096)), ("cumsum", f32, (8192, 4096)), ("cumsum_cast", bf16, (8192, 4096)),
    ("cumsum", bf16, (3, 4097)), ("cumsum_cast", f32, (64, 7)), ("cumsum", f16, (7, 1000)),
    ("cumsum_cast", bf16, (5, 1)), ("cumsum", f32, (16, 393216)), ("cumsum_cast", f32, (1000, 999)),
]


@pytest.mark.parametrize("name, dtype, shape", SCAN_SHAPES, ids=str)
def test_scan_shapes(env, name, dtype, shape):
    task = gpu_scan_task(name, dtype, shape)
    _assert_candidates_match_eager(task, random_inputs(task.inputs, 0, scale=2.0, device="cuda"))
    _assert_all_pass(env, task)


# Shapes worth a kernel: LLM norms and softmaxes, the vocabulary's log_softmax, KernelBench's
# long-row softmax, a column sum.
BENCHMARKS = [
    ("softmax", bf16, [(4096, 4096)]), ("softmax", f32, [(4096, 4096)]), ("softmax", f32, [(16, 393216)]),
    ("log_softmax", bf16, [(4096, 32000)]), ("layernorm", bf16, [(8192, 4096), (4096,), (4096,)]),
    ("rmsnorm", bf16, [(8192, 4096), (4096,)]), ("sum_last", f32, [(4096, 4096)]),
    ("mean_dim1", f32, [(64, 512, 256)]), ("sum_last", f32, [(16, 393216)]), ("sum_last", bf16, [(16, 393216)]),
    ("amax_last", f32, [(16, 393216)]), ("amax_last", bf16, [(16, 393216)]), ("softmax", bf16, [(16, 393216)]),
]


def test_benchmark_shapes_pass_and_report_their_speedups(env):
    _report_speedups(env, [(name, dtype, shapes[0], resized(gpu_task(name, dtype), *shapes))
                           for name, dtype, shapes in BENCHMARKS])


def test_scan_benchmarks_pass_and_report_their_speedups(env):
    _report_speedups(env, [(name, dtype, shape, gpu_scan_task(name, dtype, shape))
                           for name, dtype, shape in SCAN_SHAPES[:3]])


def _report_speedups(env, tasks: list[tuple[str, torch.dtype, tuple[int, ...], Task]]):
    """Every candidate of each (name, dtype, shape, task) passes; prints its speedup."""
    lines = []
    for name, dtype, shape, task in tasks:
        candidates = propose(task)
        for candidate, ev in zip(candidates, env.evaluate_many(task, candidates, profile=True)):
            assert ev.status == "passed", f"{name} {candidate.origin}: {ev.status}: {ev.reason}"
            ours, inductor = ev.profile["ours_ms"], ev.profile["inductor_ms"]
            lines.append(f"{name} {str(dtype)[6:]} {shape} {candidate.origin.rsplit(':', 1)[1]}: "
                         f"{ev.profile['speedup_vs_inductor']:.2f}x Inductor (ours {ours['median'] * 1e3:.1f} us, "
                         f"host {ours['host_median'] * 1e3:.1f} us; Inductor {inductor['median'] * 1e3:.1f} us)")
    print("\n" + "\n".join(lines))
