"""The pointwise template on the CPU: what it claims, the layouts it chooses, and that the CUDA
and Python it writes compile. Whether the kernels compute the right numbers is
test_pointwise_gpu.py's job (it reuses CASES and make_task from here)."""
from __future__ import annotations

import re
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

from agent_backend.env.launch_spec import Arg
from agent_backend.specs import Task, TensorSpec, dtype_name
from helpers import launch_spec_of
from skills.pointwise import propose, supports
from skills.pointwise.candidates import SEARCH_SPACE, TILED_SEARCH_SPACE, grid_blocks, launch_configs, model_source
from skills.pointwise.codegen import kernel_source, tiled_kernel_source
from skills.pointwise.dtypes import literal
from skills.pointwise.layout import broadcast_strides, coalesce, is_dense, vector_width
from skills.pointwise.ops import OP_RULES
from skills.pointwise.plan import build_plan

aten = torch.ops.aten
f16, bf16, f64 = torch.float16, torch.bfloat16, torch.float64


def make_task(fn, inputs: list[torch.Tensor]) -> Task:
    """A Task whose graph is `fn` traced to ATen ops, with signatures on CUDA (the specs are data:
    the example tensors may live anywhere)."""
    gm = make_fx(fn)(*inputs)
    gm.graph.eliminate_dead_code()
    gm.recompile()
    outputs = fn(*inputs)
    outputs = outputs if isinstance(outputs, tuple) else (outputs,)

    def spec(t: torch.Tensor) -> TensorSpec:
        return TensorSpec(tuple(t.shape), tuple(t.stride()), dtype_name(t.dtype), "cuda")

    ops = tuple(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
    return Task("test", "", tuple(map(spec, inputs)), tuple(map(spec, outputs)), ops, "pointwise", gm)


def _randn(*shape, dtype=torch.float32, device="cpu", seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=torch.float64).to(dtype).to(device)


def _with_specials(t: torch.Tensor, *extra: float) -> torch.Tensor:
    """`t` with NaN, ±inf, ±0, values at clamp/relu edges and `extra` planted at the front."""
    specials = torch.tensor([float("nan"), float("inf"), -float("inf"), 0.0, -0.0, 1.0, -1.0, 3.0, -3.0, *extra])
    flat = t.clone().reshape(-1)
    flat[: len(specials)] = specials.to(t.dtype)
    return flat.reshape(t.shape)


# Magnitudes where exp overflows or underflows in fp16/bf16/fp32, or sigmoid/silu saturate.
LARGE = (11.0, -11.0, 17.0, -17.0, 20.0, -20.0, 88.0, -88.0, 100.0, -100.0, 1e4, -1e4)


def _exp_chain(x, y):
    """exp-based ops, tanh and divisions, each result in x's dtype (the fast forms for fp16/bf16)."""
    return (x * torch.sigmoid(x) + y, F.silu(x), torch.exp(x), torch.tanh(x), torch.sigmoid(x), x / y,
            torch.reciprocal(x), torch.sigmoid(x.float()).to(x.dtype))


def _transposed(*shape, dtype=torch.float32, device="cpu", seed=0):
    """A (…, shape[-1], shape[-2]) tensor seen through its last two dims swapped: shape `shape`."""
    return _randn(*shape[:-2], shape[-1], shape[-2], dtype=dtype, device=device, seed=seed).transpose(-1, -2)


# name -> (fn, inputs(device)). Each covers ops, dtypes and layouts the GPU test checks numerically.
CASES = {
    "bias_gelu_fp32_odd": (
        lambda x, b: F.gelu(x + b),
        lambda d: [_randn(33, 70, device=d), _randn(70, device=d, seed=1)]),
    "scale_shift_relu_fp16_tail": (
        lambda x: torch.relu(x * 0.5 + 1.0),
        lambda d: [_randn(4099, dtype=f16, device=d)]),
    "row_scale_silu_bf16": (
        lambda x, s: F.silu(x) * s,
        lambda d: [_randn(64, 96, dtype=bf16, device=d), _randn(64, 1, dtype=bf16, device=d, seed=1)]),
    "transposed_input_fp32": (
        lambda x, y: torch.tanh(x) - y * 2,
        lambda d: [_randn(70, 33, device=d).t(), _randn(33, 70, device=d, seed=1)]),
    "expanded_input_and_channels_last_fp16": (
        lambda x, b, e: torch.relu(x + b) * e,
        lambda d: [_randn(2, 8, 5, 7, dtype=f16, device=d).to(memory_format=torch.channels_last),
                   _randn(8, 1, 1, dtype=f16, device=d, seed=1),
                   _randn(7, dtype=f16, device=d, seed=2).expand(2, 8, 5, 7)]),
    "multi_output_with_bool_fp32": (
        lambda x, y: (torch.sigmoid(x), torch.tanh(x) * y, x > y),
        lambda d: [_randn(128, 64, device=d), _randn(128, 64, device=d, seed=1)]),
    "activations_fp32": (
        lambda x: (F.mish(x), F.softplus(x), F.softplus(x, beta=2.0, threshold=1.5), F.hardsigmoid(x),
                   F.hardswish(x), F.leaky_relu(x, 0.2), F.hardtanh(x, -0.5, 0.7), F.elu(x, 1.3),
                   F.selu(x), aten.elu(x, 0.7, 1.0, 1 / 0.7), F.gelu(x, approximate="tanh"), F.relu(x)),
        lambda d: [_with_specials(_randn(31, 67, device=d) * 4)]),
    "math_fp32": (
        lambda x: (-x, x.abs(), torch.exp(x), torch.expm1(x), torch.log(x.abs()), torch.log1p(x.abs()),
                   torch.log2(x.abs()), torch.sqrt(x.abs()), torch.rsqrt(x.abs()), torch.reciprocal(x),
                   torch.erf(x), torch.sin(x), torch.cos(x), torch.sign(x), torch.floor(x * 3),
                   torch.ceil(x * 3), torch.trunc(x * 3), torch.round(x * 3)),
        lambda d: [_with_specials(_randn(1000, device=d) * 2)]),
    "binary_fp32": (
        lambda x, y: (torch.add(x, y, alpha=0.5), torch.sub(x, y, alpha=2), 1.5 - x, x / y, x / 3.0,
                      torch.div(x, y, rounding_mode="floor"), torch.div(x, y, rounding_mode="trunc"),
                      torch.div(x * 7, 2.0, rounding_mode="floor"),
                      torch.maximum(x, y), torch.minimum(x, y), torch.pow(x.abs() + 0.5, y), torch.pow(2.0, x - y),
                      x ** 2, x ** 3, x.abs() ** 0.5, (x.abs() + 0.1) ** -0.5, x ** -1, x ** -2, x ** 0,
                      x ** 1, x.abs() ** 2.5, x ** 4),
        lambda d: [_with_specials(_randn(40, 50, device=d) * 3), _randn(50, device=d, seed=1)]),
    "clamp_where_compare_fp32": (
        lambda x, lo, hi, c: (torch.clamp(x, -1, 1), torch.clamp_min(x, 0.25), torch.clamp_max(x, -0.25),
                              torch.clamp(x, min=lo, max=hi), torch.clamp_min(x, lo), torch.clamp_max(x, hi),
                              torch.where(c, x, 0.0), torch.where(x > lo, x, hi * 2),
                              x < lo, x <= 0.5, x > hi, x >= 0, torch.round(x) == torch.round(lo), x != 0,
                              torch.logical_and(x > 0, c), torch.logical_or(x, lo), torch.logical_not(c),
                              torch.logical_xor(c, x < 0)),
        lambda d: [_with_specials(_randn(16, 65, device=d) * 2), _randn(65, device=d, seed=1) - 1,
                   _randn(16, 1, device=d, seed=2) + 1, _randn(16, 65, device=d, seed=3) > 0]),
    "conversions_mixed": (
        lambda x, y: (torch.exp(x.to(f16)).to(bf16), x.half().float() + torch.ops.prims.convert_element_type(y, f64),
                      (x > 0).float() * y.to(torch.float32), x.to(torch.bool)),
        lambda d: [_randn(3, 257, device=d), _randn(3, 257, dtype=bf16, device=d, seed=1)]),
    "fp64_math": (
        lambda x, y: torch.exp(x) * torch.log1p(y.abs()) + torch.erf(x) - torch.sin(y) / torch.cos(x),
        lambda d: [_randn(300, 7, dtype=f64, device=d), _randn(300, 7, dtype=f64, device=d, seed=1)]),
    "zero_dim_scalar_and_full_fp16": (
        lambda x, s: x * s + torch.full((), 0.1, dtype=f16, device=x.device),
        lambda d: [_randn(1000, dtype=f16, device=d), torch.tensor(1.0001, device=d)]),
    "bf16_chain_mask_input": (
        lambda x, m: torch.where(m, torch.sigmoid(x) * 1.7, -x).clamp(-1.5, 1.5),
        lambda d: [_randn(5, 333, dtype=bf16, device=d), _randn(5, 333, device=d, seed=1) > 0]),
    "exp_chain_fp16": (
        _exp_chain,
        lambda d: [_with_specials(_randn(64, 128, dtype=f16, device=d) * 4, *LARGE[:-2]),
                   _randn(128, dtype=f16, device=d, seed=1)]),
    "exp_chain_bf16": (
        _exp_chain,
        lambda d: [_with_specials(_randn(64, 129, dtype=bf16, device=d) * 4, *LARGE),
                   _randn(129, dtype=bf16, device=d, seed=1)]),
    # transposed operands: the tiled candidates (t32...) take these
    "transposed_tile_multiple_fp32": (
        lambda x, y: torch.sigmoid(x + y) * 3,
        lambda d: [_transposed(128, 64, device=d), _randn(128, 64, device=d, seed=1)]),
    "transposed_odd_fp16": (
        lambda x, y: torch.sigmoid(x + y) * 3,
        lambda d: [_transposed(1000, 777, dtype=f16, device=d), _randn(1000, 777, dtype=f16, device=d, seed=1)]),
    "transposed_small_odd_fp32": (
        lambda y, x: F.silu(y) - x,
        lambda d: [_randn(33, 65, device=d, seed=1), _transposed(33, 65, device=d)]),
    "two_transposed_bf16": (  # the contiguous z comes first, so the output is laid out as z
        lambda z, x, y: z + x * y,
        lambda d: [_randn(70, 45, dtype=bf16, device=d), _transposed(70, 45, dtype=bf16, device=d, seed=1),
                   _transposed(70, 45, dtype=bf16, device=d, seed=2)]),
    "transposed_with_bias_fp16": (
        lambda y, x, b: y + x * b,
        lambda d: [_randn(96, 200, dtype=f16, device=d), _transposed(96, 200, dtype=f16, device=d, seed=1),
                   _randn(200, dtype=f16, device=d, seed=2)]),
    "batch_transposed_fp32": (  # the second output is laid out as x: written through the tile too
        lambda y, x: (y * torch.sigmoid(x), x * 2),
        lambda d: [_randn(3, 33, 65, device=d, seed=1), _transposed(3, 33, 65, device=d)]),
    "transposed_mask_and_bf16_into_fp64": (  # staged tiles of bool and bf16
        lambda y, m, z: torch.where(m, y, z * 2),
        lambda d: [_randn(40, 70, dtype=f64, device=d), _transposed(40, 70, device=d, seed=1) > 0,
                   _transposed(40, 70, dtype=bf16, device=d, seed=2)]),
}
# The cases with an operand contiguous along the outer of the two innermost iteration dims.
TRANSPOSED = {"transposed_input_fp32", "transposed_tile_multiple_fp32", "transposed_odd_fp16",
              "transposed_small_odd_fp32", "two_transposed_bf16", "transposed_with_bias_fp16", "batch_transposed_fp32",
              "transposed_mask_and_bf16_into_fp64"}


@pytest.mark.parametrize("name", CASES)
def test_cases_are_supported_with_several_launch_configs(name):
    fn, inputs = CASES[name]
    task = make_task(fn, inputs("cpu"))
    assert supports(task) is None
    candidates = propose(task)
    assert 1 <= len(candidates) <= len(SEARCH_SPACE) + len(TILED_SEARCH_SPACE) <= 10
    assert len({c.origin for c in candidates}) == len(candidates)
    linear = [c for c in candidates if "block" in c.params]
    assert all(c.origin.startswith("builtin:pointwise:b") and c.params["block"] in (128, 256, 512) for c in linear)
    tiled = [c.origin for c in candidates if c not in linear]
    assert tiled == (["builtin:pointwise:t32r8", "builtin:pointwise:t32r4"] if name in TRANSPOSED else [])


def test_no_tiled_candidates_past_the_static_shared_memory_limit():
    def tiled(staged: int) -> bool:
        inputs = [_randn(40, 70, dtype=f64)] + [_transposed(40, 70, dtype=f64, seed=k) for k in range(staged)]
        return any("tile" in c.params for c in propose(make_task(lambda *xs: sum(xs), inputs)))
    assert tiled(5) and not tiled(6)  # 6 fp64 tiles of 32 x 33 take over 48 KB


def _compute_function_of(name: str) -> str:
    fn, inputs = CASES[name]
    source = kernel_source(build_plan(make_task(fn, inputs("cpu"))), "k", 256, 1, 1)
    return source[source.index("void pw_compute("):source.index("extern")]


def test_fast_math_only_where_results_are_fp16_or_bf16():
    for name in ("exp_chain_fp16", "exp_chain_bf16"):
        compute = _compute_function_of(name)
        for fast in ("pw_sigmoid_fast(", "pw_silu_fast(", "pw_exp_fast(", "pw_div_fast("):
            assert fast in compute, (name, fast)
        assert "pw_tanh(" in compute and " / " not in compute
        assert compute.count("pw_sigmoid(") == 1  # computed in fp32, then converted: precise
    for name in ("multi_output_with_bool_fp32", "binary_fp32", "fp64_math", "transposed_small_odd_fp32"):
        assert "_fast(" not in _compute_function_of(name)


def test_fp16_bf16_results_stay_in_fp32_until_a_step_a_narrowing_or_a_store():
    """As Inductor computes a fused bf16 chain: no rounding between arithmetic ops, nor before a
    widening conversion; rounded before a floor, a compare and a narrowing conversion, as eager
    sees them; a store rounds once (a narrowing conversion's output stores its operand)."""
    x, y = torch.randn(8, dtype=bf16), torch.randn(8, dtype=bf16)
    fn = lambda x, y: (torch.floor(x * 3) + (x * y > 1), (x * y).float() + 1,  # noqa: E731
                       (x * y).to(f16), torch.sigmoid(x) * y, ((x * y).float() + 1).to(bf16),
                       (x * y).to(bf16, copy=True) + 1)
    plan = build_plan(make_task(fn, [x, y]))
    body = dict(line.removeprefix("const ").removesuffix(";").split(" = ") for line in plan.body)
    assert body["float v0"] == "(x0 * 3.0f)" and body["float v1"] == "round_bf16(pw_floor(round_bf16(v0)))"
    assert body["bool v3"] == "(round_bf16(v2) > 1.0f)"
    assert (body["float v5"], body["float v6"], body["float v7"]) == ("(x0 * x1)", "v5", "(v6 + 1.0f)")
    assert body["float v9"] == "round_f16(round_bf16(v8))"
    assert (body["float v10"], body["float v11"]) == ("pw_sigmoid_fast(x0)", "(v10 * x1)")
    assert plan.results == ("v4", "v7", "round_bf16(v8)", "v11", "v14", "v18")
    assert body["float v15"] == "round_bf16(v14)"  # computed for no one: the compiler drops it
    assert (body["float v17"], body["float v18"]) == ("v16", "(v17 + 1.0f)")  # a copy to its own dtype


def test_op_table_covers_the_issue_list():
    required = [
        aten.add.Tensor, aten.sub.Tensor, aten.mul.Tensor, aten.div.Tensor, aten.div.Tensor_mode, aten.neg.default,
        aten.abs.default, aten.relu.default, aten.sigmoid.default, aten.tanh.default, aten.exp.default,
        aten.expm1.default, aten.log.default, aten.log1p.default, aten.sqrt.default, aten.rsqrt.default,
        aten.reciprocal.default, aten.pow.Tensor_Scalar, aten.pow.Tensor_Tensor, aten.maximum.default,
        aten.minimum.default, aten.clamp.default, aten.clamp_min.default, aten.clamp_max.default, aten.where.self,
        aten.gelu.default, aten.silu.default, aten.leaky_relu.default, aten.hardtanh.default, aten.elu.default,
        aten.erf.default, aten.sin.default, aten.cos.default, aten.sign.default, aten.logical_not.default,
        aten.logical_and.default, aten.logical_or.default, torch.ops.prims.convert_element_type.default,
        aten._to_copy.default, aten.mish.default, aten.softplus.default, aten.hardsigmoid.default,
        aten.hardswish.default,
    ] + [getattr(getattr(aten, c), o) for c in ("lt", "le", "gt", "ge", "eq", "ne") for o in ("Tensor", "Scalar")]
    assert [op for op in required if op not in OP_RULES] == []


@pytest.mark.parametrize("fn, inputs, reason", [
    (lambda x, y: torch.atan2(x, y), [torch.randn(4), torch.randn(4)], "op aten.atan2.default not supported"),
    (lambda x: x.t() + 1, [torch.randn(3, 4)], "op aten.t.default not supported"),
    (lambda x: x.sum(), [torch.randn(3, 4)], "op aten.sum.default not supported"),
    (lambda x: x.to(torch.int32).to(torch.float32), [torch.randn(4)], "dtype torch.int32 not supported"),
    (lambda x, y: (x + 1, y + 1), [torch.randn(3, 4), torch.randn(4)], "outputs differ in shape"),
    (lambda x: x + 1, [torch.randn(0, 3)], "outputs are empty"),
])
def test_unsupported_tasks_say_why(fn, inputs, reason):
    task = make_task(fn, inputs)
    assert reason in supports(task)
    assert propose(task) == []


def test_cpu_tasks_are_not_taken():
    task = make_task(lambda x: x + 1, [torch.randn(4)])
    cpu = Task(task.hash, task.program, tuple(TensorSpec(s.shape, s.stride, s.dtype, "cpu") for s in task.inputs),
               task.outputs, task.ops, task.kind, task.graph_module)
    assert "CUDA" in supports(cpu)


def test_plan_needs_no_node_metadata():
    fn, inputs = CASES["multi_output_with_bool_fp32"]
    task = make_task(fn, inputs("cpu"))
    expected = build_plan(task)
    for node in task.graph_module.graph.nodes:
        node.meta.clear()
    assert build_plan(task) == expected


def test_layout_helpers():
    assert broadcast_strides((70,), (1,), (33, 70)) == (0, 1)
    assert broadcast_strides((33, 1), (1, 1), (33, 70)) == (1, 0)
    with pytest.raises(Exception, match="does not broadcast"):
        broadcast_strides((3,), (1,), (4, 5))
    # contiguous operands merge into one dim; a bias keeps rows apart
    assert coalesce((4, 5, 6), [(30, 6, 1), (30, 6, 1)]) == ((120,), [(1,), (1,)])
    assert coalesce((4, 1, 6), [(6, 6, 1), (0, 0, 1)]) == ((4, 6), [(6, 1), (0, 1)])
    assert coalesce((1, 1), [(1, 1)]) == ((1,), [(1,)])
    assert is_dense((2, 3, 4), (12, 1, 3)) and not is_dense((2, 3), (1, 1))


@pytest.mark.parametrize("sizes, inputs, outputs, width", [
    ((1001,), [((1,), 2)], [((1,), 2)], 8),                     # fp16 1-D: 8-wide, scalar tail
    ((6,), [((1,), 2)], [((1,), 2)], 4),                        # no wider than the tensor
    ((64, 96), [((96, 1), 2), ((1, 0), 2)], [((96, 1), 2)], 8),  # per-row scale: one element per vector
    ((33, 70), [((70, 1), 4), ((0, 1), 4)], [((70, 1), 4)], 2),  # 70 columns: only pairs divide
    ((33, 70), [((1, 33), 4)], [((70, 1), 4)], 1),             # transposed input: scalar
    ((300, 7), [((7, 1), 8)], [((7, 1), 8)], 1),               # fp64, 7 columns
    ((1,), [((1,), 4)], [((1,), 4)], 1),                       # one element
])
def test_vector_width(sizes, inputs, outputs, width):
    assert vector_width(sizes, inputs, outputs) == width


def test_plans_choose_the_expected_layouts():
    plans = {name: build_plan(make_task(fn, inputs("cpu"))) for name, (fn, inputs) in CASES.items()}
    tail = plans["scale_shift_relu_fp16_tail"]
    assert tail.sizes == (4099,) and tail.vector_width == 8
    assert plans["transposed_input_fp32"].vector_width == 1
    assert plans["batch_transposed_fp32"].sizes == (3, 33, 65)
    assert [op.strides for op in plans["batch_transposed_fp32"].outputs] == [(2145, 65, 1), (2145, 1, 33)]
    # channels-last, iterated in memory order (n, h, w, c): c is innermost; the input expanded
    # along w keeps (n, h) and w apart
    channels_last = plans["expanded_input_and_channels_last_fp16"]
    assert channels_last.sizes == (10, 7, 8) and channels_last.vector_width == 8
    assert [op.strides for op in channels_last.inputs] == [(56, 8, 1), (0, 0, 1), (0, 1, 0)]
    assert plans["multi_output_with_bool_fp32"].sizes == (8192,)
    assert all(not p.wide_index for p in plans.values())


def test_launch_configs_shrink_for_small_tasks():
    assert launch_configs(10) == [SEARCH_SPACE[0]]
    big = launch_configs(2**25)
    assert big == list(SEARCH_SPACE) and 6 <= len(big) <= 9
    # below its cap a waves config launches like the plain grid of its shape: b256u1w8 goes
    # (b256u1 is there), b512u2w4 stays (no b512u2)
    assert [c.tag(8) for c in launch_configs(2**16) if c.waves] == ["b512u2v8w4"]


def test_literals():
    assert literal(0.1, "float") == "0.10000000149011612f"
    assert literal(0.1, "double") == "0.1"
    assert literal(float("inf"), "float") == "__uint_as_float(0x7f800000u)"
    assert literal(-float("inf"), "double") == "(-__longlong_as_double(0x7ff0000000000000LL))"
    assert literal(float("nan"), "float") == "__uint_as_float(0x7fc00000u)"
    assert literal(1e300, "float") == "__uint_as_float(0x7f800000u)"
    assert literal(2, "bool") == "true"


def _nvcc() -> str | None:
    return shutil.which("nvcc") or next((str(p) for p in sorted(Path("/usr/local").glob("cuda*/bin/nvcc"))), None)


def _kernel_sources() -> dict[str, str]:
    """Main and fallback kernels over the cases, the tiled kernels of the transposed ones, every
    kernel that three cases' candidate programs carry, plus 64-bit indexing and a one-element kernel."""
    sources = {}
    for name in ("bias_gelu_fp32_odd", "scale_shift_relu_fp16_tail", "expanded_input_and_channels_last_fp16",
                 "multi_output_with_bool_fp32", "activations_fp32", "binary_fp32", "clamp_where_compare_fp32",
                 "conversions_mixed", "fp64_math", "bf16_chain_mask_input", "exp_chain_bf16", *sorted(TRANSPOSED)):
        fn, inputs = CASES[name]
        plan = build_plan(make_task(fn, inputs("cpu")))
        sources[name] = kernel_source(plan, "k", 256, 2, plan.vector_width)
        if name in TRANSPOSED:
            sources[f"{name}_tiled"] = tiled_kernel_source(plan, "k", TILED_SEARCH_SPACE[0].rows)
    for name in ("exp_chain_fp16", "transposed_odd_fp16", "batch_transposed_fp32"):
        fn, inputs = CASES[name]
        for candidate in propose(make_task(fn, inputs("cpu"))):
            for k, kernel in enumerate(re.findall(r"_SOURCE = r'''(.*?)'''", candidate.source, re.DOTALL)):
                sources[f"{name}_{candidate.origin.rsplit(':', 1)[1]}_{k}"] = kernel
    plan = build_plan(make_task(*[CASES["zero_dim_scalar_and_full_fp16"][0],
                                  CASES["zero_dim_scalar_and_full_fp16"][1]("cpu")]))
    sources["fallback_fp16"] = kernel_source(plan, "k", 128, 4, 1)
    # The graph is shape-agnostic, so a tiny trace can stand for a 2**31-element signature.
    task = make_task(lambda x: torch.sigmoid(x) * 2, [torch.randn(8, dtype=f16)])
    huge = TensorSpec((2**31 + 3,), (1,), "float16", "cuda")
    plan = build_plan(Task("huge", "", (huge,), (huge,), task.ops, "pointwise", task.graph_module))
    assert plan.wide_index
    sources["wide_index"] = kernel_source(plan, "k", 512, 1, plan.vector_width)
    plan = build_plan(make_task(lambda x, y: torch.maximum(x, y) + 1, [torch.tensor(1.0), torch.tensor(2.0)]))
    sources["one_element"] = kernel_source(plan, "k", 128, 1, plan.vector_width)
    return sources


@pytest.mark.skipif(_nvcc() is None, reason="needs nvcc")
def test_generated_cuda_compiles_cleanly(tmp_path):
    def compile_one(job):
        name, source, arch = job
        path = tmp_path / f"{name}.cu"
        path.write_text(source)
        command = [_nvcc(), "-cubin", f"-arch={arch}", "-o", str(path.with_suffix(".cubin")), str(path)]
        return name, subprocess.run(command, capture_output=True, text=True)

    sources = _kernel_sources()
    jobs = [(name, source, "sm_90") for name, source in sources.items()]
    jobs.append(("bf16_pre_ampere", sources["bf16_chain_mask_input"], "sm_75"))  # bf16 rounding by hand
    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(compile_one, jobs))
    problems = {name: r.stderr for name, r in results if r.returncode or r.stderr.strip()}
    assert problems == {}


@pytest.mark.parametrize("name, config", [
    ("scale_shift_relu_fp16_tail", SEARCH_SPACE[0]), ("scale_shift_relu_fp16_tail", SEARCH_SPACE[-1]),
    ("multi_output_with_bool_fp32", SEARCH_SPACE[3]), ("transposed_input_fp32", TILED_SEARCH_SPACE[0])])
def test_model_source_is_a_launch_spec_of_the_planned_kernels(name, config, monkeypatch):
    """The spec launches what the plan and the config say: the kernel codegen writes (with a
    scalar fallback for unaligned inputs where it reads vectors), the grid grid_blocks gives,
    inputs then outputs as arguments, on tensors of exactly the task's signature."""
    fn, inputs = CASES[name]
    task = make_task(fn, inputs("cpu"))
    plan = build_plan(task)
    spec = launch_spec_of(model_source(plan, config), monkeypatch)
    assert spec.inputs == task.inputs and spec.outputs == task.outputs
    width = config.vector_width(plan)
    kernel_name = f"pointwise_{config.tag(width)}"
    args = tuple(map(Arg.input, range(len(task.inputs)))) + tuple(map(Arg.output, range(len(task.outputs))))
    expected = [(width, config.kernel(plan, kernel_name, width))]
    if width > 1:
        expected.append((1, config.kernel(plan, kernel_name, 1)))
    assert len(spec.kernels) == len(expected)
    for kernel, (kernel_width, source) in zip(spec.kernels, expected):
        blocks = grid_blocks(config.groups(plan, kernel_width), config.groups_per_block,
                             config.threads[0] * config.threads[1], config.waves, 132)
        assert (kernel.cubin, kernel.name, kernel.arch) == (f"cubin of {source}".encode(), kernel_name, "sm_90")
        assert (kernel.grid, kernel.block, kernel.args, kernel.shared_mem) == ((blocks, 1, 1), config.threads, args, 0)
        assert all(a == 1 for a in kernel.alignment) == (kernel_width == 1)
