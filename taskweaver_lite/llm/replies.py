"""Model replies: finding the JSON in what a model wrote, checking it against a role's schema,
and wording the repair turn when it does not fit.

Each `ReplySchema` is also what a constrained call sends (`json_schema`): the same fields, kinds and
allowed values the parser checks, as a strict JSON Schema (every field listed as required, an optional
one nullable, no other keys), so a server that constrains decoding cannot write what the parser refuses.

Local models wrap their JSON in code fences, put prose or a `<think>` block before it, slip on
syntax, or stop mid-object. `extract_json` recovers what is recoverable; `parse_reply` is lenient
only where the meaning cannot change (letter case of enumerated values, a missing wrapper) and
otherwise says exactly what is wrong, in words the model can act on in `repair_message`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from taskweaver_lite.errors import ReplyFormatError

FieldKind = Literal["str", "list"]

_THINK_BLOCK = re.compile(r"<(think|thinking)>.*?</\1>", re.DOTALL | re.IGNORECASE)
_THINK_CLOSE = re.compile(r"</(think|thinking)>", re.IGNORECASE)
_THINK_OPEN = re.compile(r"<(think|thinking)>", re.IGNORECASE)
# A fence's language tag is optional; an unclosed fence (truncated reply) runs to the end.
_FENCE = re.compile(r"```[ \t]*([\w+-]*)[^\n]*\n(.*?)(?:```|\Z)", re.DOTALL)
# An opening brace that starts like a JSON object, as opposed to `{x}` in prose.
_OBJECT_START = re.compile(r"\{\s*(?:[\"']|\Z)")
_PREVIEW_CHARS = 120


class _Nothing:
    """Marks 'nothing found' where `None` would be a real JSON `null`."""


_NOTHING: Any = _Nothing()


@dataclass(frozen=True)
class FieldSpec:
    """One field of a reply: its kind, whether it must be there, and the values it may take."""

    kind: FieldKind = "str"
    required: bool = True
    choices: tuple[str, ...] = ()
    # For a list of objects: the fields each item must have.
    items: Mapping[str, FieldSpec] | None = None


@dataclass(frozen=True)
class ReplySchema:
    """The JSON object a role must answer with, optionally inside a one-key wrapper object."""

    name: str
    wrapper: str | None
    fields: Mapping[str, FieldSpec] = field(default_factory=dict)


PLANNER_SCHEMA = ReplySchema(
    name="Planner",
    wrapper="response",
    fields={
        "init_plan": FieldSpec(),
        "plan": FieldSpec(),
        "current_plan_step": FieldSpec(),
        "send_to": FieldSpec(choices=("User", "CodeInterpreter")),
        "message": FieldSpec(),
    },
)


def planner_schema(recipients: tuple[str, ...]) -> ReplySchema:
    """The Planner's schema with `send_to` taking the enabled roles' aliases and "User" (a repair turn names them)."""
    return replace(PLANNER_SCHEMA, fields={**PLANNER_SCHEMA.fields, "send_to": FieldSpec(choices=recipients)})


CODE_GENERATOR_SCHEMA = ReplySchema(
    name="CodeGenerator",
    wrapper="response",
    fields={
        "thought": FieldSpec(),
        "reply_type": FieldSpec(choices=("python", "text")),
        "reply_content": FieldSpec(),
    },
)

SUMMARY_SCHEMA = ReplySchema(
    name="ConversationSummary",
    wrapper=None,
    fields={
        "ConversationSummary": FieldSpec(),
        "Variables": FieldSpec(
            kind="list",
            required=False,
            items={"name": FieldSpec(), "type": FieldSpec(), "description": FieldSpec(required=False)},
        ),
    },
)


# Broken replies longer than this are not searched or repaired: the answer is to ask again, shorter.
MAX_REPAIR_CHARS = 200_000


def extract_json(text: str) -> Any:
    """Find the JSON value in a model reply: fenced, after prose or `<think>`, slightly broken, or cut off."""
    body = _strip_thinking(text)
    if not body.strip():
        if text.strip():
            raise ReplyFormatError("the reply is not JSON: it holds only a <think> block and no answer after it")
        raise ReplyFormatError("the reply is not JSON: it is empty")
    try:
        return json.loads(body)
    except json.JSONDecodeError:
        pass
    if len(body) > MAX_REPAIR_CHARS:
        # Searching and repairing grow with the square of the length (a cut-off 2 MB reply: ~1 min).
        raise ReplyFormatError(f"the reply is {len(body):,} characters long and not valid JSON; answer with the JSON object only, much shorter")
    for language, block in _FENCE.findall(body):
        if language.lower() in ("", "json", "jsonc", "json5"):
            found = _search(block)
            if found is not _NOTHING:
                return found
    found = _search(body)
    if found is not _NOTHING:
        return found
    raise ReplyFormatError(f"the reply is not JSON: no JSON object found in {_preview(text)}")


def parse_reply(text: str, schema: ReplySchema) -> dict[str, Any]:
    """Read a reply as `schema`'s object (unwrapped), or raise ReplyFormatError saying what is wrong."""
    data = extract_json(text)
    if not isinstance(data, dict):
        raise ReplyFormatError(f"the reply is not a JSON object: got {_kind_of(data)} {_preview(json.dumps(data))}")
    inner = _unwrap(data, schema)
    problems: list[str] = []
    result = _check_fields(inner, schema.fields, problems, prefix="")
    if problems:
        raise ReplyFormatError("; ".join(problems))
    return result


def repair_message(error: ReplyFormatError, schema: ReplySchema) -> str:
    """The user message of a repair turn: what was wrong, and the exact shape to answer with."""
    return (
        f"Your previous reply could not be used: {error}.\n"
        f"Answer again with only the JSON object below, filled in: no prose, no code fences, "
        f"nothing before or after it.\n{schema_outline(schema)}"
    )


def schema_outline(schema: ReplySchema) -> str:
    """A JSON skeleton of `schema` whose values name each field's type or allowed values."""
    outline: Any = _outline_fields(schema.fields)
    if schema.wrapper is not None:
        outline = {schema.wrapper: outline}
    return json.dumps(outline, indent=2)


def json_schema(schema: ReplySchema) -> dict[str, Any]:
    """`schema` as a strict JSON Schema (OpenAI's structured outputs; llama.cpp, vLLM, Ollama and LM Studio take it too)."""
    inner = _object_schema(schema.fields)
    if schema.wrapper is None:
        return inner
    return {"type": "object", "properties": {schema.wrapper: inner}, "required": [schema.wrapper], "additionalProperties": False}


def _object_schema(fields: Mapping[str, FieldSpec]) -> dict[str, Any]:
    # Strict mode wants every property required: an optional field may be null instead (the parser reads null as absent).
    properties = {name: _field_schema(spec) for name, spec in fields.items()}
    return {"type": "object", "properties": properties, "required": list(fields), "additionalProperties": False}


def _field_schema(spec: FieldSpec) -> dict[str, Any]:
    described: dict[str, Any]
    if spec.kind == "list":
        items = _object_schema(spec.items) if spec.items is not None else {"type": "string"}
        described = {"type": "array", "items": items}
    else:
        described = {"type": "string"}
        if spec.choices:
            described["enum"] = list(spec.choices)
    if not spec.required:
        described["type"] = [described["type"], "null"]
        if "enum" in described:
            described["enum"] = [*described["enum"], None]
    return described


def _strip_thinking(text: str) -> str:
    body = _THINK_BLOCK.sub("", text)
    closes = list(_THINK_CLOSE.finditer(body))
    if closes:
        # Some models (DeepSeek-R1 style) omit the opening tag: the answer follows the last close.
        body = body[closes[-1].end() :]
    opened = _THINK_OPEN.search(body)
    if opened is not None:
        # Cut off while thinking: only what came before the open tag can be the answer.
        body = body[: opened.start()]
    return body


def _search(text: str) -> Any:
    """Strict JSON at the first object-like brace; failing that, repair from there."""
    decoder = json.JSONDecoder()
    for match in re.finditer(r"\{", text):
        try:
            value, _ = decoder.raw_decode(text, match.start())
        except json.JSONDecodeError:
            if _OBJECT_START.match(text, match.start()):
                # It starts like our object but does not parse: a slip or a cut. Never skip past it,
                # or an object nested inside it would be taken for the answer.
                return _repaired(text[match.start() :])
            continue
        if value:  # `{}` in prose is not an answer
            return value
    start = text.find("{")
    if start < 0:
        start = text.find("[")
    if start < 0:
        return _NOTHING
    return _repaired(text[start:])


def _repaired(text: str) -> Any:
    # Imported here: most replies are clean JSON, and the import costs ~25 ms.
    import json_repair

    value = json_repair.loads(text)
    if isinstance(value, list) and text.startswith("{") and value and isinstance(value[0], dict):
        # Prose after the object containing more braces makes json_repair return a list.
        value = value[0]
    if isinstance(value, (dict, list)) and value:
        return value
    return _NOTHING


def _unwrap(data: dict[str, Any], schema: ReplySchema) -> dict[str, Any]:
    names = {name.lower() for name in schema.fields}
    if schema.wrapper is not None:
        inner = _lookup(data, schema.wrapper)
        if isinstance(inner, dict):
            return inner
        if inner is not _NOTHING:
            raise ReplyFormatError(f"'{schema.wrapper}' must be a JSON object; got {_kind_of(inner)}")
    if any(key.lower() in names for key in data):
        return data  # the fields at the top level: the wrapper was left out
    if len(data) == 1:
        only = next(iter(data.values()))
        if isinstance(only, dict) and any(key.lower() in names for key in only):
            return only  # wrapped under another name
    if schema.wrapper is not None:
        raise ReplyFormatError(
            f"missing the '{schema.wrapper}' object: expected {{\"{schema.wrapper}\": {{...}}}} "
            f"with the fields {', '.join(schema.fields)}; got keys {', '.join(data) or '(none)'}"
        )
    return data


def _check_fields(data: Mapping[str, Any], fields: Mapping[str, FieldSpec], problems: list[str], *, prefix: str) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for name, spec in fields.items():
        label = f"{prefix}{name}"
        value = _lookup(data, name)
        if value is _NOTHING or (value is None and not spec.required):
            if spec.required:
                problems.append(f"missing field '{label}'")
            else:
                result[name] = [] if spec.kind == "list" else ""
            continue
        checked: str | list[Any] | None
        if spec.kind == "str":
            checked = _as_str(value, spec, label, problems)
        else:
            checked = _as_list(value, spec, label, problems)
        if checked is not None:
            result[name] = checked
    # Fields beyond the schema are kept: the contract allows roles to add more.
    result.update((key, value) for key, value in data.items() if _canonical(key, fields) is None)
    return result


def _as_str(value: Any, spec: FieldSpec, label: str, problems: list[str]) -> str | None:
    if isinstance(value, bool):
        text = "true" if value else "false"
    elif isinstance(value, (str, int, float)):
        text = str(value)
    elif isinstance(value, list) and all(isinstance(item, str) for item in value) and not spec.choices:
        text = "\n".join(value)  # a plan written as a list of steps
    else:
        problems.append(f"field '{label}' must be a string; got {_kind_of(value)}")
        return None
    if not spec.choices:
        return text
    wanted = _loose(text)
    for choice in spec.choices:
        if _loose(choice) == wanted:
            return choice
    problems.append(f"field '{label}' must be one of {', '.join(spec.choices)}; got {text!r}")
    return None


def _as_list(value: Any, spec: FieldSpec, label: str, problems: list[str]) -> list[Any] | None:
    items = [value] if isinstance(value, dict) else value
    if not isinstance(items, list):
        problems.append(f"field '{label}' must be a list; got {_kind_of(value)}")
        return None
    if spec.items is None:
        return list(items)
    checked: list[Any] = []
    for index, item in enumerate(items):
        if not isinstance(item, dict):
            problems.append(f"item {label}[{index}] must be an object; got {_kind_of(item)}")
            continue
        checked.append(_check_fields(item, spec.items, problems, prefix=f"{label}[{index}]."))
    return checked


def _lookup(data: Mapping[str, Any], name: str) -> Any:
    """The value under `name`, its letter case ignored; `_NOTHING` when absent."""
    if name in data:
        return data[name]
    lowered = name.lower()
    for key, value in data.items():
        if key.lower() == lowered:
            return value
    return _NOTHING


def _canonical(key: str, fields: Mapping[str, FieldSpec]) -> str | None:
    lowered = key.lower()
    return next((name for name in fields if name.lower() == lowered), None)


def _loose(value: str) -> str:
    """Compare enumerated values ignoring case, spaces, underscores and hyphens."""
    return re.sub(r"[\s_-]+", "", value).lower()


def _outline_fields(fields: Mapping[str, FieldSpec]) -> dict[str, Any]:
    outline: dict[str, Any] = {}
    for name, spec in fields.items():
        if spec.kind == "list":
            outline[name] = [_outline_fields(spec.items)] if spec.items is not None else ["..."]
        elif spec.choices:
            outline[name] = " | ".join(spec.choices)
        else:
            outline[name] = "<string>"
    return outline


def _kind_of(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    return "an object"


def _preview(text: str) -> str:
    flat = " ".join(text.split())
    if len(flat) > _PREVIEW_CHARS:
        flat = flat[:_PREVIEW_CHARS] + "..."
    return repr(flat)
