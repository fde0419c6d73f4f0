"""TaskWeaver's own `taskweaver_config.json` read as our settings, for a project brought over as it is.

TaskWeaver keeps flat dotted keys (`"llm.api_key": ...`, `"round_compressor.rounds_to_retain": 3`),
sometimes nested one level (`"code_interpreter": {...}`). Keys we have under the same name are
taken as they are, a few are renamed or converted, a role's own keys (`"echo.decorator"`, for a
role in `roles/` or `session.roles`) go to that role's section, and the rest (logging, embeddings,
example folders...) are listed so the user knows they have no effect here.

`${NAME}` in a text value is the environment variable NAME (`"llm.api_key": "${OPENAI_API_KEY}"`),
and TaskWeaver's `${AppBaseDir}` the project folder; an unset variable stops loading with a line
naming the file, the key and the variable. `planner.use_experience` and
`code_generator.use_experience` become `experience.enabled` (one switch for both roles here, on by
default), said in one line.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from taskweaver_lite.errors import ConfigError

JSON_FILE_NAME = "taskweaver_config.json"
_PLACEHOLDER = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
_EXPERIENCE_KEYS = ("planner.use_experience", "code_generator.use_experience")

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
    mapped: tuple[str, ...] = ()  # keys read with another meaning, each said in a line

    def notices(self, path: Path) -> list[str]:
        """The lines telling the user what was mapped and which keys were not used."""
        lines = [f"{path}: {line}" for line in self.mapped]
        if self.ignored:
            lines.append(f"{path}: TaskWeaver settings with no effect here, ignored: {', '.join(self.ignored)}")
        return lines


def read_taskweaver_json(path: Path, *, known: Callable[[str], bool], role_folders: Collection[str] = ()) -> TaskWeaverSettings:
    """Read TaskWeaver's JSON config; `known(dotted_key)` says whether we have that key, `role_folders` names the project's roles."""
    try:
        loaded = json.loads(path.read_text(encoding="utf-8-sig"))
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}, line {exc.lineno}: not valid JSON ({exc.msg}); fix the syntax") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not UTF-8; save the file as UTF-8") from None
    if not isinstance(loaded, dict):
        raise ConfigError(f'{path}: expected one JSON object of settings ("llm.model": ...)')
    pairs = [(key, _expanded(value, path=path, key=key)) for key, value in _flat(loaded)]
    roles = {*role_folders, *_session_roles(pairs)}
    data: dict[str, Any] = {}
    ignored: list[str] = []
    experience = {key: value for key, value in pairs if key in _EXPERIENCE_KEYS}
    for key, value in pairs:
        if key in _EXPERIENCE_KEYS:
            continue
        ours = _ours(key, value, known=known, roles=roles)
        if ours is None:
            ignored.append(key)
        for dotted, converted in ours or []:
            _put(data, dotted, converted)
    mapped = []
    if experience:
        enabled = any(_yes(value) for value in experience.values())
        _put(data, "experience.enabled", enabled)
        written = ", ".join(f"{key}: {json.dumps(value)}" for key, value in experience.items())
        mapped.append(
            f"{written} read as experience.enabled: {json.dumps(enabled)} "
            "(here one switch shows tips to the Planner and the CodeGenerator; it is on by default)"
        )
    return TaskWeaverSettings(data=data, ignored=tuple(ignored), mapped=tuple(mapped))


def _ours(key: str, value: Any, *, known: Callable[[str], bool], roles: Collection[str]) -> list[tuple[str, Any]] | None:
    if key in CONVERTED:
        return CONVERTED[key](value)
    name = RENAMED.get(key, key)
    if known(name):
        return [(name, value)]
    section, dot, _ = name.partition(".")
    if dot and section in roles and not known(section):  # a role's own key (`echo.decorator`): its section keeps it
        return [(name, value)]
    return None


def _session_roles(pairs: list[tuple[str, Any]]) -> list[str]:
    listed = next((value for key, value in pairs if key == "session.roles"), None)
    return [str(name) for name in listed] if isinstance(listed, list) else []


def _yes(value: Any) -> bool:
    return value is True or str(value).lower() in ("true", "yes", "1")


def _expanded(value: Any, *, path: Path, key: str) -> Any:
    """`${NAME}` in text (and in lists of text) replaced by the environment variable; `${AppBaseDir}` is the project folder."""
    if isinstance(value, list):
        return [_expanded(item, path=path, key=key) for item in value]
    if not isinstance(value, str):
        return value

    def variable(match: re.Match[str]) -> str:
        name = match.group(1)
        if name == "AppBaseDir":
            return str(path.parent)
        if name not in os.environ:
            raise ConfigError(f"{path}: key {key!r} uses ${{{name}}}, but the environment variable {name} is not set; set it, or write the value in the file")
        return os.environ[name]

    return _PLACEHOLDER.sub(variable, value)


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
