"""Rewrites on a GPU, through the real environment: each rule's candidate passes verification on
its tasks (traced by the real compile on CUDA) and is timed against Inductor; a deliberately lossy
rewrite of an fp32 task is refused by the float64 accuracy check; and the backend runs a rewrite
in place of its subgraph end to end, inlined as ATen ops. Speedups are printed, not asserted (benchmarks judge them)."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn as nn

from agent_backend import backend, explain, runtime
from agent_backend.specs import Candidate
from skills import rewrites
from test_env_cases import module_environment

pytestmark = pytest.mark.gpu

env = module_environment("cuda:0", compile_s=300, verify_s=300, profile_s=300, start_s=300)


class GemmSum(nn.Module):
    def forward(self, x, w):
        return (x @ w).sum(-1)


class LinearMean(nn.Module):
    def __init__(self, k: int, n: int):
        super().__init__()
        self.lin = nn.Linear(k, n)

    def forward(self, x):
        return self.lin(x).mean(-1, keepdim=True) * 0.5


class CausalAttention(nn.Module):
    def __init__(self, seq: int):
        super().__init__()
        self.register_buffer("bias", torch.tril(torch.ones(seq, seq)).view(1, 1, seq, seq))

    def forward(self, q, k, v):
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.bias == 0, float("-inf"))
        return torch.softmax(att, dim=-1) @ v


def _task(model, inputs, kind):
    with torch.no_grad():
        tasks = explain.tasks_of(explain.trace_tasks(model.cuda(), inputs, backward=False))
    (task,) = [t for t in tasks if t.kind == kind]
    return task


def _speedup(ev) -> str:
    p = ev.profile or {}
    return (f"ours {p.get('ours', {}).get('median', float('nan')):.4f} ms, Inductor "
            f"{(p.get('inductor') or {}).get('median', float('nan')):.4f} ms, "
            f"{p.get('speedup_vs_inductor') or float('nan'):.2f}x")


def _gemm_inputs(m, k, n, dtype):
    return [torch.randn(m, k, device="cuda", dtype=dtype), torch.randn(k, n, device="cuda", dtype=dtype) / k ** 0.5]


class Gpt2Mlp(nn.Module):
    """GPT-2's MLP up-projection: Conv1D (addmm on the flattened input) and the tanh-GELU."""
    def __init__(self, k: int, n: int, dtype):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(k, n, dtype=dtype) / k ** 0.5)
        self.bias = nn.Parameter(torch.randn(n, dtype=dtype))

    def forward(self, x):
        y = torch.addmm(self.bias, x.view(-1, x.size(-1)), self.weight).view(*x.shape[:-1], -1)
        return 0.5 * y * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (y + 0.044715 * torch.pow(y, 3.0))))


class LinearRelu(nn.Module):
    def __init__(self, k: int, n: int):
        super().__init__()
        self.lin = nn.Linear(k, n)

    def forward(self, x):
        return torch.relu(self.lin(x))


def _conv_bn_relu(dtype):
    model = nn.Sequential(nn.Conv2d(64, 128, 3, padding=1), nn.BatchNorm2d(128), nn.ReLU())
    return model.to(device="cuda", dtype=dtype).eval(), [torch.randn(32, 64, 56, 56, device="cuda", dtype=dtype)], "conv"


CASES = {
    "gemm-sum-fp32": lambda: (GemmSum(), _gemm_inputs(1024, 4096, 4096, torch.float32), "matmul"),
    "gemm-sum-bf16": lambda: (GemmSum(), _gemm_inputs(1024, 4096, 4096, torch.bfloat16), "matmul"),
    "linear-mean-fp32": lambda: (LinearMean(2048, 2048), [torch.randn(4096, 2048, device="cuda")], "matmul"),
    "gpt2-mlp-gelu-bf16": lambda: (Gpt2Mlp(768, 3072, torch.bfloat16), [torch.randn(8, 512, 768, device="cuda",
                                                                                   dtype=torch.bfloat16)], "matmul"),
    "linear-relu-fp32": lambda: (LinearRelu(1024, 4096), [torch.randn(4096, 1024, device="cuda")], "matmul"),
    "conv-bn-relu-fp32": lambda: _conv_bn_relu(torch.float32),
    "causal-attention-fp32": lambda: (CausalAttention(1024), [torch.randn(2, 8, 1024, 64, device="cuda")
                                                              for _ in range(3)], "attention"),
    "causal-attention-bf16": lambda: (CausalAttention(1024), [torch.randn(2, 8, 1024, 64, device="cuda",
                                                                          dtype=torch.bfloat16) for _ in range(3)],
                                      "attention"),
}


@pytest.mark.parametrize("name", CASES)
def test_rewrite_candidates_pass_the_real_verifier(env, name):
    model, inputs, kind = CASES[name]()
    task = _task(model, inputs, kind)
    candidates = rewrites.propose(task)
    assert candidates, rewrites.supports(task)
    for candidate in candidates:
        ev = env.evaluate(task, candidate)
        assert ev.status == "passed", f"{candidate.origin}: {ev.status}: {ev.reason}"
        v = ev.verification
        assert v["float64_err"] <= 2 * max(v["float64_ref_err"], torch.finfo(inputs[0].dtype).eps / 2)
        print(f"{name} {candidate.origin}: {_speedup(ev)}; error vs float64 {v['float64_err']:.3g} "
              f"(reference {v['float64_ref_err']:.3g})")


def test_batchnorm_folded_into_bf16_weights_is_refused(env):
    """Folded weights rounded to bf16 are further from the task than the reference's own rounding
    allows (the verifier's precision rule): the fold never reaches a user in bf16."""
    model, inputs, kind = _conv_bn_relu(torch.bfloat16)
    task = _task(model, inputs, kind)
    (candidate,) = [c for c in rewrites.propose(task) if c.origin.endswith("affine_fold")]
    ev = env.evaluate(task, candidate)
    assert ev.status == "incorrect", f"{ev.status}: {ev.reason}"
    print("refused:", ev.reason)


class PaddingMaskAttention(nn.Module):
    """BERT's attention: sdpa with a key padding mask, traced where torch took its math path."""

    def forward(self, q, k, v, keep):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=keep)


def test_torchs_math_path_of_attention_runs_as_one_fused_call(env):
    """What BERT's compiled graph holds on the GPU (bf16 cast up to float32, q and k scaled,
    a safe softmax) is verified as one fused call in bf16."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    q, k, v = (torch.randn(8, 12, 512, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    keep = torch.ones(8, 1, 1, 512, device="cuda", dtype=torch.bool)
    keep[:, :, :, -7:] = False
    with sdpa_kernel([SDPBackend.MATH]):
        task = _task(PaddingMaskAttention(), [q, k, v, keep], "attention")
    (candidate,) = rewrites.propose(task)
    ev = env.evaluate(task, candidate)
    assert ev.status == "passed", f"{ev.status}: {ev.reason}"
    v = ev.verification
    assert v["float64_err"] <= 2 * v["float64_ref_err"]
    print(f"math-path attention bf16: {_speedup(ev)}; error vs float64 {v['float64_err']:.3g} "
          f"(reference {v['float64_ref_err']:.3g})")


LOSSY = {
    # within the elementwise tolerance (1e-4) but ~100x less accurate than fp32 summation:
    # the summed weight keeps 15 of its 23 mantissa bits
    "truncated weight sum": ("less accurate than the reference", """
        ws = w.sum(-1)
        ws = (ws.view(torch.int32) & -256).view(torch.float32)
        return x @ ws"""),
    "bf16 GEMV": ("", """
        return (x.bfloat16() @ w.sum(-1).bfloat16()).float()"""),
}


@pytest.mark.parametrize("name", LOSSY)
def test_lossy_rewrite_of_an_fp32_task_is_refused(env, name):
    reason, body = LOSSY[name]
    task = _task(GemmSum(), _gemm_inputs(1024, 4096, 4096, torch.float32), "matmul")
    source = "import torch\nimport torch.nn as nn\n\nclass ModelNew(nn.Module):\n    def forward(self, x, w):" + body
    ev = env.evaluate(task, Candidate(source, f"test:{name}"), profile=False)
    assert ev.status != "passed" and reason in ev.reason, f"{ev.status}: {ev.reason}"
    print(f"{name}: {ev.status}: {ev.reason}")


def test_backend_runs_the_gemv_rewrite_in_place_of_the_gemm(cache_dir):
    torch.manual_seed(0)
    model, inputs = LinearMean(2048, 4096).cuda(), [torch.randn(4096, 2048, device="cuda")]
    with torch.no_grad():
        expected = model(*inputs)
        torch._dynamo.reset()
        got = torch.compile(model, backend="cuda_agent", options={"mode": "search", "search_budget_s": 300})(*inputs)
    torch.testing.assert_close(got, expected, atol=1e-4 * expected.abs().max().item(), rtol=1e-4)
    decisions = [d for d in backend.reports[-1].decisions if d.task is not None and d.task.kind == "matmul"]
    assert decisions and decisions[0].winner_key, [d.reason for d in decisions]
    winner = runtime.registered(decisions[0].winner_key)
    assert decisions[0].inlined and "mm" in winner.source  # in the graph as its ATen ops (inline.py)
    print("decision:", decisions[0].reason)


def test_backend_runs_the_math_path_attention_rewrite_inlined(cache_dir):
    """BERT's attention as its compiled graph holds it on the GPU, end to end: searched, kept in
    context, inlined as one fused attention call in bf16, with the padded keys masked."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    torch.manual_seed(0)
    q, k, v = (torch.randn(8, 12, 512, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    keep = torch.ones(8, 1, 1, 512, device="cuda", dtype=torch.bool)
    keep[:, :, :, -7:] = False
    model = PaddingMaskAttention()
    with torch.no_grad(), sdpa_kernel([SDPBackend.MATH]):
        expected = model(q, k, v, keep)
        torch._dynamo.reset()
        got = torch.compile(model, backend="cuda_agent", options={"mode": "search", "search_budget_s": 300})(
            q, k, v, keep)
    torch.testing.assert_close(got.float(), expected.float(), atol=2e-2, rtol=2e-2)
    (decision,) = [d for d in backend.reports[-1].decisions if d.task is not None and d.task.kind == "attention"]
    assert decision.winner_key and decision.inlined, decision.reason
    print("decision:", decision.reason)


def test_backend_drops_a_constant_causal_mask_and_repeated_heads_inlined(cache_dir):
    """Llama's attention as its compiled graph holds it on the GPU (a fused kernel with a causal
    mask built from positions, keys and values repeated across heads), end to end: searched, kept
    in context, inlined as one causal call."""
    from test_fused_attention_rules import GroupedAttention
    torch.manual_seed(0)
    q = torch.randn(8, 12, 512, 64, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(8, 4, 512, 64, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    model = GroupedAttention()
    with torch.no_grad():
        expected = model(q, k, v)
        torch._dynamo.reset()
        got = torch.compile(model, backend="cuda_agent", options={"mode": "search", "search_budget_s": 300})(q, k, v)
    torch.testing.assert_close(got.float(), expected.float(), atol=2e-2, rtol=2e-2)
    (decision,) = [d for d in backend.reports[-1].decisions if d.task is not None and d.task.kind == "fused_attention"]
    assert decision.winner_key and decision.inlined, decision.reason
    print("decision:", runtime.registered(decision.winner_key).origin, decision.reason)
