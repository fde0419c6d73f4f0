"""TaskWeaver's own `taskweaver_config.json` read as our settings, for a project brought over as it is.

TaskWeaver keeps flat dotted keys (`"llm.api_key": ...`, `"round_compressor.rounds_to_retain": 3`),
sometimes nested one level (`"code_interpreter": {...}`). Keys we have under the same name are
taken as they are, a few are renamed or converted, a role's own keys (`"echo.decorator"`, for a
role in `roles/` or `session.roles`) go to that role's section, and the rest (logging, embeddings,
example folders...) are listed so the user knows they have no effect here.

As in TaskWeaver, the environment comes before the file: each key is read from its variable
spelled KEY_UPPER_WITH_UNDERSCORES (`LLM_API_BASE` for `llm.api_base`) when that is set, our keys
and TaskWeaver's names alike ("null", "none" or "nil" there mean null; a list is comma-separated).
Which variables were read is said in one line, and each value's origin is kept for `config --show`.

`${NAME}` in a text value is the environment variable NAME (`"llm.api_key": "${OPENAI_API_KEY}"`);
TaskWeaver's `${AppBaseDir}` is the project folder, and so is `${ModuleBaseDir}` (TaskWeaver's own
package folder, which has no counterpart here). An unset variable stops loading with a line
naming the file, the key and the variable. `planner.use_experience` and
`code_generator.use_experience` become `experience.enabled` (one switch for both roles here, on by
default), said in one line. `"llm.api_type": "azure"` is spoken through Azure's OpenAI-compatible
v1 API (`<endpoint>/openai/v1`, the key as `llm.api_key`, the deployment as `llm.model`).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

from taskweaver_lite.config.sources import env_name, from_env, from_file
from taskweaver_lite.config.yaml_reader import parse_yaml
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
    # json_object asks for JSON replies: here the role's schema where the endpoint takes one (auto); "text" or null: off.
    "llm.response_format": lambda value: [("llm.structured", "auto" if value == "json_object" else "off")],
    # The OpenAI wire is the only one spoken; "openai" says nothing new.
    "llm.api_type": lambda value: [] if value in (None, "openai") else None,
    # TaskWeaver's container mode isolates the kernel; the sandbox is how this program does that.
    "execution_service.kernel_mode": lambda value: {"local": [], "container": [("execution.sandbox", "bubblewrap")]}.get(str(value)),
    # TaskWeaver's retriever reads a FAISS index; the built-in one indexes the folder's documents itself.
    "document_retriever.index_folder": lambda value: [("document_retriever.folder", value)] if isinstance(value, str) else None,
}


@dataclass(frozen=True)
class TaskWeaverSettings:
    """The file's keys as our nested settings, where each came from, and the keys that have no effect here."""

    data: dict[str, Any]
    ignored: tuple[str, ...]
    mapped: tuple[str, ...] = ()  # keys read with another meaning, each said in a line
    origins: dict[str, str] = field(default_factory=dict)  # our dotted key -> "file PATH" or "env NAME"

    def notices(self, path: Path) -> list[str]:
        """The lines telling the user what was mapped, what the environment set, and which keys were not used."""
        lines = [f"{path}: {line}" for line in self.mapped]
        read = sorted({origin.removeprefix("env ") for origin in self.origins.values() if origin.startswith("env ")})
        if read:
            lines.append(f"{path}: read from the environment, over the file (TaskWeaver's rule): {', '.join(read)}")
        if self.ignored:
            lines.append(f"{path}: TaskWeaver settings with no effect here, ignored: {', '.join(self.ignored)}")
        return lines


@dataclass(frozen=True)
class Environment:
    """The variables a JSON project reads (`variables`), the dotted keys to look up there, and how a key's value is typed."""

    variables: Mapping[str, str]
    keys: Collection[str] = ()  # our keys and the role sections' keys; TaskWeaver's own names are added
    kind: Callable[[str], str] = lambda key: "value"  # "list", "mapping" or "value", for the text a variable holds


def read_taskweaver_json(
    path: Path, *, known: Callable[[str], bool], role_folders: Collection[str] = (), environment: Environment | None = None
) -> TaskWeaverSettings:
    """Read TaskWeaver's JSON config (under `environment`'s variables); `known(dotted_key)` says whether we have that key."""
    try:
        loaded = json.loads(path.read_text(encoding="utf-8-sig"))
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}, line {exc.lineno}: not valid JSON ({exc.msg}); fix the syntax") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not UTF-8; save the file as UTF-8") from None
    if not isinstance(loaded, dict):
        raise ConfigError(f'{path}: expected one JSON object of settings ("llm.model": ...)')
    written = {key: (_expanded(value, path=path, key=key), from_file(path)) for key, value in _flat(loaded)}
    given = {**written, **_from_environment(environment, written, path=path, roles=role_folders)}
    mapped = [*_azure(given), *_module_base(loaded), *_index_folder(given)]
    roles = {*role_folders, *_session_roles(given)}
    data: dict[str, Any] = {}
    origins: dict[str, str] = {}
    ignored: list[str] = []
    for key, (value, origin) in given.items():
        if key in _EXPERIENCE_KEYS:
            continue
        ours = _ours(key, value, known=known, roles=roles)
        if ours is None:
            ignored.append(key)
        for dotted, converted in ours or []:
            _put(data, dotted, converted)
            origins[dotted] = origin
    experience = {key: value for key, (value, _) in given.items() if key in _EXPERIENCE_KEYS}
    if experience:
        enabled = any(_yes(value) for value in experience.values())
        _put(data, "experience.enabled", enabled)
        origins["experience.enabled"] = next(origin for key, (_, origin) in given.items() if key in _EXPERIENCE_KEYS)
        said = ", ".join(f"{key}: {json.dumps(value)}" for key, value in experience.items())
        mapped.append(
            f"{said} read as experience.enabled: {json.dumps(enabled)} (here one switch shows tips to the Planner and the CodeGenerator; it is on by default)"
        )
    return TaskWeaverSettings(data=data, ignored=tuple(ignored), mapped=tuple(mapped), origins=origins)


def _index_folder(given: Mapping[str, tuple[Any, str]]) -> list[str]:
    """The line saying what document_retriever.index_folder became."""
    if "document_retriever.index_folder" not in given:
        return []
    folder = given["document_retriever.index_folder"][0]
    return [
        f"document_retriever.index_folder: {json.dumps(folder)} read as document_retriever.folder: the built-in retriever indexes "
        "the documents in that folder itself (TaskWeaver's FAISS index files there are not read; put the documents there, or set "
        "document_retriever.folder to where they are)"
    ]


def _from_environment(environment: Environment | None, written: Mapping[str, Any], *, path: Path, roles: Collection[str]) -> dict[str, tuple[Any, str]]:
    """Each key whose KEY_UPPER_WITH_UNDERSCORES variable is set: its value from there, and that variable as its origin."""
    if environment is None:
        return {}
    names = {*written, *environment.keys, *RENAMED, *CONVERTED, *_EXPERIENCE_KEYS, *_AZURE_KEYS}
    found: dict[str, tuple[Any, str]] = {}
    taken: set[str] = set()
    for key in sorted(names, key=lambda key: (key not in written, key)):  # a key the file names claims its variable first
        variable = env_name(key)
        if variable in taken or variable not in environment.variables:
            continue
        taken.add(variable)
        found[key] = (_typed(environment.variables[variable], kind=environment.kind(RENAMED.get(key, key)), variable=variable, path=path), from_env(variable))
    return found


def _typed(text: str, *, kind: str, variable: str, path: Path) -> Any:
    """A variable's text as a setting's value, read as TaskWeaver reads it: null words, comma-separated lists."""
    if text.strip().lower() in _NULL_WORDS:
        return None
    if kind == "value":
        return text
    if kind == "list" and not text.lstrip().startswith("["):
        return [item.strip() for item in text.split(",") if item.strip()]
    try:
        return parse_yaml(text)
    except yaml.YAMLError:
        raise ConfigError(f"environment variable {variable} (read for {path.name}): expected a {kind} in JSON, such as {_EXAMPLES[kind]}") from None


_NULL_WORDS = ("null", "none", "nil")
_EXAMPLES = {"list": '["a", "b"] or a,b', "mapping": '{"name": "value"}'}
_AZURE_KEYS = ("llm.api_type", "llm.api_version")
AZURE_PATH = "/openai/v1"


def _azure(given: dict[str, tuple[Any, str]]) -> list[str]:
    """`llm.api_type` azure: the endpoint becomes Azure's OpenAI-compatible v1 API; an Entra ID login is refused in one line."""
    kind, origin = given.get("llm.api_type", (None, ""))
    if kind == "azure_ad":
        raise ConfigError(
            f'llm.api_type "azure_ad" ({origin}): an Entra ID login is not made here; use the resource\'s API key: "llm.api_type": "azure" '
            'and "llm.api_key" (or put a token from `az account get-access-token --resource https://cognitiveservices.azure.com` in llm.api_key)'
        )
    if kind != "azure":
        return []
    del given["llm.api_type"]
    given.pop("llm.api_version", None)  # the v1 API takes no api-version
    base, base_origin = given.get("llm.api_base", (None, ""))
    if not isinstance(base, str) or not base.startswith(("http://", "https://")):
        raise ConfigError('llm.api_type "azure" needs "llm.api_base": the resource\'s endpoint, such as https://NAME.openai.azure.com/')
    parts = urlsplit(base)
    endpoint = f"{parts.scheme}://{parts.netloc}{AZURE_PATH}"
    given["llm.api_base"] = (endpoint, base_origin)
    return [
        f'llm.api_type "azure": calls go to Azure\'s OpenAI-compatible v1 API at {endpoint}, with llm.api_key as the key and llm.model as the deployment name'
    ]


def _module_base(loaded: Mapping[str, Any]) -> list[str]:
    """The line saying how `${ModuleBaseDir}` was read, when the file uses it."""
    if "${ModuleBaseDir}" not in json.dumps(loaded):
        return []
    return ["${ModuleBaseDir} (TaskWeaver's own package folder) is read as the project folder"]


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


def _session_roles(given: Mapping[str, tuple[Any, str]]) -> list[str]:
    listed = given.get("session.roles", (None, ""))[0]
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
        if name in ("AppBaseDir", "ModuleBaseDir"):
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
