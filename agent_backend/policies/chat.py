"""Chat clients for the `llm` policy: `complete(messages, n) -> n answer texts`, or PolicyError
when the model cannot be asked now."""
from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Protocol

from . import PolicyError

TEMPERATURE = 0.8
MAX_TOKENS = 8192


class ChatClient(Protocol):
    model: str

    def complete(self, messages: list[dict], n: int) -> list[str]: ...


class OpenAIChat:
    """POST {url}/chat/completions, as OpenAI's API and `vllm serve` take it."""

    def __init__(self, url: str, model: str, api_key: str | None = None, timeout_s: float = 600.0):
        self.url = url.rstrip("/") + "/chat/completions"
        self.model, self.api_key, self.timeout_s = model, api_key, timeout_s

    def complete(self, messages: list[dict], n: int) -> list[str]:
        """The answers' texts; PolicyError when the server cannot be used."""
        body = json.dumps({"model": self.model, "messages": messages, "n": n,
                           "temperature": TEMPERATURE, "max_tokens": MAX_TOKENS}).encode()
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        request = urllib.request.Request(self.url, data=body, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                reply = json.loads(response.read())
        except urllib.error.HTTPError as e:
            detail = e.read().decode(errors="replace")[:500]
            raise PolicyError(f"cuda_agent: {self.url} answered HTTP {e.code}: {detail}") from None
        except (urllib.error.URLError, TimeoutError, OSError) as e:
            raise PolicyError(f"cuda_agent: no answer from the model server at {self.url}: "
                              f"{getattr(e, 'reason', e)}") from None
        except json.JSONDecodeError:
            raise PolicyError(f"cuda_agent: {self.url} did not answer with JSON") from None
        try:
            return [choice["message"]["content"] or "" for choice in reply["choices"]]
        except (KeyError, TypeError):
            raise PolicyError(f"cuda_agent: {self.url} answered without choices[].message.content: "
                              f"{json.dumps(reply)[:300]}") from None
