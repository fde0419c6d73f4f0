"""TaskWeaver's own `taskweaver_config.json` read as our settings, for a project brought over as it is.

TaskWeaver keeps flat dotted keys (`"llm.api_key": ...`, `"round_compressor.rounds_to_retain": 3`),
sometimes nested one level (`"code_interpreter": {...}`). Keys we have under the same name are
taken as they are, a few are renamed or converted, and the rest (logging, experience, embeddings,
example folders...) are listed so the user knows they have no effect here.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from taskweaver_lite.errors import ConfigError

JSON_FILE_NAME = "taskweaver_config.json"

# TaskWeaver's name -> ours, where the meaning is the same.
RENAMED = {
    "session.max_internal_chat_round_num": "session.max_internal_hops",
    "code_generator.enable_auto_plugin_selection": "code_generator.auto_plugin_selection",
}

# Keys whose values mean something else here: each gives our (key, value) pairs, or None when it has no equivalent.
Convert = Callable[[Any], "list[tuple[str, Any]] | None"]
CONVERTED: dict[str, Convert] = {
    # json_object asks for JSON mode; "text" or null turn it off.
    "llm.response_format": lambda value: [("llm.json_mode", value == "json_object")],
    # The OpenAI wire is the only one spoken; "openai" says nothing new.
    "llm.api_type": lambda value: [] if value in (None, "openai") else None,
    # TaskWeaver's container mode isolates the kernel; the sandbox is how this program does that.
    "execution_service.kernel_mode": lambda value: {"local": [], "container": [("execution.sandbox", "bubblewrap")]}.get(str(value)),
}


@dataclass(frozen=True)
class TaskWeaverSettings:
    """The file's keys as our nested settings, and the keys that have no effect here."""

    data: dict[str, Any]
    ignored: tuple[str, ...]

    def notice(self, path: Path) -> str | None:
        """The one line telling the user which keys were not used (None when all were)."""
        if not self.ignored:
            return None
        return f"{path}: TaskWeaver settings with no effect here, ignored: {', '.join(self.ignored)}"


def read_taskweaver_json(path: Path, *, known: Callable[[str], bool]) -> TaskWeaverSettings:
    """Read TaskWeaver's JSON config; `known(dotted_key)` says whether we have that key."""
    try:
        loaded = json.loads(path.read_text(encoding="utf-8-sig"))
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}, line {exc.lineno}: not valid JSON ({exc.msg}); fix the syntax") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not UTF-8; save the file as UTF-8") from None
    if not isinstance(loaded, dict):
        raise ConfigError(f"{path}: expected one JSON object of settings (\"llm.model\": ...)")
    data: dict[str, Any] = {}
    ignored: list[str] = []
    for key, value in _flat(loaded):
        ours = _ours(key, value, known=known)
        if ours is None:
            ignored.append(key)
        for dotted, converted in ours or []:
            _put(data, dotted, converted)
    return TaskWeaverSettings(data=data, ignored=tuple(ignored))


def _ours(key: str, value: Any, *, known: Callable[[str], bool]) -> list[tuple[str, Any]] | None:
    if key in CONVERTED:
        return CONVERTED[key](value)
    name = RENAMED.get(key, key)
    return [(name, value)] if known(name) else None


def _flat(mapping: dict[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    """`{"a": {"b": 1}, "c.d": 2}` -> `[("a.b", 1), ("c.d", 2)]`: both of TaskWeaver's spellings as dotted keys."""
    pairs: list[tuple[str, Any]] = []
    for key, value in mapping.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            pairs += _flat(value, dotted + ".")
        else:
            pairs.append((dotted, value))
    return pairs


def _put(data: dict[str, Any], dotted: str, value: Any) -> None:
    *sections, last = dotted.split(".")
    for part in sections:
        data = data.setdefault(part, {})
    data[last] = value
