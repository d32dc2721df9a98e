"""The skinny template (skills/skinny) on the CPU: which products it takes and how it reads them,
the kernel it writes, and its candidates as launch specs; every kernel compiled for sm_90."""
from __future__ import annotations

import functools
import re

import pytest
import torch
import torch.nn.functional as F

from agent_backend.env import nvrtc
from agent_backend.env.launch_spec import Arg
from agent_backend.specs import Task
from cuda_agent_core import toolchain
from helpers import launch_spec_of
from skills import skinny
from skills.skinny.candidates import LAUNCHES, model_source, tag
from skills.skinny.codegen import Launch, kernel_source, vector_loads
from skills.skinny.plan import build_plan
from test_rows_template import Fn, _randn, traced_row_tasks

f32, f16, bf16 = torch.float32, torch.float16, torch.bfloat16

# name -> (fn, shapes of its inputs): the products the template takes, as the pass claims them
SKINNY_CASES = {
    "linear_batch1": (lambda x, w: F.linear(x, w), [(1, 1000), (37, 1000)]),
    "linear_bias_batch5": (lambda x, w, b: F.linear(x, w, b), [(5, 1000), (37, 1000), (37,)]),
    "linear_batch9": (lambda x, w: F.linear(x, w), [(9, 1000), (37, 1000)]),  # two tiles of vectors
    "linear_batch16": (lambda x, w: F.linear(x, w), [(16, 1000), (37, 1000)]),
    "linear_odd_k": (lambda x, w: F.linear(x, w), [(3, 1001), (40, 1001)]),  # no 16-byte loads
    "matrix_columns": (lambda a, v: a @ v, [(4097, 1000), (1000, 4)]),  # the columns strided along k
    "matrix_column_bias": (lambda a, v, b: torch.addmm(b, a, v), [(300, 512), (512, 1), (300, 1)]),
    # epilogues: an activation and a residual; a gate (another input of the output's shape); the
    # product and its ReLU both returned
    "linear_bias_gelu_residual": (lambda x, w, b, r: F.gelu(F.linear(x, w, b)) + r,
                                  [(4, 1000), (37, 1000), (37,), (4, 37)]),
    "linear_silu_gate": (lambda x, w, u: F.silu(F.linear(x, w)) * u, [(6, 1000), (37, 1000), (6, 37)]),
    "linear_and_relu": (lambda x, w: (lambda y: (y, torch.relu(y)))(F.linear(x, w)), [(3, 1000), (37, 1000)]),
}


@functools.cache
def skinny_task(name: str, dtype: torch.dtype = bf16, device: str = "cpu", shapes: tuple | None = None) -> Task:
    """Case `name` traced on `device` at `shapes` (its fn's arguments', default the case's), on
    CUDA. Without Inductor's padding of half-precision products' odd sizes (pad_mm), which it
    does on a GPU where its own benchmark finds it faster, so the task would vary from run to run."""
    fn, default = SKINNY_CASES[name]
    inputs = [_randn(s, dtype, device, seed=k) for k, s in enumerate(shapes or default)]
    with torch._inductor.config.patch(shape_padding=False):
        (task,) = traced_row_tasks(Fn(fn), inputs, kind="matmul")
    return task.on_device("cuda")


def _input(task: Task, shape: tuple) -> int:
    (k,) = [k for k, s in enumerate(task.inputs) if s.shape == shape]
    return k


def test_linear_reads_the_weight_as_the_matrix_and_x_rows_as_the_vectors():
    task = skinny_task("linear_bias_batch5", f16)
    plan = build_plan(task)
    w, x, b = _input(task, (37, 1000)), _input(task, (5, 1000)), _input(task, (37,))
    assert (plan.rows, plan.vectors, plan.k, plan.dtype) == (37, 5, 1000, f16)
    assert (plan.matrix.input, plan.matrix.strides) == (w, (1000, 1))
    assert (plan.vector.input, plan.vector.strides) == (x, (1000, 1))
    assert plan.place == (1, 37)  # out[x row, weight row]
    assert vector_loads(plan) == {"matrix": True, "vector": True}
    # the bias is the epilogue's: added to the product (an input the kernel has, not loads)
    assert plan.product == 3 and set(plan.epilogue.reads) == {b, 3} and len(plan.epilogue.body) == 1
    assert plan.epilogue.inputs[w].spec.shape == ()  # read by the product only


def test_a_matrix_times_columns_reads_the_columns_strided():
    task = skinny_task("matrix_columns")
    plan = build_plan(task)
    assert (plan.rows, plan.vectors, plan.k) == (4097, 4, 1000)
    assert plan.matrix.strides == (1000, 1) and plan.vector.strides == (1, 4) and plan.place == (4, 1)
    assert vector_loads(plan) == {"matrix": True, "vector": False}


@pytest.mark.parametrize("name, shapes, dtype, why", [
    ("linear_batch1", None, f32, "tensor cores would compute it in another precision"),
    ("linear_batch16", [(17, 64), (37, 64)], bf16, "more than 16 vectors on either side"),
    ("matrix_columns", [(5, 64), (64, 300)], bf16, "not contiguous along k"),  # x @ W with W (in, out)
])
def test_refuses_what_it_cannot_take(name, shapes, dtype, why):
    task = skinny_task(name, dtype, shapes=tuple(map(tuple, shapes)) if shapes else None)
    assert why in skinny.supports(task)
    assert skinny.propose(task) == []


def test_takes_a_product_with_its_epilogue():
    """Linear + bias + GELU, and a residual added: the epilogue is the pointwise template's plan
    over the outputs, the fp32 sum given for the product, each output element stored once."""
    x, w, b, r = (_randn(s, bf16, "cpu", seed=k) for k, s in enumerate([(3, 64), (37, 64), (37,), (3, 37)]))
    (task,) = traced_row_tasks(Fn(lambda x, w, b, r: F.gelu(F.linear(x, w, b)) + r), [x, w, b, r], kind="matmul")
    plan = build_plan(task.on_device("cuda"))
    assert len(plan.epilogue.reads) == 3 and len(plan.outputs) == 1  # the bias, the residual, the product
    source = kernel_source(plan, "k", Launch(4, 1))
    assert "pw_erf(" in source[source.index("void pw_compute"):source.index("extern")]
    assert re.search(r"pw_compute\(.*, s, y0\);", source) or re.search(r"pw_compute\(s, .*y0\);", source)
    assert source.count("out0[") == 1


def test_refuses_an_epilogue_the_pointwise_template_cannot_take():
    (task,) = traced_row_tasks(Fn(lambda x, w: torch.atan2(F.linear(x, w), x[:, :1])),
                               [_randn((3, 64), bf16, "cpu"), _randn((37, 64), bf16, "cpu")], kind="matmul")
    assert "its epilogue: " in skinny.supports(task.on_device("cuda"))


@pytest.mark.parametrize("vectors, tiles", [(1, 1), (8, 1), (9, 2), (16, 2)])
def test_every_step_is_four_tensor_core_products_a_tile_of_vectors(vectors, tiles):
    """Per 64 elements of k a warp multiplies 16 matrix rows by each 8-wide tile of vectors in
    four m16n8k16 products; a step issues the next step's loads before its first product, and
    multiplies what the step before loaded."""
    plan = build_plan(skinny_task("linear_batch16", shapes=((vectors, 1000), (37, 1000))))
    source = kernel_source(plan, "k", Launch(4, 2))
    assert source.count("sk_mma(acc") == 4 * 2 * tiles
    assert source.count("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32") == 1
    body = source[source.index("for (int base"):]
    assert body.rindex("sk_stream(") < body.index("sk_mma(") and body.rindex("sk_vector(") < body.index("sk_mma(")
    assert body.index("lo0_0 = lo0_0_next;") > body.rindex("sk_mma(")
    assert f"__shared__ float part[4][{4 * tiles}][32];" in source


def test_fallback_reads_an_element_at_a_time_and_odd_k_needs_no_alignment(monkeypatch):
    task = skinny_task("linear_bias_batch5")
    plan = build_plan(task)
    w, x = _input(task, (37, 1000)), _input(task, (5, 1000))
    for launch in LAUNCHES:
        spec = launch_spec_of(model_source(plan, launch), monkeypatch)
        assert spec.inputs == task.inputs and spec.outputs == task.outputs
        main, fallback = spec.kernels
        name = f"skinny_{tag(launch)}"
        assert main.cubin == f"cubin of {kernel_source(plan, name, launch)}".encode()
        assert fallback.cubin == f"cubin of {kernel_source(plan, name, launch, vectors=False)}".encode()
        assert main.alignment[w] == main.alignment[x] == 16 and fallback.alignment == ()
        assert (main.grid, main.block, main.args) == ((3, 1, 1), (launch.threads, 1, 1),
                                                      tuple(map(Arg.input, range(3))) + (Arg.output(0),))
    assert "sk_stream(lo" not in kernel_source(plan, "k", LAUNCHES[0], vectors=False)
    odd = build_plan(skinny_task("linear_odd_k"))
    assert vector_loads(odd) == {"matrix": False, "vector": False}
    (kernel,) = launch_spec_of(model_source(odd, LAUNCHES[0]), monkeypatch).kernels
    assert kernel.alignment == (1, 1)


def test_most_vectors_by_dtype():
    assert (skinny.most_vectors(bf16), skinny.most_vectors(f16), skinny.most_vectors(f32)) == (16, 16, 0)


@pytest.mark.skipif(not (toolchain.find_nvrtc() or toolchain.find_nvcc()), reason="needs NVRTC or nvcc")
def test_every_kernel_compiles_for_sm_90():
    sources = set()
    for name in SKINNY_CASES:
        for dtype in (bf16, f16):
            for candidate in skinny.propose(skinny_task(name, dtype)):
                sources.update(re.findall(r"_SOURCE = r'''(.*?)'''", candidate.source, re.DOTALL))
    assert len(sources) >= 60
    for source in sources:
        assert nvrtc.compile_cubin(source, arch="sm_90")[:4] == b"\x7fELF"


def test_the_builtin_policy_offers_both_templates_where_each_takes_the_product():
    """At 2 vectors in bf16 the rows template (skills/rows/gemv.py) and this one compete; from 3
    only this one takes it; in fp32 only the rows template."""
    from agent_backend.policies.builtin import BuiltinPolicy

    def families(task):
        return {c.origin.split(":")[1] for c in BuiltinPolicy().propose(task, [])}

    assert families(skinny_task("linear_batch1", shapes=((2, 1000), (37, 1000)))) == {"rows", "skinny"}
    assert families(skinny_task("linear_bias_batch5")) == {"skinny"}
    assert families(skinny_task("linear_bias_batch5", f32)) == {"rows"}
    assert BuiltinPolicy().why_not(skinny_task("linear_batch16", shapes=((17, 64), (37, 64)))) is not None
