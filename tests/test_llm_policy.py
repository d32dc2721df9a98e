"""The `llm` policy against a local HTTP server that speaks the OpenAI chat-completions protocol
(as `vllm serve` does) and replays answers shaped like a model's: prompts carry SKILL.md, the
task and, from round two on, what the environment said of earlier candidates; code blocks become
candidates; the search keeps the best; a server that cannot be used is a clear error."""
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from agent_backend.options import OptionError, resolve
from agent_backend.policies import PolicyError, make_policy
from agent_backend.policies.chat import OpenAIChat
from agent_backend.policies.llm import LLMPolicy, extract_source
from agent_backend.search import search_task
from test_env_cases import add_relu_task, module_environment

TASK = add_relu_task()
env = module_environment("cpu", compile_s=120, verify_s=60, profile_s=180, start_s=120)

WRONG = '''```python
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, a, b):
        return torch.relu(a - b)
```'''
BROKEN = '''Here is a fused kernel:

```python
import torch
import torch.nn as nn

class ModelNew(nn.Module):
    def forward(self, a, b)
        return torch.relu(a + b)
```'''
RIGHT = '''The previous answer subtracted. Fixed:

```py
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, a, b):
        return torch.clamp_min(a + b, 0.0)
```
It computes relu(a + b).'''


def completion(model: str, contents: list[str]) -> dict:
    """A /chat/completions reply as OpenAI's API and vLLM's server shape it."""
    return {
        "id": "chatcmpl-test", "object": "chat.completion", "created": int(time.time()), "model": model,
        "choices": [{"index": i, "message": {"role": "assistant", "content": text}, "logprobs": None,
                     "finish_reason": "stop"} for i, text in enumerate(contents)],
        "usage": {"prompt_tokens": 1200, "completion_tokens": 300 * len(contents), "total_tokens": 1500},
    }


class ChatServer:
    """Replays queued answers to POST /v1/chat/completions and records each request."""

    def __init__(self, replies: list):
        self.replies, self.requests = list(replies), []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                server.requests.append({"path": self.path, "headers": dict(self.headers), "body": body})
                status, reply = server.replies.pop(0)
                data = json.dumps(reply).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server(request):
    chat = ChatServer(request.param)
    yield chat
    chat.close()


def _policy(chat, samples=2, api_key=None):
    return make_policy(resolve({"policy": "llm", "llm_url": chat.url, "llm_model": "test-coder",
                                "llm_samples": samples, "llm_api_key": api_key}, environ={}))


@pytest.mark.parametrize("server", [[(200, completion("test-coder", [WRONG, BROKEN])),
                                     (200, completion("test-coder", [RIGHT, RIGHT])),
                                     (200, completion("test-coder", [RIGHT, WRONG]))]], indirect=True)
def test_search_feeds_the_environments_verdicts_back_and_keeps_the_correct_candidate(server, env):
    policy = _policy(server, api_key="secret-token")
    entry = search_task(TASK, env, policy, budget_s=600, max_candidates=8)
    # The third round brings nothing new (answers already tried), which ends the search.
    first, second, third = (r["body"] for r in server.requests)
    assert [r["path"] for r in server.requests] == ["/v1/chat/completions"] * 3
    assert "Attempt 3: correct" in third["messages"][1]["content"]
    assert server.requests[0]["headers"]["Authorization"] == "Bearer secret-token"
    assert (first["model"], first["n"]) == ("test-coder", 2)
    system, user = first["messages"]
    assert system["role"] == "system" and "load_kernel" in system["content"], "SKILL.md is the system prompt"
    assert TASK.program.strip() in user["content"] and "float32[32, 64] stride [64, 1]" in user["content"]
    assert "previous answers" not in user["content"]
    # Round two sees both earlier sources and the environment's verdict on each.
    feedback = second["messages"][1]["content"]
    assert "Attempt 1: incorrect:" in feedback and "torch.relu(a - b)" in feedback
    assert "Attempt 2: compile_error:" in feedback and "SyntaxError" in feedback
    # The duplicate answer is one candidate: 3 evaluated; the correct one is kept (CPU: Inductor wins).
    assert entry.timings["evaluated"] == 3 and entry.outcome == "inductor", entry.reason
    assert entry.origin == "llm:test-coder" and entry.launch == {"round": 2, "sample": 0}
    assert entry.provenance["policy"] == "llm:test-coder" and entry.provenance["policy_revision"] == policy.revision


@pytest.mark.parametrize("server", [[(200, completion("test-coder", ["I cannot help with that.", "```\nx = 1\n```"]))]],
                         indirect=True)
def test_answers_without_a_modelnew_block_give_no_candidate(server, env):
    entry = search_task(TASK, env, _policy(server), budget_s=600, max_candidates=8)
    assert entry.outcome == "failed" and entry.reason == "the policy proposed no candidate"


@pytest.mark.parametrize("server", [[(500, {"object": "error", "message": "model not loaded"})],
                                    [(200, {"unexpected": True})]], indirect=True)
def test_an_unusable_server_is_a_policy_error_naming_it(server):
    with pytest.raises(PolicyError, match=server.url):
        _policy(server).propose(TASK, [])


def test_a_server_that_is_not_there_is_a_policy_error():
    policy = LLMPolicy(OpenAIChat("http://127.0.0.1:9/v1", "test-coder", timeout_s=5), samples=2)
    with pytest.raises(PolicyError, match="no answer from the model server at http://127.0.0.1:9/v1"):
        policy.propose(TASK, [])


def test_code_block_extraction():
    assert extract_source(RIGHT).startswith("import torch") and "clamp_min" in extract_source(RIGHT)
    two = WRONG + "\nor better:\n" + RIGHT
    assert "clamp_min" in extract_source(two), "the last block defining ModelNew"
    assert extract_source("no code") is None


def test_llm_options_are_checked_before_any_work():
    with pytest.raises(OptionError, match="needs llm_url"):
        resolve({"policy": "llm"}, environ={})
    settings = resolve({"policy": "llm", "llm_url": "http://h:8000/v1", "llm_model": "m", "llm_api_key": "k"},
                       environ={})
    assert settings.public()["llm_api_key"] == "<set>"
    assert make_policy(settings).name == "llm:m"


@pytest.mark.parametrize("server", [[(200, completion("test-coder", [WRONG])), (200, completion("test-coder", [WRONG]))]],
                         indirect=True)
def test_a_new_search_of_the_same_task_starts_afresh(server):
    policy = _policy(server, samples=1)
    assert len(policy.propose(TASK, [])) == 1
    again = policy.propose(TASK, [])  # no feedback: another search, which has not seen WRONG yet
    assert len(again) == 1 and again[0].params == {"round": 1, "sample": 0}
    assert "previous answers" not in server.requests[1]["body"]["messages"][1]["content"]
