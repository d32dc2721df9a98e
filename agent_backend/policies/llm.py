"""The `llm` policy: a chat model writes the candidates (today through an OpenAI-compatible chat
API, `vllm serve` or any server that speaks /chat/completions: chat.py).

Each round asks for `samples` answers to one prompt: skills/SKILL.md as the system message, then
the task's program and, from the second round on, the latest earlier candidates with what the
environment said of each (compile errors, mismatches, speedups). Each answer's last Python code
block defining ModelNew is a candidate. The search loop decides how many rounds there are.
"""
from __future__ import annotations

import functools
import hashlib
import re
from pathlib import Path

from ..specs import Candidate, Task
from .chat import ChatClient

# Bound the prompt: the latest attempts only, their sources and verdicts cut to these lengths.
_MAX_ATTEMPTS_SHOWN = 8
_MAX_FEEDBACK_SOURCE = 8000
_MAX_FEEDBACK_REASON = 1500

_TASK_PROMPT = """\
Write a faster `ModelNew` for this PyTorch program. It must compute the same outputs for inputs
with exactly these shapes, strides and dtypes, on device {device}.

```python
{program}
```

Inputs: {inputs}
Outputs: {outputs}
"""
_FEEDBACK_PROMPT = """\

Your previous answers and what the environment found:
{attempts}
Improve on them: fix what failed, and make the fastest correct one faster.
"""
_ANSWER_PROMPT = """
Answer with one complete Python code block that defines `class ModelNew(nn.Module)`.
"""
_CODE_BLOCK = re.compile(r"```(?:python|py)?[ \t]*\n(.*?)```", re.DOTALL)


def _signature(specs) -> str:
    return ", ".join(f"{s.dtype}{list(s.shape)} stride {list(s.stride)}" for s in specs)


def extract_source(answer: str) -> str | None:
    """The last fenced code block of `answer` that defines ModelNew, if any."""
    blocks = [b for b in _CODE_BLOCK.findall(answer) if "class ModelNew" in b]
    return blocks[-1].strip() + "\n" if blocks else None


def _verdict(ev) -> str:
    if ev.status == "passed" and ev.profile and ev.profile.get("speedup_vs_inductor"):
        return f"correct, {ev.profile['speedup_vs_inductor']:.2f}x the speed of torch.compile (Inductor)"
    if ev.status == "passed":
        return "correct"
    return f"{ev.status}: {ev.reason[:_MAX_FEEDBACK_REASON]}"


class LLMPolicy:
    def __init__(self, chat: ChatClient, samples: int):
        self.chat, self.model, self.samples = chat, chat.model, samples
        import skills
        self.skill = (Path(skills.__file__).parent / "SKILL.md").read_text()
        self._proposed: dict[str, list[Candidate]] = {}  # task hash -> candidates, in the order evaluated
        self._rounds: dict[str, int] = {}

    @property
    def name(self) -> str:
        return f"llm:{self.model}"

    @functools.cached_property
    def revision(self) -> str:
        """The model and every word it is shown: a change to any re-opens cached losers."""
        text = "\0".join([self.model, self.skill, _TASK_PROMPT, _FEEDBACK_PROMPT, _ANSWER_PROMPT])
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def why_not(self, task: Task) -> str | None:
        return None  # a model may try any task

    def propose(self, task: Task, feedback: list) -> list[Candidate]:
        if not feedback:  # a new search of this task: earlier answers belong to another one
            self._proposed[task.hash], self._rounds[task.hash] = [], 0
        earlier = self._proposed[task.hash]
        round_number = self._rounds[task.hash] = self._rounds[task.hash] + 1
        answers = self.chat.complete(self._messages(task, list(zip(earlier, feedback))), self.samples)
        candidates, seen = [], {c.source for c in earlier}
        for i, answer in enumerate(answers):
            source = extract_source(answer)
            if source and source not in seen:
                seen.add(source)
                candidates.append(Candidate(source, self.name, {"round": round_number, "sample": i}))
        earlier.extend(candidates)
        return candidates

    def _messages(self, task: Task, attempts: list) -> list[dict]:
        prompt = _TASK_PROMPT.format(device=task.outputs[0].device, program=task.program.strip(),
                                     inputs=_signature(task.inputs), outputs=_signature(task.outputs))
        if attempts:
            first = max(0, len(attempts) - _MAX_ATTEMPTS_SHOWN)
            prompt += _FEEDBACK_PROMPT.format(attempts="".join(
                f"\nAttempt {k + 1}: {_verdict(ev)}\n```python\n{c.source[:_MAX_FEEDBACK_SOURCE]}```\n"
                for k, (c, ev) in enumerate(attempts) if k >= first))
        return [{"role": "system", "content": self.skill}, {"role": "user", "content": prompt + _ANSWER_PROMPT}]
