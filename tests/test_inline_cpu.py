"""A rewrite winner goes into the compiled graph as its ATen ops (agent_backend/inline.py), so
Inductor fuses and launches it like the rest: no call of our op, no Python per call. Only a
winner whose source our rules write again, byte for byte, from the subgraph is inlined."""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch._inductor.utils import run_and_get_code

from agent_backend import backend, runtime
from helpers import collect_tasks, put_cached_entry
from skills import rewrites


class GemmSum(nn.Module):
    def forward(self, x, w):
        return torch.relu((x @ w).sum(-1)) + 1.0


class PaddingMaskAttention(nn.Module):
    def forward(self, q, k, v, keep):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=keep) * 2.0


def _cached_rewrite(model, inputs, kind, *, edit=lambda source: source):
    (task,) = [t for t in collect_tasks(model, inputs, backward=False, min_ops=2) if t.kind == kind]
    (candidate, *_) = rewrites.propose(task)
    return put_cached_entry(task, source=edit(candidate.source), origin=candidate.origin), candidate


def _compile(model, inputs):
    torch._dynamo.reset()
    seen = len(backend.reports)
    with torch.no_grad():
        out, code = run_and_get_code(torch.compile(model, backend="cuda_agent", options={"mode": "cached"}), *inputs)
    return out, "\n".join(code), [d for r in backend.reports[seen:] for d in r.decisions if d.winner_key]


def test_a_rewrite_winner_is_compiled_by_inductor_as_its_aten_ops(cache_dir):
    torch.manual_seed(0)
    model, inputs = GemmSum(), [torch.randn(64, 32), torch.randn(32, 48)]
    key, _ = _cached_rewrite(model, inputs, "matmul")
    out, code, (decision,) = _compile(model, inputs)
    torch.testing.assert_close(out, model(*inputs), atol=1e-4, rtol=1e-4)
    assert "run_winner" not in code and "cuda_agent.launch" not in code
    assert decision.winner_key == key and decision.inlined and "inlined as ATen ops" in decision.reason
    assert runtime.registered(key).calls == 0


def test_a_winner_whose_source_our_rules_do_not_write_runs_as_a_call(cache_dir):
    """A cached source that differs from what the rules write now (an older rule, or an edit)
    was verified as that source: it runs as it is, through run_winner."""
    torch.manual_seed(0)
    model, inputs = GemmSum(), [torch.randn(64, 32), torch.randn(32, 48)]
    key, _ = _cached_rewrite(model, inputs, "matmul", edit=lambda source: source + "        # edited\n")
    runtime.forget(key)  # the test before registered this key's winner with the rules' own source
    out, code, (decision,) = _compile(model, inputs)
    torch.testing.assert_close(out, model(*inputs), atol=1e-4, rtol=1e-4)
    assert "cuda_agent.run_winner" in code and not decision.inlined and "inlined" not in decision.reason
    assert runtime.registered(key).calls >= 1


def test_torchs_math_path_of_attention_compiles_to_one_attention_call(cache_dir):
    """BERT's attention as the GPU graph holds it (torch's math path, bf16 cast up): inlined,
    Inductor calls the fused attention op and no batched matmul; padded query rows stay zero."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, 16, 8, dtype=torch.bfloat16) for _ in range(3))
    keep = torch.ones(2, 1, 16, 1, dtype=torch.bool)
    keep[0, :, :3] = False
    model, inputs = PaddingMaskAttention(), [q, k, v, keep]
    with sdpa_kernel([SDPBackend.MATH]):
        key, _ = _cached_rewrite(model, inputs, "attention")
        out, code, (decision,) = _compile(model, inputs)
        expected = model(*inputs)
    assert "inlined as ATen ops" in decision.reason and "run_winner" not in code
    assert "scaled_dot_product" in code and "bmm" not in code
    torch.testing.assert_close(out, expected, atol=2e-2, rtol=2e-2)
    assert bool((out[0, :, :3] == 0).all())


@pytest.mark.parametrize("origin", ["builtin:pointwise:x", "builtin:rewrite:no_such_rule", "llm"])
def test_only_rewrites_are_inlined(origin):
    from agent_backend import inline
    (task,) = [t for t in collect_tasks(GemmSum(), [torch.randn(8, 4), torch.randn(4, 6)], backward=False)
               if t.kind == "matmul"]
    (candidate,) = rewrites.propose(task)
    runtime.register(runtime.Winner("k-" + origin, candidate.source, (), origin))
    assert inline.aten_graph("k-" + origin, task) is None


def test_a_rewrite_that_cannot_be_inlined_runs_through_its_op(cache_dir, monkeypatch, caplog):
    from agent_backend import inline

    def fail(sub, values):
        raise RuntimeError("no decomposition for this op")
    monkeypatch.setattr(inline, "_post_grad", fail)
    torch.manual_seed(0)
    model, inputs = GemmSum(), [torch.randn(64, 24), torch.randn(24, 40)]
    key, _ = _cached_rewrite(model, inputs, "matmul")
    with caplog.at_level("WARNING", logger="cuda_agent"):
        out, code, (decision,) = _compile(model, inputs)
    torch.testing.assert_close(out, model(*inputs), atol=1e-4, rtol=1e-4)
    assert not decision.inlined and "cuda_agent.run_winner" in code and runtime.registered(key).calls >= 1
    assert any("could not inline kernel" in r.message for r in caplog.records)
