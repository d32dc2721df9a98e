"""The in-process engines of the `llm` policy on the CPU, with tiny models built here (nothing is
downloaded): the transformers engine through the real search and worker, the vLLM engine's
error where vLLM is not installed."""
import dataclasses
import importlib.util
import os
import sys
import types

import pytest
import torch

from agent_backend.options import OptionError, resolve
from agent_backend.policies import PolicyError, make_policy, prompts
from agent_backend.policies.chat import make_chat
from agent_backend.policies.chat_transformers import TransformersChat, _load
from agent_backend.search import search_task
from test_env_cases import add_relu_task, module_environment
from tiny_models import make_model, make_tokenizer, save, teach

TASK = add_relu_task()
env = module_environment("cpu", compile_s=120, verify_s=60, profile_s=180, start_s=120)

RIGHT = '''```python
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, a, b):
        return torch.clamp_min(a + b, 0.0)
```'''
# Code-like words for a random model to string together; joined by spaces they never make a
# fenced block (that needs a newline after the fence).
WORDS = "``` ```python import torch class ModelNew(nn.Module): def forward(self, a, b): return a + b".split()


@pytest.fixture(scope="module")
def random_model(tmp_path_factory):
    tokenizer = make_tokenizer(WORDS)
    return save(make_model(tokenizer), tokenizer, tmp_path_factory.mktemp("random-model"))


@pytest.fixture(scope="module")
def taught_model(tmp_path_factory):
    """A model whose one answer to the task's opening is RIGHT, a single token of its vocabulary."""
    tokenizer = make_tokenizer([RIGHT], split_on_whitespace=False)
    model = make_model(tokenizer)
    teach(model, tokenizer, prompts.opening(TASK), RIGHT)
    return save(model, tokenizer, tmp_path_factory.mktemp("taught-model"))


def _policy(path: str, samples: int = 2, max_new_tokens: int = 12):
    return make_policy(resolve({"policy": "llm", "llm_engine": "transformers", "llm_model": path,
                                "llm_samples": samples, "llm_max_new_tokens": max_new_tokens}, environ={}))


def test_a_random_model_writes_gibberish_which_is_rejected_and_it_is_told_so(random_model, env):
    recorded = []
    entry = search_task(TASK, env, _policy(random_model), budget_s=600, max_candidates=4,
                        record=lambda candidates, evaluations: recorded.extend(zip(candidates, evaluations)))
    assert entry.outcome == "failed" and entry.timings["evaluated"] == 4, "two rounds of two answers"
    assert "rejected: the answer has no ```python code block that defines class ModelNew" in entry.reason
    assert [ev.status for _, ev in recorded] == ["rejected"] * 4
    first, second = recorded[0][0], recorded[2][0]
    # The model's own words, decoded (a sample may end at once: its first token drawn is eos).
    answers = [c.answer for c, _ in recorded]
    assert any(a.strip() for a in answers) and all(set(a.split()) <= set(WORDS) for a in answers), answers
    assert [m["role"] for m in first.conversation] == ["system", "user"]
    assert [m["role"] for m in second.conversation] == ["system", "user", "assistant", "user"]
    assert second.conversation[2]["content"] == first.answer
    assert second.conversation[3]["content"] == prompts.no_code()


def test_a_taught_model_writes_a_candidate_that_passes_verification(taught_model, env):
    entry = search_task(TASK, env, _policy(taught_model, max_new_tokens=4), budget_s=600, max_candidates=2)
    assert entry.timings["evaluated"] == 1, "both samples wrote the same code: run once"
    assert entry.outcome == "inductor" and "Inductor wins" in entry.reason, entry.reason  # correct; CPU never wins
    assert entry.verification["trials"] >= 6 and entry.launch == {"round": 1, "sample": 0}


def test_the_model_is_loaded_once_per_process_and_sampling_leaves_the_callers_random_state(random_model):
    conversation = [{"role": "user", "content": "write a kernel"}]
    TransformersChat(random_model, max_new_tokens=3).complete([conversation], 1)
    loads = _load.cache_info().misses
    torch.manual_seed(0)
    expected = torch.rand(3)
    torch.manual_seed(0)
    answers = TransformersChat(random_model, max_new_tokens=3).complete([conversation, conversation * 2], 3)
    assert torch.equal(torch.rand(3), expected)
    assert _load.cache_info().misses == loads
    assert [len(a) for a in answers] == [3, 3]


def test_a_directory_without_a_model_is_a_policy_error(tmp_path):
    chat = TransformersChat(str(tmp_path), max_new_tokens=3)
    with pytest.raises(PolicyError, match=f"transformers could not load the model in {tmp_path}"):
        chat.complete([[{"role": "user", "content": "hi"}]], 1)


vllm_missing = pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed")


@vllm_missing
def test_without_vllm_the_vllm_engine_is_an_error_naming_the_install_command():
    with pytest.raises(OptionError, match=r"llm_engine 'vllm' needs the vllm package.*pip install 'cuda-agent\[vllm\]'"):
        resolve({"policy": "llm", "llm_engine": "vllm", "llm_model": "Qwen/Qwen2.5-Coder-7B-Instruct"}, environ={})
    # Settings made some other way meet the same error when the policy is made.
    settings = dataclasses.replace(resolve({}, environ={}), policy="llm", llm_engine="vllm", llm_model="m")
    with pytest.raises(PolicyError, match=r"pip install 'cuda-agent\[vllm\]'"):
        make_policy(settings)


def test_the_vllm_engine_sends_a_round_in_one_chat_call(monkeypatch, request):
    """Our side of vLLM's API (LLM(...), SamplingParams(n=...), LLM.chat(conversations, params)),
    against a stand-in module: vLLM itself needs a GPU, so its real run is a GPU measurement."""
    calls = []

    class SamplingParams:
        def __init__(self, **kwargs):
            self.kwargs = kwargs

    class LLM:
        def __init__(self, **kwargs):
            calls.append(("LLM", kwargs))

        def chat(self, conversations, params, use_tqdm=True):
            calls.append(("chat", len(conversations), params.kwargs, use_tqdm))
            n = params.kwargs["n"]
            return [types.SimpleNamespace(outputs=[types.SimpleNamespace(text=f"{i}.{k}") for k in range(n)])
                    for i in range(len(conversations))]

    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "unset after the test")
    monkeypatch.delenv("VLLM_ENABLE_V1_MULTIPROCESSING")
    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(LLM=LLM, SamplingParams=SamplingParams))
    monkeypatch.delitem(sys.modules, "agent_backend.policies.chat_vllm", raising=False)
    request.addfinalizer(lambda: sys.modules.pop("agent_backend.policies.chat_vllm", None))  # bound to the stand-in
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object())
    settings = dataclasses.replace(resolve({}, environ={}), policy="llm", llm_engine="vllm", llm_model="coder",
                                   llm_max_new_tokens=100, llm_gpu_memory=0.4)
    chat = make_chat(settings)
    conversation = [{"role": "user", "content": "hi"}]
    assert chat.complete([conversation] * 3, 2) == [["0.0", "0.1"], ["1.0", "1.1"], ["2.0", "2.1"]]
    chat.complete([conversation], 4)
    assert calls[0] == ("LLM", {"model": "coder", "gpu_memory_utilization": 0.4, "enforce_eager": True}), \
        "made once, reused"
    assert os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0", "its engine core in this process"
    assert calls[1:] == [("chat", 3, {"n": 2, "temperature": 0.8, "max_tokens": 100}, False),
                         ("chat", 1, {"n": 4, "temperature": 0.8, "max_tokens": 100}, False)]
