"""Chat engines for the `llm` policy: `complete(conversations, n)` gives, for each conversation
(a list of chat messages), n sampled answers; PolicyError when the model cannot be asked now.

Three engines (option llm_engine): `openai` (a server speaking OpenAI's chat API, such as
`vllm serve`: chat_openai.py), `vllm` (vLLM's offline engine in this process: chat_vllm.py) and
`transformers` (a local Hugging Face model in this process: chat_transformers.py). Each imports
its package only when made, so an engine nobody uses costs nothing.
"""
from __future__ import annotations

from typing import Protocol

from ..options import Settings, missing_engine_package
from . import PolicyError

TEMPERATURE = 0.8


class ChatClient(Protocol):
    model: str

    def complete(self, conversations: list[list[dict]], n: int) -> list[list[str]]: ...


def make_chat(settings: Settings) -> ChatClient:
    """The engine named by llm_engine; PolicyError naming the pip command when its package is missing."""
    engine = settings.llm_engine
    missing = missing_engine_package(engine)
    if missing:
        raise PolicyError(missing)
    if engine == "openai":
        from .chat_openai import OpenAIChat
        return OpenAIChat(settings.llm_url, settings.llm_model, settings.llm_api_key,
                          timeout_s=settings.search_budget_s, max_tokens=settings.llm_max_new_tokens)
    if engine == "vllm":
        from .chat_vllm import VLLMChat
        return VLLMChat(settings.llm_model, max_tokens=settings.llm_max_new_tokens,
                        gpu_memory=settings.llm_gpu_memory)
    from .chat_transformers import TransformersChat
    return TransformersChat(settings.llm_model, max_new_tokens=settings.llm_max_new_tokens)
