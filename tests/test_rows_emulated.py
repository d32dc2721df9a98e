"""The rows template's kernels, run on the CPU by a CUDA emulator (tests/cuda_emulation.py:
threads as OS threads, barriers for __syncthreads, shuffles and cluster.sync, per-block shared
memory that a cluster's blocks map), against each task's own program run eagerly: every launch
shape the template proposes for the traced cases, and the shapes long rows get (shared memory,
clusters, slices of unequal length) at sizes the emulator runs quickly. What only a GPU shows
(speed, alignment, occupancy) is test_rows_gpu.py's."""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from agent_backend.env.verify import WIDE_DRAW, InputDraw
from agent_backend.specs import Task, random_inputs
from agent_backend.task import load_program
from cuda_emulation import compiler, run
from skills.rows.candidates import launch_arguments, launch_configs
from skills.rows.codegen import Launch, kernel_source
from skills.rows.plan import build_plan
from test_fast_forms import gelu_tanh
from test_rows_template import (BACKWARD, CASES, GEMV_PARAMS, Fn, _cross_entropy_tasks, assert_computes_the_task,
                                backward_tasks, case_task, cross_entropy_backward_task, gemv_task, resized, scan_task,
                                traced_row_tasks)

pytestmark = [pytest.mark.skipif(compiler() is None, reason="needs a C++ compiler"), pytest.mark.slow]

f32, f16, bf16 = torch.float32, torch.float16, torch.bfloat16


def _check(task: Task, launch: Launch, workdir, seed: int = 0, plan=None,
           draw: InputDraw = InputDraw(2.0, 0.0)) -> None:
    plan = plan or build_plan(task)
    inputs = random_inputs(task.inputs, seed, scale=draw.scale, offset=draw.offset, device="cpu")
    got = run(kernel_source(plan, "k", launch), "k", launch_arguments(plan, launch), inputs, list(task.outputs),
              workdir)
    assert_computes_the_task(task, inputs, tuple(got), str(launch))


@pytest.mark.parametrize("name, dtype", [(n, dt) for n in CASES for dt in (f32, bf16)])
def test_every_proposed_launch_computes_the_task(name, dtype, tmp_path):
    """Under both plans where a sum of exp may be taken online (plans() tries the held one on short rows).
    A shape's twin loading past L1 (no_l1) differs only in its loads, which the emulator makes plain:
    test_launches_loading_past_l1_compute_the_task."""
    task = case_task(name, dtype)
    for plan in dict.fromkeys([build_plan(task), build_plan(task, online=True)]):
        for launch in launch_configs(plan):
            if not launch.no_l1:
                _check(task, launch, tmp_path, plan=plan)


@pytest.mark.parametrize("name, dtype", GEMV_PARAMS)
def test_every_matrix_vector_launch_computes_the_product(name, dtype, tmp_path):
    task = gemv_task(name, dtype)
    for launch in launch_configs(build_plan(task)):
        _check(task, launch, tmp_path)


@pytest.mark.parametrize("name", ["logsumexp", "mse_loss", "mean_dim1"])
def test_launches_loading_past_l1_compute_the_task(name, tmp_path):
    task = case_task(name, bf16)
    plan = build_plan(task)
    launch = replace(launch_configs(plan)[0], no_l1=True)
    assert "rows_ld_stream(" in kernel_source(plan, "k", launch)
    _check(task, launch, tmp_path, plan=plan)


@pytest.mark.parametrize("dtype", [f32, bf16])
def test_cross_entropy_losses_gather_each_rows_target(dtype, tmp_path):
    """Every launch of the per-row losses, on indices drawn over the whole row (seeds differ, so
    a kernel reading the wrong element or the first would fail)."""
    task = _cross_entropy_tasks(dtype, 6, 200)[0]
    for plan in (build_plan(task), build_plan(task, online=True)):
        for seed, launch in enumerate(launch_configs(plan)):
            _check(task, launch, tmp_path, seed, plan)


@pytest.mark.parametrize("dtype", [f32, bf16])
def test_cross_entropy_backward_makes_each_rows_one_hot(dtype, tmp_path):
    """Every launch, on targets drawn over the row and as the ignore_index (a kernel counting the
    element's place wrongly, or not masking ignored rows, would fail)."""
    task = cross_entropy_backward_task(dtype, 6, 200)
    for seed, launch in enumerate(launch_configs(build_plan(task))):
        _check(task, launch, tmp_path, seed)


def _scaled_by_a_one_hot_sum(x, t):
    iota = torch.ops.prims.iota(x.shape[1], start=0, step=1, dtype=torch.int64, device=x.device, requires_grad=False)
    return x * torch.where(t.unsqueeze(1) == iota.reshape(1, -1), 2.0, 0.25).sum(1, keepdim=True)


def test_a_one_hot_sum_counts_a_target_outside_the_row_at_no_place(tmp_path):
    """The one-hot's sum in closed form (plan._one_hot_sum), with a value elsewhere that is not 0
    (equal terms summed made a product) and targets before, at both ends of and past the row."""
    x, t = torch.randn(4, 200), torch.tensor([-5, 0, 199, 200])
    (task,) = traced_row_tasks(Fn(_scaled_by_a_one_hot_sum), [x, t])
    plan = build_plan(task.on_device("cuda"))
    assert plan.passes == ()
    expected = x * torch.tensor([[50.0], [51.75], [51.75], [50.0]])  # 0.25 x 200, or 2 + 0.25 x 199
    inputs = sorted([x, t], key=lambda a: [s.dtype for s in task.inputs].index(str(a.dtype).removeprefix("torch.")))
    for launch in launch_configs(plan)[:3]:
        (got,) = run(kernel_source(plan, "k", launch), "k", launch_arguments(plan, launch), inputs,
                     list(task.outputs), tmp_path)
        torch.testing.assert_close(got, expected, msg=str(launch))


@pytest.mark.parametrize("name, dtype", BACKWARD)
def test_backward_tasks_compute_their_gradients(name, dtype, tmp_path):
    for task in backward_tasks(name, dtype):
        for launch in launch_configs(build_plan(task)):
            _check(task, launch, tmp_path)


class _RecomputedProbabilities(torch.nn.Module):
    """Cross-entropy's backward in a bf16 training graph: the log-probabilities converted to bf16
    and back before their exp, then scaled by a per-row sum."""

    def forward(self, x, lse):
        p = torch.exp((x.float() - lse).to(torch.bfloat16).float())
        return (p * p.sum(-1, keepdim=True)).to(torch.bfloat16)


def test_a_conversion_to_bf16_within_the_row_keeps_fp32(tmp_path):
    """As Inductor computes it (emulate_precision_casts off): log-probabilities near -10 rounded to
    bf16 move by up to 1/32, so their exp by up to 3%, where the output's own rounding is 0.4%.
    An H200's in-context check of a language model's head measured its weight gradient 4x less
    accurate than Inductor's that way (2026-11-27) and dropped the kernel."""
    torch.manual_seed(0)
    x = (torch.randn(4, 1000) * 2).to(bf16)
    lse = torch.full((4, 1), 10.0) + torch.rand(4, 1)
    (task,) = traced_row_tasks(_RecomputedProbabilities(), [x, lse])
    plan = build_plan(task.on_device("cuda"))  # the kernel a GPU would get
    p = torch.exp(x.double() - lse.double())
    expected = p * p.sum(-1, keepdim=True)
    for launch in launch_configs(plan)[:2]:
        (got,) = run(kernel_source(plan, "k", launch), "k", launch_arguments(plan, launch), [x, lse],
                     list(task.outputs), tmp_path)
        assert ((got.double() - expected).abs() / expected).max() <= 2 ** -8, launch  # one rounding, to bf16


# (task, launch): long-row shapes on rows short enough to emulate. Shared-memory rows, register
# and shared-memory clusters (slices of unequal length where the row does not divide), rows split
# over a cooperative grid (along rows and across them), sub-warp
# rows, several rows a block across warps, streaming clusters, rows of one element.
LONG = {
    "shared_block": (lambda: resized(case_task("softmax", f32), (3, 2000)), Launch(64, 1, 4, "shared")),
    "shared_two_rows_a_block": (lambda: resized(case_task("layernorm", bf16), (5, 999), (999,), (999,)),
                                Launch(64, 2, 1, "shared")),
    "register_cluster": (lambda: resized(case_task("softmax", f32), (3, 2000)), Launch(64, 1, 4, "registers", 4)),
    # persistent clusters (two launched, looping over the rows): an odd count of rows, slices of
    # unequal length, two passes
    "persistent_cluster": (lambda: resized(case_task("softmax", f32), (5, 2000)),
                           Launch(64, 1, 4, "registers", 4, persistent=True)),
    "persistent_cluster_unequal": (lambda: resized(case_task("log_softmax", bf16), (7, 4097)),
                                   Launch(32, 1, 1, "registers", 8, persistent=True)),
    "persistent_layernorm": (lambda: resized(case_task("layernorm", f32), (3, 3000), (3000,), (3000,)),
                             Launch(32, 1, 4, "registers", 8, persistent=True)),
    "shared_cluster_unequal_slices": (lambda: resized(case_task("softmax", f16), (2, 4097)),
                                      Launch(64, 1, 1, "shared", 4)),
    "layernorm_cluster": (lambda: resized(case_task("layernorm", f32), (2, 3000), (3000,), (3000,)),
                          Launch(32, 1, 4, "registers", 8)),
    "logsumexp_cluster": (lambda: resized(case_task("logsumexp", bf16), (2, 1000)), Launch(32, 1, 8, "shared", 2)),
    "streaming_cluster": (lambda: resized(case_task("sum_last", f32), (1, 5000)), Launch(64, 1, 4, "registers", 8)),
    # rows split over a cooperative grid: slices of unequal length, a row of a whole tensor, and
    # passes that each combine through the workspace, rows held in registers between them
    "split_sum": (lambda: resized(case_task("sum_last", f32), (3, 5000)), Launch(32, 1, 4, split=4)),
    "split_amax_scalar": (lambda: resized(case_task("amax_last", bf16), (2, 4097)), Launch(32, 1, 1, split=8)),
    "split_mse_whole": (lambda: resized(case_task("mse_loss", f32), (40, 100), (40, 100)), Launch(32, 1, 4, split=8)),
    "split_softmax": (lambda: resized(case_task("softmax", bf16), (2, 2000)), Launch(32, 1, 8, split=4)),
    # more blocks a row than a warp has lanes: lanes fold two slots each after the barrier
    "split_wider_than_a_warp": (lambda: resized(case_task("logsumexp", f32), (1, 4000)), Launch(32, 1, 1, split=36)),
    # held in shared memory, fp32 (the shapes benchmarks/rows_ceiling.py probes beyond those proposed)
    "split_softmax_shared_f32": (lambda: resized(case_task("softmax", f32), (2, 4000)),
                                 Launch(32, 1, 4, "shared", split=4)),
    # and columns (rows across the threads of a warp) split likewise: a column sum whose rows do not
    # fill the last warp, and a softmax over dim 1 held in registers over its passes
    "split_columns": (lambda: resized(case_task("sum_columns", f32), (300, 40)), Launch(8, 32, 1, split=4)),
    "split_columns_bf16": (lambda: resized(case_task("sum_columns", bf16), (1000, 70)), Launch(8, 32, 1, split=8)),
    "split_softmax_dim1": (lambda: case_task("softmax_dim1", f32, (4, 50, 20)), Launch(8, 32, 1, split=2)),
    # threads taking several consecutive columns at once (a vector across them), split or not,
    # rows of the columns not dividing among the blocks
    "lanes_split_bf16": (lambda: resized(case_task("sum_columns", bf16), (1000, 64)), Launch(32, 8, 8, split=4)),
    "lanes_f32": (lambda: resized(case_task("sum_columns", f32), (77, 96)), Launch(4, 8, 4)),
    "lanes_mean_dim1": (lambda: case_task("mean_dim1", bf16, (3, 70, 16)), Launch(8, 2, 8, split=2)),
    # two passes split: every thread folds the mean (the second pass reads it), one the variance
    "split_var_dim1": (lambda: case_task("var_dim1", f32, (3, 200, 40)), Launch(8, 32, 1, split=4)),
    "var_streaming_rows": (lambda: resized(case_task("var_last", f16), (5, 33)), Launch(8, 4, 1)),
    "sub_warp_rows": (lambda: resized(case_task("amax_last", bf16), (64, 7)), Launch(4, 8, 1)),
    "warps_per_row": (lambda: resized(case_task("rmsnorm", f32), (3, 1000), (1000,)), Launch(128, 2, 4)),
    "row_of_one": (lambda: resized(case_task("layernorm", f32), (8, 1), (1,), (1,)), Launch(1, 32, 1)),
    "mean_of_losses": (lambda: _cross_entropy_tasks()[1], Launch(4, 8, 1)),
    "cross_entropy_cluster": (lambda: _cross_entropy_tasks(bf16, 2, 3000)[0], Launch(64, 1, 8, "registers", 4)),
    "cross_entropy_shared": (lambda: _cross_entropy_tasks(f32, 3, 2000)[0], Launch(64, 1, 4, "shared")),
    # GroupNorm on odd sizes: H * W = 63 (no vectors), H * W = 1 (rows of C/G elements), a cluster
    "groupnorm_odd": (lambda: case_task("groupnorm", f16, (3, 16, 7, 9)), Launch(32, 1, 1)),
    "groupnorm_1x1": (lambda: case_task("groupnorm", bf16, (5, 16, 1, 1)), Launch(4, 8, 1)),
    "groupnorm_cluster": (lambda: case_task("groupnorm", f32, (2, 16, 16, 16)), Launch(64, 1, 4, "registers", 4)),
    # one block an SM (132) looping over more rows, each prefetched while the last is worked on:
    # 2-3 rows a block, the last block's next row past the end
    "prefetch_softmax_bf16": (lambda: resized(case_task("softmax", bf16), (300, 64)), Launch(4, 1, 8, prefetch=True)),
    "prefetch_groupnorm_f32": (lambda: case_task("groupnorm", f32, (40, 16, 4, 4)), Launch(8, 1, 4, prefetch=True)),
    "prefetch_log_softmax": (lambda: resized(case_task("log_softmax", bf16), (140, 120)),
                             Launch(8, 1, 8, prefetch=True)),
}


@pytest.mark.parametrize("label", LONG)
def test_long_row_launches_compute_the_task(label, tmp_path):
    make, launch = LONG[label]
    _check(make(), launch, tmp_path)


def test_a_split_row_kernel_that_leaves_its_counters_non_zero_fails(tmp_path):
    """The launch op keeps a kernel's counters for its next launch, so every launch must leave
    them zeroed: the emulator fails a kernel that leaves a count there (its output is right, only
    the next launch would show it). The generated barriers leave none: every other test here."""
    task = resized(case_task("var_dim1", f32), (3, 200, 40))  # two passes, each its own barrier
    plan, launch = build_plan(task), Launch(8, 32, 1, split=4)
    source = kernel_source(plan, "k", launch).rstrip()
    inputs = random_inputs(task.inputs, 0, device="cpu")
    # block 0, gone past its last barrier, counts again on the first pass's (idle by then)
    counting = source[:-1] + "  if (blockIdx.x == 0 && threadIdx.x == 0 && threadIdx.y == 0) atomicAdd(bar, 1u);\n}\n"
    assert source.endswith("}") and source.count("rows_split_barrier(bar") == 2
    with pytest.raises(AssertionError, match="the kernel left its counters non-zero"):
        run(counting, "k", launch_arguments(plan, launch), inputs, list(task.outputs), tmp_path)


# Online sums of exp (a max and its rescaled sum): through the workspace, across a cluster's
# blocks, across rows by lanes, and a softmax's whose exps are outputs too.
ONLINE = {
    "split_logsumexp": (lambda: resized(case_task("logsumexp", f32), (3, 5000)), Launch(32, 1, 4, split=4)),
    "split_cross_entropy": (lambda: _cross_entropy_tasks(bf16, 2, 3000)[0], Launch(64, 1, 8, split=4)),
    "cluster_logsumexp": (lambda: resized(case_task("logsumexp", bf16), (2, 1000)), Launch(32, 1, 8, cluster=2)),
    "lanes_logsumexp_dim1": (lambda: case_task("logsumexp_dim1", f32, (3, 70, 16)), Launch(8, 2, 8, split=2)),
    "split_softmax": (lambda: resized(case_task("softmax", bf16), (2, 2000)), Launch(32, 1, 8, split=4)),
    # fp32: each term kept for the output (Partial.kept), over a grid and over a cluster
    "split_softmax_f32": (lambda: resized(case_task("softmax", f32), (2, 2000)), Launch(32, 1, 4, split=4)),
    "cluster_softmax_f32": (lambda: resized(case_task("softmax", f32), (3, 1000)), Launch(32, 1, 4, cluster=2)),
    "shared_cluster_softmax": (lambda: resized(case_task("softmax", f16), (2, 4097)), Launch(64, 1, 1, "shared", 4)),
    "persistent_softmax": (lambda: resized(case_task("softmax", bf16), (9, 2000)),
                           Launch(32, 1, 8, "registers", 4, persistent=True)),
    # across rows, held over a grid
    "across_rows_softmax_dim1": (lambda: case_task("softmax_dim1", f32, (4, 300, 6)), Launch(8, 32, 1, split=4)),
}


@pytest.mark.parametrize("label", ONLINE)
def test_online_launches_compute_the_task(label, tmp_path):
    make, launch = ONLINE[label]
    task = make()
    _check(task, launch, tmp_path, plan=build_plan(task, online=True))


@pytest.mark.parametrize("dtype, launch", [(bf16, Launch(32, 1, 8, split=4)), (bf16, Launch(64, 1, 8, split=2)),
                                           (f16, Launch(32, 1, 8, split=4))])
def test_kept_terms_far_above_a_threads_first_value_are_taken_again_against_its_max(dtype, launch, tmp_path):
    """A split fp16/bf16 softmax's kept terms are summed against the floor of each thread's first
    element; where the thread's max is more than FIRST_VALUE_RANGE above it (each vector's first element far
    below the rest, in row 0; a ramp in row 1), they are taken again from memory against its max,
    to the verifier's accuracy (row 2: no thread goes back)."""
    task = resized(case_task("softmax", dtype), (3, 2000))
    plan = build_plan(task, online=True)
    source = kernel_source(plan, "k", launch)
    assert "floorf(fmaxf(" in source and "<= 64.0f" in source
    inputs = random_inputs(task.inputs, 0, scale=2.0, device="cpu")
    inputs[0][0, ::4] = -200.0
    inputs[0][1] = torch.linspace(-100, 100, 2000)
    got = run(source, "k", launch_arguments(plan, launch), inputs, list(task.outputs), tmp_path)
    assert_computes_the_task(task, inputs, tuple(got), str(launch))


def test_a_fast_tanh_gelu_over_its_whole_range_computes_the_task(tmp_path):
    """A bf16 LayerNorm + tanh GELU in one function (ops.pw_gelu_tanh_fast) computes the task to
    the verifier's accuracy where the GELU's input spans about -40 to 40: far below 0 its exp
    overflows and its reciprocal flushes (-0, where the graph's tanh has rounded to -1), and from
    about -6 to -10 it keeps values the graph's fp32 tanh rounds away."""
    task = case_task("layernorm_gelu_tanh", torch.bfloat16)
    plan = build_plan(task)
    launch = launch_configs(plan)[0]
    source = kernel_source(plan, "k", launch)
    assert "pw_gelu_tanh_fast(" in source
    x, weight, bias = random_inputs(task.inputs, 0, device="cpu")
    x[:] = torch.linspace(-3, 3, x.shape[-1])  # normalized to about -1.7 .. 1.7
    weight[:] = 24.0
    got = run(source, "k", launch_arguments(plan, launch), [x, weight, bias], list(task.outputs), tmp_path)
    assert_computes_the_task(task, [x, weight, bias], tuple(got), str(launch))
    # and within a bf16 ulp of the GELU in float64 everywhere, as x sigmoid(2 z) (the graph's
    # 1 + tanh(z) cancels far below 0 even in float64; the verifier's bounds, relative to the
    # output's scale, would pass an exponent a few percent off); below 1e-35 it may flush
    h = F.layer_norm(x.double(), x.shape[-1:], weight.double(), bias.double())
    exact = gelu_tanh(h)
    error = (got[0].double() - exact).abs()
    assert bool((error <= 2.0**-7 * exact.abs() + 1e-35).all()), float((error / exact.abs()).max())


# Exps and variances over long rows, each path once: terms kept against a thread's first value
# (bf16 over a grid) or its max (fp32), online sums through a workspace, a cluster and a
# persistent loop, a mean subtracted before its squares.
WIDE = {**{label: ONLINE[label] for label in ("split_softmax", "split_softmax_f32", "persistent_softmax",
                                              "shared_cluster_softmax", "split_logsumexp", "split_cross_entropy")},
        **{label: LONG[label] for label in ("persistent_cluster_unequal", "layernorm_cluster", "prefetch_log_softmax",
                                            "split_var_dim1")}}


@pytest.mark.parametrize("label", WIDE)
def test_launches_compute_the_task_on_the_verifiers_wide_draw(label, tmp_path):
    """The verifier's last input set (values to about 150, a thread's spanning far over
    FIRST_VALUE_RANGE, a mean of 60 under a variance) rejects no kernel of the template's."""
    make, launch = WIDE[label]
    task = make()
    _check(task, launch, tmp_path, plan=build_plan(task, online=label in ONLINE), draw=WIDE_DRAW)


def _special_rows(x: torch.Tensor) -> torch.Tensor:
    """`x` with rows of -inf, one +inf, a NaN, -inf beside finite values, and values growing along
    the row (the running max rises at every element) or far from 0."""
    x = x.clone()
    n = x.shape[-1]
    x[0] = float("-inf")
    x[1, n // 3] = float("inf")
    x[2, n // 2] = float("nan")
    x[3, ::2] = float("-inf")
    x[4] = torch.linspace(-50, 50, n, dtype=torch.float64).to(x.dtype)
    x[5] = x[5] * 0.01 - 3000
    return x


@pytest.mark.parametrize("name, dtype", [("logsumexp", f32), ("logsumexp", bf16), ("log_softmax", f32),
                                         ("softmax", bf16), ("softmax", f32), ("cross_entropy", bf16),
                                         ("logsumexp_dim1", f32),
                                         ("softmax_dim1", f32)])
def test_online_sums_of_exp_keep_eagers_infinities_and_nans(name, dtype, tmp_path):
    """A sum of exp(x - max) taken online (rescaled as the max grows) gives what the graph does
    where the max is not finite: NaN for a softmax's row of -inf or with +inf, logsumexp's -inf
    and inf behind its guard; and NaN where the row has one. Every launch of the online plan."""
    if name == "cross_entropy":
        task = _cross_entropy_tasks(dtype, 6, 300)[0]
    elif name in ("logsumexp_dim1", "softmax_dim1"):
        task = case_task(name, dtype, (6, 40, 3))
    else:
        task = resized(case_task(name, dtype), (6, 300))
    plan = build_plan(task, online=True)
    assert "online" in [p.combine for p in plan.passes[0].partials]
    inputs = random_inputs(task.inputs, 0, scale=2.0, device="cpu")
    rows = next(k for k, s in enumerate(task.inputs) if s.torch_dtype.is_floating_point)  # not a loss's targets
    inputs[rows] = _special_rows(inputs[rows])
    model = load_program(task.program)["Model"]()
    with torch.no_grad():
        expected = model(*inputs)
    expected = expected if isinstance(expected, tuple) else (expected,)
    for launch in launch_configs(plan):
        got = run(kernel_source(plan, "k", launch), "k", launch_arguments(plan, launch), inputs, list(task.outputs),
                  tmp_path)
        for g, e in zip(got, expected):
            torch.testing.assert_close(g, e, equal_nan=True, atol=1e-2, rtol=1e-2, msg=lambda m: f"{launch}: {m}")


@pytest.mark.parametrize("name, dtype, length",
                         [("cumsum", dt, n) for dt in (f32, bf16) for n in (1, 7, 33, 1000, 4097)]
                         + [("cumsum_cast", dt, n) for dt in (f32, bf16) for n in (7, 1000, 4097)])
def test_every_proposed_scan_launch_computes_the_task(name, dtype, length, tmp_path):
    """cumsum along rows of odd lengths (no vectors at 7, 33 and 4097), three rows, with and
    without a prologue and epilogue (rows of one element: the source itself, per row), under
    every launch shape proposed."""
    task = scan_task(name, dtype, (3, length))
    for launch in launch_configs(build_plan(task)):
        _check(task, launch, tmp_path)


# scans in several chunks, double-buffered across warps; sub-warp rows, several a block; a chunk's
# tiles beyond the row's end
SCAN_LAUNCHES = {
    "chunks_across_warps": (lambda: scan_task("cumsum_cast", bf16, (2, 4000)), Launch(64, 1, 8)),
    "chunks_two_rows_a_block": (lambda: scan_task("cumsum", f32, (5, 1000)), Launch(64, 2, 4)),
    "sub_warp_rows": (lambda: scan_task("cumsum_cast", f32, (9, 33)), Launch(4, 8, 1)),
    "tiles_past_the_end": (lambda: scan_task("cumsum", bf16, (2, 1000)), Launch(32, 1, 1)),
}


@pytest.mark.parametrize("label", SCAN_LAUNCHES)
def test_scan_launches_compute_the_task(label, tmp_path):
    make, launch = SCAN_LAUNCHES[label]
    _check(make(), launch, tmp_path)


_EMULATED_WINNER = '''
from pathlib import Path

import torch.nn as nn

from agent_backend.specs import TensorSpec
from cuda_emulation import run


class ModelNew(nn.Module):
    def forward(self, *inputs):
        for k, (x, (shape, stride, dtype)) in enumerate(zip(inputs, {inputs!r})):
            assert tuple(x.shape) == shape and str(x.dtype) == "torch." + dtype and all(
                n == 1 or a == b for n, a, b in zip(shape, x.stride(), stride)), ("input", k, x.shape, x.stride())
        outputs = [TensorSpec(*o) for o in {outputs!r}]
        return tuple(run({source!r}, "k", {launch!r}, list(inputs), outputs, Path({workdir!r})))
'''


def test_row_kernels_in_a_training_steps_graph_compute_the_step(tmp_path):
    """GPT-2's training step (bf16, rows of 128) with every row task run by its rows kernel in the
    emulator, as a winner in the compiled graph: the forward's LayerNorms, their backward, the
    loss, the bias gradients. Rows are taken 16 threads x 8 rows x 8 wide where they allow it
    (what an H100 search picked for GPT-2's LayerNorm backward, 1.12x alone, whose graph then
    disagreed with Inductor's on the GPU, 2026-11-25). Loss and gradients are eager's."""
    import dataclasses

    from transformers import GPT2Config, GPT2LMHeadModel

    from agent_backend.dispatch import close_shared_environments
    from agent_backend.options import resolve
    from test_in_context import _compile_with
    from test_rows_template import _on_cuda

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=32, n_embd=128, n_layer=1, n_head=2,
                                       resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)).to(bf16)
    ids = torch.randint(0, 64, (2, 8))

    def step(i):
        out = model(i, labels=i)
        out.loss.float().backward()
        return out.loss.detach()

    def emulated(task):
        if task.kind != "reduction":
            return None
        plan = build_plan(_on_cuda(task))  # the kernel a GPU would get for this task
        launch = launch_configs(plan)[0]
        if plan.along_rows and plan.row_length % 128 == 0:
            launch = dataclasses.replace(launch, threads=16, rows=8, width=8, cluster=1, split=1)
        launches.append(launch)
        return _EMULATED_WINNER.format(
            source=kernel_source(plan, "k", launch), launch=launch_arguments(plan, launch), workdir=str(tmp_path),
            inputs=[(s.shape, s.stride, s.dtype) for s in task.inputs],
            outputs=[(s.shape, s.stride, s.dtype, s.device) for s in task.outputs])

    expected_loss = step(ids)
    expected = {name: p.grad.clone() for name, p in model.named_parameters()}
    model.zero_grad()
    launches: list[Launch] = []
    try:
        loss, decisions, _ = _compile_with(step, [ids], resolve({"mode": "search", "in_context_check": False}),
                                           emulated)
    finally:
        close_shared_environments()
    assert sum(launch.threads == 16 and launch.rows == 8 for launch in launches) >= 6, launches
    assert decisions and all(d.winner_key for d in decisions)
    torch.testing.assert_close(loss, expected_loss, rtol=2e-3, atol=2e-3)
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.grad.float(), expected[name].float(), rtol=2e-2, atol=2e-2, msg=name)
