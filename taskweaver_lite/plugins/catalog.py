"""Plugin specs: TaskWeaver's `<name>.yaml` + `<code>.py`, found, validated, and listed with their state.

Plugins come from `PROJECT_DIR/plugins/*.yaml` and from installed packages that name a folder of
them in the entry-point group `taskweaver_lite.plugins` (so a team can `pip install` its plugins).
Validation happens here, in our process and without importing the plugin's code: the YAML, its
fields, the code file, and that the code parses. Importing it is the kernel's job
(`kernel/plugin_runtime.py`); a failure there is reported on the first cell's result.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml

from taskweaver_lite.config.yaml_reader import parse_yaml, yaml_bounds_problem
from taskweaver_lite.plugins.extensions import extension_folders
from taskweaver_lite.records.plugin_spec import Parameter, PluginSpec

ENTRY_POINT_GROUP = "taskweaver_lite.plugins"
PLUGIN_FOLDER = "plugins"
_NAME = re.compile(r"^[A-Za-z0-9_]+$")
_KNOWN_FIELDS = {
    "name", "code", "enabled", "required", "plugin_only", "description", "examples",
    "parameters", "returns", "configurations",
}  # fmt: skip
_PARAMETER_FIELDS = {"name", "type", "required", "description", "default"}

State = Literal["enabled", "disabled", "broken"]


@dataclass(frozen=True)
class PluginEntry:
    """One plugin file as `taskweaver-lite plugins` lists it: its state, and the error if broken."""

    name: str
    path: Path
    state: State
    error: str = ""
    spec: PluginSpec | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON shape: {name, file, state, error, description, origin}."""
        return {
            "name": self.name,
            "file": str(self.path),
            "state": self.state,
            "error": self.error,
            "description": self.spec.description if self.spec else "",
            "origin": self.spec.origin if self.spec else "",
        }

    def line(self) -> str:
        """One line for people: the problem of a broken plugin names its file."""
        if self.state == "broken":
            return f"plugin {self.path}: {self.error}; the session starts without it"
        return f"{self.name}: {self.state}"


class PluginProblem(ValueError):
    """A plugin spec that cannot be used; `str()` names the field and what is wrong."""


@dataclass(frozen=True)
class PluginCatalog:
    """Every plugin found for a project, in order: project first, then installed packages."""

    entries: tuple[PluginEntry, ...] = ()

    @property
    def enabled(self) -> tuple[PluginSpec, ...]:
        """The plugins a session loads and shows."""
        return tuple(e.spec for e in self.entries if e.state == "enabled" and e.spec is not None)

    @property
    def broken(self) -> tuple[PluginEntry, ...]:
        """The plugins left out, with their errors."""
        return tuple(e for e in self.entries if e.state == "broken")


def discover(project_dir: Path) -> PluginCatalog:
    """The project's plugins and those of installed packages; a project plugin wins a name clash."""
    folders, entries = _folders(project_dir)
    seen: dict[str, Path] = {}
    for folder, origin in folders:
        for path in sorted(folder.glob("*.yaml")) + sorted(folder.glob("*.yml")):
            entry = read_entry(path, origin=origin)
            if entry.state != "broken" and entry.name in seen:
                entry = PluginEntry(entry.name, path, "broken", f"the name {entry.name!r} is already taken by {seen[entry.name]}")
            elif entry.state != "broken":
                seen[entry.name] = path
            entries.append(entry)
    return PluginCatalog(tuple(entries))


def _folders(project_dir: Path) -> tuple[list[tuple[Path, str]], list[PluginEntry]]:
    """Plugin folders, project first; entry points that fail to give one become broken entries."""
    folders, broken = extension_folders(project_dir / PLUGIN_FOLDER, group=ENTRY_POINT_GROUP)
    return folders, [PluginEntry(b.name, Path(b.where), "broken", b.problem) for b in broken]


def read_entry(path: Path, *, origin: str = "project") -> PluginEntry:
    """One YAML file read and checked; a problem makes it a broken entry, never an exception."""
    try:
        spec = read_spec(path, origin=origin)
    except PluginProblem as problem:
        return PluginEntry(path.stem, path, "broken", str(problem))
    return PluginEntry(spec.name, path, "enabled" if spec.enabled else "disabled", spec=spec)


def read_spec(path: Path, *, origin: str = "project") -> PluginSpec:
    """Read and validate one plugin YAML and check its code file; PluginProblem says what is wrong."""
    data = _load_yaml(path)
    name = _text(data, "name", required=True)
    if not _NAME.match(name):
        raise PluginProblem(f"field 'name': {name!r} may only hold letters, digits and _")
    code = _text(data, "code") or name
    source = path.parent / f"{code}.py"
    enabled = _flag(data, "enabled", default=True)
    if enabled:
        _check_source(source)
    return PluginSpec(
        name=name,
        code=code,
        description=_text(data, "description", required=True).strip(),
        yaml_path=path,
        source_path=source,
        enabled=enabled,
        required=_flag(data, "required", default=False),
        plugin_only=_flag(data, "plugin_only", default=False),
        examples=_text(data, "examples").strip(),
        parameters=_parameters(data, "parameters"),
        returns=_parameters(data, "returns"),
        configurations=_mapping(data, "configurations"),
        origin=origin,
    )


def _load_yaml(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
        problem = yaml_bounds_problem(text)  # too big, too deep, an alias bomb: said before PyYAML builds it
        if problem is not None:
            raise PluginProblem(f"is {problem}" if problem[0].isdigit() else f"is not loaded: {problem}")
        data = parse_yaml(text)
    except OSError as exc:
        raise PluginProblem(f"cannot be read ({exc.strerror or exc})") from None
    except UnicodeDecodeError:
        raise PluginProblem("is not UTF-8 text") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise PluginProblem(f"is not valid YAML{where} ({getattr(exc, 'problem', None) or exc})") from None
    if not isinstance(data, dict):
        raise PluginProblem("must be a YAML mapping with at least 'name' and 'description'")
    unknown = sorted(set(map(str, data)) - _KNOWN_FIELDS)
    if unknown:
        raise PluginProblem(f"unknown field {unknown[0]!r} (known: {', '.join(sorted(_KNOWN_FIELDS))})")
    return data


def _check_source(source: Path) -> None:
    try:
        text = source.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise PluginProblem(f"field 'code': the file {source} does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise PluginProblem(f"field 'code': the file {source} cannot be read ({exc})") from None
    try:
        ast.parse(text, filename=str(source))
    except SyntaxError as exc:
        raise PluginProblem(f"{source} line {exc.lineno}: syntax error ({exc.msg})") from None


def _text(data: dict[str, Any], key: str, *, required: bool = False) -> str:
    value = data.get(key)
    if value is None:
        if required:
            raise PluginProblem(f"field {key!r} is missing")
        return ""
    if isinstance(value, bool):
        # YAML 1.1 reads on/off/yes/no as booleans: `name: off` is not the text "off".
        raise PluginProblem(f"field {key!r} must be text, not {value}; put quotes around it")
    if not isinstance(value, str):
        raise PluginProblem(f"field {key!r} must be text, not {type(value).__name__}")
    return value


def _flag(data: dict[str, Any], key: str, *, default: bool) -> bool:
    value = data.get(key, default)
    if not isinstance(value, bool):
        raise PluginProblem(f"field {key!r} must be true or false, not {value!r}")
    return value


def _mapping(data: dict[str, Any], key: str) -> dict[str, Any]:
    value = data.get(key) or {}
    if not isinstance(value, dict):
        raise PluginProblem(f"field {key!r} must be a mapping of settings")
    try:
        json.dumps(value)  # it travels to the kernel as JSON
    except (TypeError, ValueError):
        raise PluginProblem(f"field {key!r} may only hold plain values (text, numbers, lists, mappings)") from None
    return value


def _parameters(data: dict[str, Any], key: str) -> tuple[Parameter, ...]:
    items = data.get(key) or []
    if not isinstance(items, list):
        raise PluginProblem(f"field {key!r} must be a list of {{name, type, required, description}}")
    return tuple(_parameter(item, f"{key}[{index}]") for index, item in enumerate(items))


def _parameter(item: Any, where: str) -> Parameter:
    if not isinstance(item, dict):
        raise PluginProblem(f"field {where!r} must be a mapping with name, type, required, description")
    unknown = sorted(set(map(str, item)) - _PARAMETER_FIELDS)
    if unknown:
        raise PluginProblem(f"field '{where}.{unknown[0]}' is unknown (known: {', '.join(sorted(_PARAMETER_FIELDS))})")
    name = _text(item, "name", required=True) if "name" in item else ""
    if not name.isidentifier():
        raise PluginProblem(f"field '{where}.name': {name!r} is not a Python name")
    return Parameter(
        name=name,
        type=_text(item, "type") or "Any",
        required=_flag(item, "required", default=False),
        description=_text(item, "description").strip(),
        default=item.get("default"),
        has_default="default" in item,
    )


def entries_as_json(entries: Iterable[PluginEntry]) -> str:
    """`taskweaver-lite plugins --json`: one JSON array."""
    return json.dumps([e.to_dict() for e in entries], indent=2)
