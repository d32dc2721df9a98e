"""benchmarks/sass_mix.py on the CPU: a template kernel compiled for sm_90 and its SASS counted, and
what the count shows of a bf16 log-softmax's element (an exp and a max, nothing around them)."""
from __future__ import annotations

import functools
import shutil

import pytest
import torch

from benchmarks.sass_mix import kernel_mix, kernel_sass, main, nvdisasm, problem_tasks
from skills.rows import propose
from test_rows_template import case_task, resized

pytestmark = pytest.mark.skipif(shutil.which("nvcc") is None or nvdisasm() is None,
                                reason="needs nvcc and nvdisasm (the nvidia-cuda-nvdisasm wheel)")


@pytest.mark.parametrize("rows_of", [4096, 8192])
def test_a_bf16_log_softmax_element_is_one_exp_and_one_max(rows_of, tmp_path):
    """Held in registers, each element of the row is an exp (one MUFU) and a NaN-propagating max
    (one FMNMX): no compares for the max's NaN or the exp's subnormal results (17 instructions an
    element of cross-entropy had 4 such compares, 2026-11-26)."""
    task = resized(case_task("log_softmax", torch.bfloat16), (64, rows_of))
    for candidate in propose(task):
        mix = kernel_mix(candidate, task, "sm_90", tmp_path)
        elements = mix.elements_a_thread
        assert elements == rows_of / candidate.params["threads"]
        assert mix.opcodes["MUFU"] >= elements and mix.opcodes["FMNMX"] >= elements, candidate.origin
        assert mix.opcodes["FSETP"] + mix.opcodes["FSEL"] < elements / 2, candidate.origin


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_a_persistent_clusters_row_barrier_waits_for_no_global_memory(dtype, tmp_path):
    """Between a persistent cluster's rows, the barrier after which its blocks read each other's
    partials releases only shared memory: the one MEMBAR.ALL.GPU left is the kernel's last barrier.
    The row loop's, which waited for every store and load each thread had in flight, cost a bf16
    softmax over 1024 x 393216 6% on an H200 (2026-11-27)."""
    task = resized(case_task("softmax", dtype), (64, 393216))
    persistent = [c for c in propose(task) if c.params["persistent"]]
    assert persistent
    for candidate in persistent:
        _, sass = kernel_sass(candidate, "sm_90", tmp_path)
        assert sass.count("MEMBAR.ALL.GPU") == 1 and sass.count("UCGABAR_ARV") == 2, candidate.origin


def test_the_command_names_a_problem_it_does_not_know():
    with pytest.raises(ValueError, match="no problem named"):
        main(["no_such_problem"])


@functools.cache
def _layernorm_gelu_task():
    (task,) = [t for t in problem_tasks("layernorm_gelu", "bf16") if t.kind == "reduction"]
    return task


def test_an_inference_problems_tasks_are_traced_as_the_suite_runs_them():
    """Under no_grad, as the suite times it: a LayerNorm + tanh GELU's row task writes only its
    bf16 output, so its GELU takes the fast forms (traced with grad on, it also wrote the norm's
    mean and rstd in fp32 and took none)."""
    task = _layernorm_gelu_task()
    assert [o.torch_dtype for o in task.outputs] == [torch.bfloat16]
    (candidate, *_) = propose(task)
    assert "pw_gelu_tanh_fast(" in candidate.source


def test_a_fast_tanh_gelu_element_is_an_ex2_and_an_rcp_with_no_guards(tmp_path):
    """The suite's bf16 LayerNorm + tanh GELU (8192 x 4096): each element's GELU is one ex2 and one
    rcp (MUFU) with no compare or select around them (rcp.approx without .ftz took a compare, a
    select and two multiplies an element); at 128 threads a row 26 instructions an element, where
    the chain with the fast 1 + tanh took 35 (2026-12-07)."""
    task = _layernorm_gelu_task()
    for candidate in propose(task):
        mix = kernel_mix(candidate, task, "sm_90", tmp_path)
        elements = mix.elements_a_thread
        assert mix.opcodes["MUFU"] <= 2 * elements + 2, candidate.origin  # and the row's rsqrt
        assert mix.opcodes["FSETP"] + mix.opcodes["FSEL"] < elements / 4, candidate.origin
        if candidate.origin.endswith(":t128r1v8"):
            assert mix.count <= 28 * elements
