"""The `vllm` engine: vLLM's offline engine (`vllm.LLM`) in this process. The engine is made once
per process (per model) and kept for every later search: loading a model takes minutes. A round's
conversations go to one `LLM.chat` call, which applies the model's chat template and batches
them, each sampled n times (`SamplingParams(n=n)`). It runs eagerly (see _engine); a model
served apart (`vllm serve`, llm_engine=openai) keeps vLLM's CUDA graphs and compiled model."""
from __future__ import annotations

import functools
import os

import vllm

from . import PolicyError
from .chat import TEMPERATURE


@functools.cache
def _engine(model: str, gpu_memory: float) -> vllm.LLM:
    # The engine is made inside Inductor's pass, in the user's program, so:
    # - its engine core stays in this process: a spawned one would run the user's __main__ again;
    # - enforce_eager: no torch.compile of its own, which would run under the user's compile
    #   with Inductor's config of the moment (our pass included), and no CUDA graphs;
    # - vLLM takes 90% of the GPU's memory by default; the kernels under test and the user's
    #   model need the rest.
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    return vllm.LLM(model=model, gpu_memory_utilization=gpu_memory, enforce_eager=True)


class VLLMChat:
    def __init__(self, model: str, max_tokens: int = 8192, gpu_memory: float = 0.5):
        self.model, self.max_tokens, self.gpu_memory = model, max_tokens, gpu_memory

    def complete(self, conversations: list[list[dict]], n: int) -> list[list[str]]:
        try:
            llm = _engine(self.model, self.gpu_memory)
        except Exception as e:  # vLLM's own errors have no common base; none of them is a result
            raise PolicyError(f"cuda_agent: vLLM could not load {self.model!r}: {type(e).__name__}: {e}") from None
        params = vllm.SamplingParams(n=n, temperature=TEMPERATURE, max_tokens=self.max_tokens)
        try:
            outputs = llm.chat(conversations, params, use_tqdm=False)
        except Exception as e:
            raise PolicyError(f"cuda_agent: vLLM failed to answer with {self.model!r}: {type(e).__name__}: {e}") from None
        return [[completion.text for completion in request.outputs] for request in outputs]
