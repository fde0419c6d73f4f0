"""The examiner: a model that plays the user of a TaskWeaver case, request by request, until it says the stop word.

The transcript keeps TaskWeaver's view of the conversation, the examiner's own: its instructions
(`system`), what the agent said (`human`: to the examiner model the agent is the human) and what
the examiner said (`ai`), ending with the stop word. `eval_code` and the judge see it without that
last message, as TaskWeaver's evaluator does.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from taskweaver_lite.errors import TaskWeaverError
from taskweaver_lite.llm.client import ChatModel
from taskweaver_lite.llm.templates import load_prompt
from taskweaver_lite.records.model_calls import Message

STOP_WORD = "TASK_FINISHED"
Kind = Literal["system", "human", "ai"]
Record = tuple[Kind, str]
_ROLES: dict[Kind, Literal["system", "user", "assistant"]] = {"system": "system", "human": "user", "ai": "assistant"}


class ExaminerFailed(TaskWeaverError):
    """The examiner's own model failed: the run has no score, and it is not the agent's fault."""


class RoundFailed(Exception):
    """The agent could not finish a request: the conversation ends there, and is marked as it stands."""


@dataclass(frozen=True)
class Transcript:
    """The examiner's conversation with the agent, and how many requests the agent answered."""

    records: tuple[Record, ...]
    rounds: int

    @property
    def marked(self) -> tuple[Record, ...]:
        """What scoring sees: everything but the last message (the stop word)."""
        return self.records[:-1]

    def records_json(self) -> str:
        """`marked` as [kind, text] pairs, for the kernel's `chat_history`."""
        return json.dumps([list(record) for record in self.marked], ensure_ascii=False)

    def conversation_json(self) -> str:
        """The messages between user and agent as the judge reads them (no instructions, no kick-off)."""
        spoken = [{"speaker": "user" if kind == "ai" else "agent", "text": text} for kind, text in self.marked[2:]]
        return json.dumps(spoken, ensure_ascii=False, indent=1)


def examine(task_description: str, *, model: ChatModel, ask: Callable[[str], str], max_rounds: int) -> Transcript:
    """Let the examiner talk to the agent (`ask`: a request in, the agent's reply out) for at most `max_rounds` requests."""
    prompt = load_prompt("eval_examiner")
    kick_off = prompt.render("kick_off")
    records: list[Record] = [("system", prompt.render("system", task_description=task_description, kick_off=kick_off, stop_word=STOP_WORD))]
    request = _reply(model, records, kick_off)
    rounds = 0
    while STOP_WORD not in request and rounds < max_rounds:
        rounds += 1
        try:
            answer = ask(request)
        except RoundFailed as exc:
            records += [("human", f"I cannot finish the task because of an error: {exc}"), ("ai", STOP_WORD)]
            break
        request = _reply(model, records, answer)
    return Transcript(tuple(records), rounds)


def _reply(model: ChatModel, records: list[Record], said: str) -> str:
    """The examiner's answer to `said` (the kick-off or the agent's reply), both kept in the records."""
    records.append(("human", said))
    messages: list[Message] = [{"role": _ROLES[kind], "content": text} for kind, text in records]
    try:
        text = model.complete(messages, purpose="examiner").text.strip()
    except TaskWeaverError as exc:
        raise ExaminerFailed(f"the examiner's model failed: {exc}") from exc
    records.append(("ai", text))
    return text
