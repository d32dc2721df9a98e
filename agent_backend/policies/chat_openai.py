"""The `openai` engine: a server that speaks OpenAI's chat-completions API (`vllm serve`, SGLang,
OpenAI itself), through the official `openai` client, which brings time limits, retries of
connection errors, 408/409/429 and 5xx answers (two, with backoff), and typed errors."""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import openai

from . import PolicyError
from .chat import TEMPERATURE

# vLLM's server takes any key when started without --api-key; the client needs one to be set.
# Passing ours always also keeps OPENAI_API_KEY from being sent to a server the user named.
_NO_KEY = "EMPTY"


class OpenAIChat:
    def __init__(self, url: str, model: str, api_key: str | None = None, timeout_s: float = 600.0,
                 max_tokens: int = 8192, max_retries: int = 2):
        self.url, self.model, self.max_tokens, self.timeout_s = url.rstrip("/"), model, max_tokens, timeout_s
        self.client = openai.OpenAI(base_url=self.url, api_key=api_key or _NO_KEY, timeout=timeout_s,
                                    max_retries=max_retries)

    def complete(self, conversations: list[list[dict]], n: int) -> list[list[str]]:
        """One request per conversation, sent together (a server batches them)."""
        if len(conversations) == 1:
            return [self._ask(conversations[0], n)]
        with ThreadPoolExecutor(max_workers=len(conversations)) as pool:
            return list(pool.map(lambda messages: self._ask(messages, n), conversations))

    def _ask(self, messages: list[dict], n: int) -> list[str]:
        try:
            reply = self.client.chat.completions.create(model=self.model, messages=messages, n=n,
                                                        temperature=TEMPERATURE, max_tokens=self.max_tokens)
        except openai.APITimeoutError:
            raise PolicyError(f"cuda_agent: the model server at {self.url} did not answer within "
                              f"{self.timeout_s:g} s") from None
        except openai.APIConnectionError as e:
            raise PolicyError(f"cuda_agent: no answer from the model server at {self.url}: "
                              f"{e.__cause__ or e}") from None
        except openai.APIStatusError as e:
            raise PolicyError(f"cuda_agent: {self.url} answered HTTP {e.status_code}: {_detail(e)}") from None
        except openai.OpenAIError as e:  # an answer that is not a chat completion, and the rest
            raise PolicyError(f"cuda_agent: {self.url} did not give a chat completion: {e}") from None
        try:
            return [choice.message.content or "" for choice in reply.choices]
        except (AttributeError, TypeError):
            raise PolicyError(f"cuda_agent: {self.url} answered without choices[].message.content: "
                              f"{str(reply)[:300]}") from None


def _detail(error: openai.APIStatusError) -> str:
    try:
        return error.response.text[:500]
    except Exception:  # a response whose body cannot be read any more
        return str(error)[:500]
