"""The `llm` policy with the `openai` engine against a local HTTP server that speaks the OpenAI
chat-completions protocol (as `vllm serve` does) and answers like a model: conversations open with
SKILL.md and the task, each is continued with what the environment said of its own last answer,
code blocks become candidates, the search keeps the best, and a server that cannot be used is a
clear error."""
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from agent_backend.env.results import Evaluation
from agent_backend.options import OptionError, resolve
from agent_backend.policies import PolicyError, make_policy
from agent_backend.policies.chat_openai import OpenAIChat
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
    """Answers POST /v1/chat/completions and records each request. `replies` is a function of the
    request body giving (status, reply), or a list of them replayed in order (the last one again
    once the others are used: the client retries)."""

    def __init__(self, replies):
        self.respond = replies if callable(replies) else self._replay(list(replies))
        self.requests = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                server.requests.append({"path": self.path, "body": body,
                                        "headers": {k.lower(): v for k, v in self.headers.items()}})
                status, reply = server.respond(body)
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

    @staticmethod
    def _replay(replies):
        lock = threading.Lock()

        def respond(body):
            with lock:
                return replies.pop(0) if len(replies) > 1 else replies[0]
        return respond

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


def scripted_coder(body):
    """A model that writes WRONG and BROKEN first, fixes both to RIGHT after the environment's
    verdict, then repeats RIGHT where it was told RIGHT is correct and WRONG where it was told
    its code repeats an earlier answer."""
    messages = body["messages"]
    if len(messages) == 2:
        return 200, completion(body["model"], [WRONG, BROKEN][:body["n"]])
    told = messages[-1]["content"]
    answer = WRONG if told.startswith("That code is the same") else RIGHT
    return 200, completion(body["model"], [answer])


def _conversation(requests, first_answer):
    """The bodies of one conversation's requests after the opening, by its first answer."""
    return [r["body"] for r in requests if len(r["body"]["messages"]) > 2
            and r["body"]["messages"][2]["content"] == first_answer]


@pytest.mark.parametrize("server", [scripted_coder], indirect=True)
def test_conversations_get_the_environments_verdicts_and_the_best_candidate_is_kept(server, env):
    policy = _policy(server, api_key="secret-token")
    recorded = []
    entry = search_task(TASK, env, policy, budget_s=600, max_candidates=8,
                        record=lambda candidates, evaluations: recorded.extend(zip(candidates, evaluations)))
    opening = server.requests[0]["body"]
    assert (opening["model"], opening["n"]) == ("test-coder", 2)
    assert server.requests[0]["headers"]["authorization"] == "Bearer secret-token"
    system, user = opening["messages"]
    assert system["role"] == "system" and "load_kernel" in system["content"], "SKILL.md is the system prompt"
    assert TASK.program.strip() in user["content"] and "float32[32, 64] stride [64, 1]" in user["content"]
    # Each of the two conversations is continued with what the environment said of its own answer.
    wrong_then, broken_then = _conversation(server.requests, WRONG), _conversation(server.requests, BROKEN)
    assert [b["n"] for b in wrong_then + broken_then] == [1, 1, 1, 1], "two more rounds, one answer each"
    told = wrong_then[0]["messages"][-1]["content"]
    assert told.startswith("Your code ran, but its outputs are wrong") and "input set 1" in told
    assert "max abs err" in told and "largest absolute error" in told
    told = broken_then[0]["messages"][-1]["content"]
    assert told.startswith("Your code did not build") and "SyntaxError" in told and "line 5" in told
    # Round three: the fixed answer hears its timing; the one that repeated it hears so.
    told = wrong_then[1]["messages"][-1]["content"]
    assert told.startswith("Your code is correct") and "torch.compile (Inductor)" in told and "float64" in told
    assert broken_then[1]["messages"][-1]["content"].startswith("That code is the same as an earlier answer, "
                                                               "which was judged: correct")
    assert [m["role"] for m in wrong_then[1]["messages"]] == ["system", "user", "assistant", "user", "assistant", "user"]
    # Round three brought no new code, which ends the search: WRONG, BROKEN and RIGHT were run.
    assert [ev.status for _, ev in recorded] == ["incorrect", "compile_error", "passed"]
    assert recorded[2][0].answer == RIGHT and recorded[2][0].conversation == tuple(wrong_then[0]["messages"])
    assert entry.timings["evaluated"] == 3 and entry.outcome == "inductor", entry.reason  # CPU: Inductor keeps it
    assert entry.origin == "llm:test-coder" and entry.launch == {"round": 2, "sample": 0}
    assert entry.provenance["policy"] == "llm:test-coder" and entry.provenance["policy_revision"] == policy.revision


@pytest.mark.parametrize("server", [[(200, completion("test-coder", ["I cannot help with that.", "```\nx = 1\n```"]))]],
                         indirect=True)
def test_answers_without_a_modelnew_block_are_rejected_without_running(server, env):
    entry = search_task(TASK, env, _policy(server), budget_s=600, max_candidates=2)
    assert entry.outcome == "failed" and entry.timings["evaluated"] == 2
    assert entry.reason == ("no candidate of 2 passed (rejected: the answer has no ```python code block that "
                            "defines class ModelNew(nn.Module))")
    assert entry.timings["phase_s"] == {}, "nothing went to a worker"


@pytest.mark.parametrize("server", [[(200, completion("test-coder", ["no code here", RIGHT]))]], indirect=True)
def test_a_rejected_answer_is_told_why_in_its_conversation(server):
    policy = _policy(server)
    first = policy.propose(TASK, [])
    assert [c.rejection is not None for c in first] == [True, False]
    policy.propose(TASK, [Evaluation("rejected", first[0].rejection), Evaluation("passed")])
    told = {r["body"]["messages"][2]["content"]: r["body"]["messages"][-1]["content"] for r in server.requests[1:]}
    assert told["no code here"].startswith("Your answer has no ```python code block")
    assert told[RIGHT].startswith("Your code is correct")


@pytest.mark.parametrize("server", [[(500, {"object": "error", "message": "model not loaded"})]], indirect=True)
def test_a_failing_server_is_retried_then_a_policy_error_naming_it(server):
    with pytest.raises(PolicyError, match=rf"{server.url} answered HTTP 500: .*model not loaded"):
        _policy(server).propose(TASK, [])
    assert len(server.requests) == 3, "the openai client retries a 5xx answer twice"


@pytest.mark.parametrize("server", [[(200, {"unexpected": True})]], indirect=True)
def test_an_answer_that_is_no_chat_completion_is_a_policy_error(server):
    with pytest.raises(PolicyError, match=server.url):
        _policy(server).propose(TASK, [])


def test_a_server_that_is_not_there_is_a_policy_error():
    policy = LLMPolicy(OpenAIChat("http://127.0.0.1:9/v1", "test-coder", timeout_s=5, max_retries=0), samples=2)
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
    assert settings.llm_engine == "openai" and settings.public()["llm_api_key"] == "<set>"
    assert make_policy(settings).name == "llm:m"
    with pytest.raises(OptionError, match="needs llm_model"):
        resolve({"policy": "llm", "llm_engine": "vllm"}, environ={})
    with pytest.raises(OptionError, match="'/no/such/model' is not one"):
        resolve({"policy": "llm", "llm_engine": "transformers", "llm_model": "/no/such/model"}, environ={})
    with pytest.raises(OptionError, match="must be one of openai, vllm, transformers"):
        resolve({"llm_engine": "tgi"}, environ={})
    assert resolve({}, environ={"CUDA_AGENT_LLM_ENGINE": "vllm"}).llm_engine == "vllm"


@pytest.mark.parametrize("server", [[(200, completion("test-coder", [WRONG])), (200, completion("test-coder", [WRONG]))]],
                         indirect=True)
def test_a_new_search_of_the_same_task_starts_afresh(server):
    policy = _policy(server, samples=1)
    assert len(policy.propose(TASK, [])) == 1
    again = policy.propose(TASK, [])  # no feedback: another search, which has not seen WRONG yet
    assert len(again) == 1 and again[0].params == {"round": 1, "sample": 0}
    assert len(server.requests[1]["body"]["messages"]) == 2, "a new conversation"
