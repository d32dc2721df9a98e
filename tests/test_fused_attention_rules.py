"""Fused attention calls with a constant causal mask (GPT-2's and Llama's, built by transformers
from iota in every compiled graph) and keys/values repeated across heads (Llama's repeat_kv):
the partition writes the constant mask into the task, the rules read its value and drop it for
is_causal=True, and drop the repeat for enable_gqa=True. Through the real compile on the CPU."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch._inductor.utils import run_and_get_code

from agent_backend import backend
from agent_backend.partition import classify, is_constant
from helpers import collect_tasks, put_cached_entry
from skills import rewrites
from test_rewrites import assert_same_function, why_not

B, KV_HEADS, GROUP, SEQ, DIM = 2, 2, 3, 16, 8


def _mask(q, keep):
    """An additive mask as transformers writes it: built from positions, expanded over the batch."""
    return torch.where(keep, 0.0, -math.inf).to(q.dtype)[None, None].expand(q.shape[0], 1, -1, -1)


def _repeat(x):
    """Llama's repeat_kv: every key/value head repeated GROUP times in a row."""
    b, h, s, d = x.shape
    return x[:, :, None].expand(b, h, GROUP, s, d).reshape(b, h * GROUP, s, d)


class GroupedAttention(nn.Module):
    """Attention with its mask built in forward from positions (`window`: how many keys back a
    query sees, None for all), or taken as an input."""

    def __init__(self, window: int | None = None):
        super().__init__()
        self.window = window

    def forward(self, q, k, v, mask=None):
        if mask is None:
            pos = torch.arange(q.shape[-2], device=q.device)
            keep = pos[None, :] <= pos[:, None]
            if self.window is not None:
                keep = keep & (pos[:, None] - pos[None, :] < self.window)
            mask = _mask(q, keep)
        return F.scaled_dot_product_attention(q, _repeat(k), _repeat(v), attn_mask=mask, scale=0.3) * 2.0


def _inputs(dtype=torch.float32):
    torch.manual_seed(0)
    return [torch.randn(B, KV_HEADS * GROUP, SEQ, DIM, dtype=dtype),
            torch.randn(B, KV_HEADS, SEQ, DIM, dtype=dtype), torch.randn(B, KV_HEADS, SEQ, DIM, dtype=dtype)]


def _attention_task(model, inputs):
    with torch.no_grad():
        tasks = collect_tasks(model, inputs, backward=False, min_ops=2)
    (task,) = [t for t in tasks if t.kind == "fused_attention"]
    return task


def test_a_constant_causal_mask_and_repeated_heads_are_dropped():
    task = _attention_task(GroupedAttention(), _inputs())
    assert "iota" in task.program and "_scaled_dot_product_flash_attention_for_cpu" in task.program
    assert len(task.inputs) == 3  # q, k, v: the mask is computed in the task, not drawn at random
    assert why_not(task, "causal_mask") is None and why_not(task, "grouped_kv") is None
    candidates = {c.origin: c for c in rewrites.propose(task)}
    assert set(candidates) == {rewrites.ORIGIN + name for name in ("causal_mask+grouped_kv", "causal_mask",
                                                                   "grouped_kv")}
    both = candidates[rewrites.ORIGIN + "causal_mask+grouped_kv"].source.split("def forward")[1]
    assert "is_causal=True" in both and "enable_gqa=True" in both and "scale=0.3" in both
    assert "iota" not in both and "expand" not in both and "attn_mask" not in both
    for candidate in candidates.values():
        assert_same_function(task, candidate)


def test_a_boolean_mask_turned_into_cudnns_bias_counts_as_causal():
    """On the GPU torch hands cuDNN a boolean mask as a bias of 0 and -65504 (no -inf there)."""
    class CudnnBias(GroupedAttention):
        def forward(self, q, k, v):
            pos = torch.arange(q.shape[-2], device=q.device)
            bias = torch.where(pos[None, :] <= pos[:, None], 0.0, -65504.0).to(q.dtype)
            return F.scaled_dot_product_attention(q, _repeat(k), _repeat(v), attn_mask=bias, scale=0.3)

    task = _attention_task(CudnnBias(), _inputs())
    assert why_not(task, "causal_mask") is None


def test_a_mask_with_other_values_is_kept():
    class Alibi(GroupedAttention):
        def forward(self, q, k, v):
            pos = torch.arange(q.shape[-2], device=q.device)
            bias = torch.where(pos[None, :] <= pos[:, None], (pos[None, :] - pos[:, None]) * 0.5, -math.inf)
            return F.scaled_dot_product_attention(q, _repeat(k), _repeat(v), attn_mask=bias.to(q.dtype))

    task = _attention_task(Alibi(), _inputs())
    assert why_not(task, "causal_mask").startswith("the mask adds values other than 0 and -inf (e.g. -7.5, -7, -6.5")


def test_a_constant_mask_that_is_not_causal_is_kept():
    """A sliding window is a constant too, but not the causal pattern: it stays a mask."""
    task = _attention_task(GroupedAttention(window=4), _inputs())
    assert why_not(task, "causal_mask") == "the constant mask is not causal"
    (candidate,) = rewrites.propose(task)
    assert candidate.origin == rewrites.ORIGIN + "grouped_kv" and "attn_mask" in candidate.source
    assert_same_function(task, candidate)


def test_a_constant_mask_too_large_to_read_while_compiling_is_kept(monkeypatch):
    from skills.rewrites import fused_attention
    monkeypatch.setattr(fused_attention, "MAX_MASK_ELEMENTS", B * SEQ * SEQ - 1)
    task = _attention_task(GroupedAttention(), _inputs())
    assert why_not(task, "causal_mask") == f"the constant mask ({B * SEQ * SEQ} elements) is too large to read while " \
                                           f"compiling"


def test_a_mask_that_arrives_as_an_input_is_never_assumed_causal():
    q, k, v = _inputs()
    causal = _mask(q, torch.ones(SEQ, SEQ, dtype=torch.bool).tril())
    task = _attention_task(GroupedAttention(), [q, k, v, causal])
    assert len(task.inputs) == 4
    assert why_not(task, "causal_mask") == "the mask is computed from an input, not a constant"


def test_a_training_graphs_attention_is_left_to_inductor():
    """Its backward reads the call's log-sum-exp, which the rewritten call would not produce."""
    q, k, v = (t.requires_grad_() for t in _inputs())
    tasks = collect_tasks(GroupedAttention(), [q, k, v], backward=True, min_ops=1)
    assert not [t for t in tasks if t.kind == "fused_attention"]


def test_constants_are_no_groups_and_inputs_are_no_constants():
    from torch._inductor.decomposition import select_decomp_table
    from torch.fx.experimental.proxy_tensor import make_fx

    def fn(x):
        pos = torch.arange(4)
        return x + torch.where(pos[None, :] <= pos[:, None], 0.0, -1.0), torch.empty(4) + 1
    graph = make_fx(fn, decomposition_table=select_decomp_table(), tracing_mode="fake")(torch.randn(4, 4)).graph
    ops = {str(n.target): n for n in graph.nodes if n.op == "call_function"}
    assert is_constant(ops["aten.where.self"]) and classify(ops["aten.where.self"]).kind == "pointwise"
    assert not is_constant(ops["aten.add.Tensor"])  # reads x
    empty = next(n for name, n in ops.items() if "empty" in name)
    assert not is_constant(empty)  # uninitialised memory


@pytest.mark.slow
def test_llamas_attention_compiles_to_one_causal_call_without_its_mask(cache_dir):
    """A tiny Llama from transformers: the verified rewrite is inlined; the compiled code builds
    no mask and repeats no keys, and the model's output is unchanged."""
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(num_hidden_layers=1, hidden_size=24, num_attention_heads=6,
                                      num_key_value_heads=2, intermediate_size=32, vocab_size=64,
                                      max_position_embeddings=16, use_cache=False)
    torch.manual_seed(0)
    model = transformers.LlamaModel(config).eval()
    ids = torch.randint(0, 64, (2, 16))
    task = _attention_task(model, [ids])
    (best, *_) = rewrites.propose(task)
    put_cached_entry(task, source=best.source, origin=best.origin)
    torch._dynamo.reset()
    seen = len(backend.reports)
    with torch.no_grad():
        expected = model(ids).last_hidden_state
        compiled = torch.compile(model, backend="cuda_agent", options={"mode": "cached"})
        out, code = run_and_get_code(lambda x: compiled(x).last_hidden_state, ids)
    (decision,) = [d for r in backend.reports[seen:] for d in r.decisions if d.winner_key]
    assert decision.inlined and best.origin.endswith("causal_mask+grouped_kv")
    code = "\n".join(code)
    (call,) = [line for line in code.splitlines() if "= torch.ops.aten._scaled_dot_product" in line]
    assert "0.0, True, scale=" in call and "(2, 2, 16, 4)" in call  # is_causal; 2 key/value heads, not 6
    assert "cumsum" not in code  # the mask is not built
    torch.testing.assert_close(out, expected, atol=1e-4, rtol=1e-4)
