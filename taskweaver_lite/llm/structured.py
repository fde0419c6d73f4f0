"""Replies constrained to their schema: the `response_format` a call carries under `llm.structured`.

A call that reads JSON names its `ReplySchema` (the Planner's with its `send_to` enum, the
CodeGenerator's, a fold's summary, distilled tips, the eval judge's verdict); a call that answers in
prose names none and is never constrained. What the schema becomes on the wire:

- `json_schema`: the role's schema as a strict JSON Schema (`replies.json_schema`). The server
  constrains decoding to it (OpenAI's structured outputs, llama.cpp's grammar, vLLM's guided decoding,
  Ollama and LM Studio), so a reply cannot break the format, only be cut off at its length limit.
- `json_object`: any JSON object (the older JSON mode); the fields are the prompt's and the parser's to hold.
- `off`: nothing; the prompt asks for JSON and a broken reply gets a repair turn.
- `auto` (the default): json_schema, stepping down once for the session, to json_object and then to
  nothing, when the endpoint refuses one (an HTTP 400 or 422 that names it). An explicit
  `json_schema` or `json_object` is a promise: a refusal is an error naming `llm.structured`.

Repair turns stay on at every level: a constrained reply may still be cut off, and `json_object`
holds no field. The schema travels in the request's `response_format`, never in the prompt, so the
prompt's cached prefix is the same at every level.
"""

from __future__ import annotations

import threading
from typing import Any, Literal

from taskweaver_lite.config.settings import Structured
from taskweaver_lite.llm.replies import ReplySchema, json_schema

Level = Literal["json_schema", "json_object", "off"]

# Where each setting starts, and the level below each one (auto only ever steps down).
_START: dict[Structured, Level] = {"auto": "json_schema", "json_schema": "json_schema", "json_object": "json_object", "off": "off"}
_BELOW: dict[Level, Level] = {"json_schema": "json_object", "json_object": "off", "off": "off"}
# Words of a refusal that point at the constraint rather than at something else in the request.
REFUSAL_WORDS = ("response_format", "json_schema", "json_object")


class ResponseFormat:
    """What one client's calls ask for under `llm.structured`, and where `auto` stepped down to (for the session).

    Shared by the threads of a session (its roles and its folds): a step down happens once.
    """

    def __init__(self, setting: Structured) -> None:
        self.setting = setting
        self._level = _START[setting]
        self._lock = threading.Lock()

    @property
    def level(self) -> Level:
        """What calls with a schema ask for now."""
        with self._lock:
            return self._level

    def for_call(self, schema: ReplySchema | None) -> dict[str, Any] | None:
        """The `response_format` of a call whose reply must fit `schema` (None: a prose call, or nothing to send)."""
        if schema is None:
            return None
        level = self.level
        if level == "json_schema":
            return {"type": "json_schema", "json_schema": {"name": schema.name, "strict": True, "schema": json_schema(schema)}}
        if level == "json_object":
            return {"type": "json_object"}
        return None

    def step_down(self, refused: dict[str, Any]) -> bool:
        """The endpoint refused `refused`: True when `auto` now asks for less (ask again), False when the setting holds it to this one."""
        if self.setting != "auto":
            return False
        with self._lock:
            if refused.get("type") == self._level:
                self._level = _BELOW[self._level]
        return True


def refusal_names_it(message: str) -> bool:
    """Whether a server's 400/422 message is about the response format (the constraint), by its words."""
    lowered = message.lower()
    return any(word in lowered for word in REFUSAL_WORDS)
