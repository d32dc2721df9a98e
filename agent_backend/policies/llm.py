"""The `llm` policy: a chat model writes the candidates in multi-turn conversations with the
environment, as in the agent loop of CUDA Agent (arXiv 2602.24286), run by one of the chat
engines of chat.py.

Round 1 samples `samples` answers to one opening (skills/SKILL.md as the system message, the task
as the first user turn); each answer starts a conversation. Every later round replies to each
conversation's last answer with what the environment found (prompts.py: the compiler's errors,
the check that failed with its input set and worst error, or the timing against Inductor) and
samples one new answer in each. An answer's last Python code block defining ModelNew is a
candidate; an answer without one is rejected without running (and told so); an answer repeating
earlier code is not run again (and told what that code got). The search decides how many rounds
there are (its budget of candidates and seconds) and keeps the best verified candidate.

Long conversations are cut before they are sent: the opening and the last _TURNS_KEPT exchanges
stay, and an answer longer than _MAX_ANSWER_CHARS stays in the history as its code block alone.
"""
from __future__ import annotations

import functools
import hashlib
import re
from dataclasses import dataclass, field

from ..specs import Candidate, Task
from . import prompts
from .chat import ChatClient

_TURNS_KEPT = 3
_MAX_ANSWER_CHARS = 12000
NO_CODE = "the answer has no ```python code block that defines class ModelNew(nn.Module)"
_CODE_BLOCK = re.compile(r"```(?:python|py)?[ \t]*\n(.*?)```", re.DOTALL)


def extract_source(answer: str) -> str | None:
    """The last fenced code block of `answer` that defines ModelNew, if any."""
    blocks = [b for b in _CODE_BLOCK.findall(answer) if "class ModelNew" in b]
    return blocks[-1].strip() + "\n" if blocks else None


@dataclass
class _Conversation:
    messages: list[dict]  # as sent for its last answer, then that answer
    last: int  # the search's candidate its last answer is, or repeats
    repeated: bool


@dataclass
class _Search:
    candidates: list[Candidate] = field(default_factory=list)  # in the order the search evaluates them
    by_source: dict[str, int] = field(default_factory=dict)
    conversations: list[_Conversation] = field(default_factory=list)
    rounds: int = 0


def _kept(answer: str, source: str | None) -> str:
    """An answer as the history keeps it."""
    if len(answer) <= _MAX_ANSWER_CHARS:
        return answer
    return f"```python\n{source}```" if source else answer[:_MAX_ANSWER_CHARS] + "\n... (cut)"


def _compact(messages: list[dict]) -> list[dict]:
    """The opening, then the last _TURNS_KEPT (answer, reply) exchanges."""
    opening, exchanges = messages[:2], messages[2:]
    return opening + exchanges[-2 * _TURNS_KEPT:]


class LLMPolicy:
    def __init__(self, chat: ChatClient, samples: int):
        self.chat, self.model, self.samples = chat, chat.model, samples
        self._search: tuple[str, _Search] | None = None  # (task hash, state) of the search under way

    @property
    def name(self) -> str:
        return f"llm:{self.model}"

    @functools.cached_property
    def revision(self) -> str:
        """The model and every word it may be shown: a change to any re-opens cached losers."""
        return hashlib.sha256(f"{self.model}\0{prompts.all_text()}".encode()).hexdigest()[:16]

    def why_not(self, task: Task) -> str | None:
        return None  # a model may try any task

    def propose(self, task: Task, feedback: list) -> list[Candidate]:
        if not feedback:  # a new search (the dispatcher runs one at a time): earlier state is done with
            search = _Search()
            self._search = (task.hash, search)
            opening = prompts.opening(task)
            sent = [opening] * self.samples
            answers = self.chat.complete([opening], self.samples)[0]
        else:
            searched, search = self._search
            assert searched == task.hash, "feedback on another task than the search under way"
            sent = [_compact(c.messages + [{"role": "user", "content": self._reply(search, c, feedback)}])
                    for c in search.conversations]
            answers = [samples[0] for samples in self.chat.complete(sent, 1)]
        search.rounds += 1
        new, search.conversations = [], []
        for i, (messages, answer) in enumerate(zip(sent, answers)):
            source = extract_source(answer)
            repeated = source is not None and source in search.by_source
            if repeated:
                index = search.by_source[source]
            else:
                index = len(search.candidates)
                candidate = Candidate(source or "", self.name, {"round": search.rounds, "sample": i},
                                      conversation=tuple(messages), answer=answer,
                                      rejection=None if source else NO_CODE)
                search.candidates.append(candidate)
                new.append(candidate)
                if source:
                    search.by_source[source] = index
            history = messages + [{"role": "assistant", "content": _kept(answer, source)}]
            search.conversations.append(_Conversation(history, index, repeated))
        return new

    @staticmethod
    def _reply(search: _Search, conversation: _Conversation, feedback: list) -> str:
        """What the environment said of the conversation's last answer."""
        evaluation = feedback[conversation.last]
        if conversation.repeated:
            return prompts.repeated(evaluation)
        if search.candidates[conversation.last].rejection is not None:
            return prompts.no_code()
        return prompts.reply(evaluation)
