"""The role registry: every role declared once, found in one place, enabled by `session.roles`.

A role (`RoleSpec`) is its `name` (what `session.roles` lists and its folder is called), its
`alias` (what the Planner's `send_to` names and the conversation's posts carry), its `intro` (the
paragraph the Planner's prompt shows), its `key` (its config section, prompt and example files,
stored summary and model-call purpose; the name, except the CodeInterpreter's `code_generator`),
its `label` on screen, its own settings (`llm`, `strategy`, `prompt_compression`,
`rounds_to_compress`, `rounds_to_retain`, `examples`) and how to build it.

Roles come from three places, in this order (a later role with a taken name is broken, except
that a project's or package's role named like a built-in example, `echo` or `document_retriever`,
takes that one's place: a TaskWeaver project's own `echo` is listed once):
- built in: `planner` (the role the user talks to), `code_interpreter`, and, off by default, `echo` and
  `document_retriever` (answers from `PROJECT_DIR/docs/`);
- the project: `PROJECT_DIR/roles/<name>/<name>.role.yaml`, TaskWeaver's layout and keys (`alias`,
  `module`, `intro`), plus ours (`prompt` for a model-only role, the settings above; any other key
  is handed to the role as `tools.options`). `module: pkg.mod.ClassName` names the class; it is
  loaded from `<name>.py` beside the YAML when that file exists (TaskWeaver's module paths work
  unchanged), else imported. A TaskWeaver role class (`from taskweaver.role import Role`) runs
  unchanged through its adapter, `compat/taskweaver/role.py` (roles/adapters.py). Without `module`, `prompt` makes a model-only role (`ModelOnlyRole`);
- installed packages: the entry-point group `taskweaver_lite.roles`, each point a folder (or a
  function returning one) laid out like the project's `roles/`.

The class implements one method, `reply(request, tools) -> Post` (roles/worker.py says what each
holds); it is created once per session with no arguments. A broken role (a missing key, a class
that fails to import, an alias already taken) is an entry with its error, never an exception: the
session starts with the others and says why, in one line naming the file.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import importlib.util
import re
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import ValidationError

from taskweaver_lite.config.file import ROLES_FOLDER
from taskweaver_lite.config.settings import Config, RoleConfig
from taskweaver_lite.config.yaml_reader import parse_yaml
from taskweaver_lite.errors import ConfigError
from taskweaver_lite.plugins.extensions import extension_folders
from taskweaver_lite.records.conversation import USER
from taskweaver_lite.roles.adapters import role_adapters
from taskweaver_lite.roles.capabilities import KNOWN, unmet
from taskweaver_lite.roles.worker import ModelOnlyRole, RoleHandler

ENTRY_POINT_GROUP = "taskweaver_lite.roles"
# Built-in roles a project's role of the same name replaces (TaskWeaver's own, brought over); each keeps its config section.
REPLACEABLE = ("echo", "document_retriever")
ROLE_FILE_SUFFIX = ".role.yaml"
_ALIAS = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")
_NAME = re.compile(r"^[a-z][a-z0-9_]*$")
# The keys a role file may hold besides free options: TaskWeaver's, and ours.
_TASKWEAVER_KEYS = ("alias", "module", "intro")
_SETTINGS_KEYS = tuple(name for name in RoleConfig.model_fields)

# off: enabled, but it needs what this setup lacks; replaced: a built-in role whose name a project's role took
State = Literal["enabled", "disabled", "broken", "off", "replaced"]


class RoleProblem(ValueError):
    """A role file or class that cannot be used; `str()` names the key and what is wrong."""


@dataclass(frozen=True)
class RoleSpec:
    """One role, declared once: its names, its intro for the Planner, its settings, and how to build it."""

    name: str
    alias: str
    intro: str
    key: str = ""  # config section, prompts, examples, store and call purpose (default: the name)
    label: str = ""  # on screen (default: the alias)
    origin: str = "built-in"
    path: Path | None = None  # the role file
    prompt: str = ""  # a model-only role's system prompt (Jinja2)
    settings: dict[str, Any] = field(default_factory=dict)  # the role file's llm / compression keys
    options: dict[str, Any] = field(default_factory=dict)  # the role file's other keys
    handler: Callable[[], RoleHandler] | None = None  # builds the role's behaviour (None: built by the session, see `builtin`)
    builtin: str = ""  # a role the session builds from its own parts: "planner" or "code_interpreter"
    fold_prompt: str = "compression_worker"
    kernel_variables: bool = False  # its prompt lists the kernel's variables, and its folds describe them
    requires: tuple[str, ...] = ()  # capabilities it cannot work without (roles/capabilities.py): "vision", "fts5"

    def __post_init__(self) -> None:
        object.__setattr__(self, "key", self.key or self.name)
        object.__setattr__(self, "label", self.label or self.alias)

    @property
    def streams(self) -> bool:
        """Whether its replies stream to the screen field by field (the JSON roles the session builds)."""
        return bool(self.builtin)

    @property
    def where(self) -> str:
        """Where the role is declared, for messages: its file, or its origin."""
        return str(self.path) if self.path is not None else self.origin

    def section(self, project_section: RoleConfig) -> RoleConfig:
        """The role's settings: its file's keys, with those the project config sets over them."""
        if not self.settings:  # nothing in a role file (a built-in role): the section as it is, its own type kept
            return project_section
        given = project_section.model_dump(exclude_unset=True, exclude_none=True)
        merged = {**self.settings, **given}
        if isinstance(self.settings.get("llm"), dict) and "llm" in given:
            merged["llm"] = {**self.settings["llm"], **given["llm"]}
        return type(project_section).model_validate(merged)  # a role's own section type keeps its own keys


@dataclass(frozen=True)
class RoleEntry:
    """One role as `taskweaver-lite roles` lists it: its state, and the error when broken."""

    name: str
    where: str
    state: State
    error: str = ""
    spec: RoleSpec | None = None

    def line(self) -> str:
        """One line for people: a broken role names its file and the problem."""
        if self.state in ("off", "replaced"):
            return f"role {self.name} is {self.state}: {self.error}"
        if self.state == "broken":
            return f"role {self.name} ({self.where}): {self.error}; the session starts without it"
        return f"{self.name}: {self.state}"

    def to_dict(self) -> dict[str, Any]:
        """JSON shape: {name, alias, state, error, where, origin, intro}."""
        spec = self.spec
        return {
            "name": self.name,
            "alias": spec.alias if spec else "",
            "state": self.state,
            "error": self.error,
            "where": self.where,
            "origin": spec.origin if spec else "",
            "intro": spec.intro if spec else "",
        }


@dataclass(frozen=True)
class RoleCatalog:
    """Every role found, with its state; the enabled ones in `session.roles` order."""

    entries: tuple[RoleEntry, ...] = ()
    enabled: tuple[RoleSpec, ...] = ()
    requested: tuple[str, ...] = ()  # session.roles as written

    @property
    def broken(self) -> tuple[RoleEntry, ...]:
        """The roles left out, each with its reason (including names in session.roles that name no role)."""
        return tuple(e for e in self.entries if e.state in ("broken", "off"))

    @property
    def problems(self) -> list[str]:
        """One line per role session.roles asks for that is left out: its file (or session.roles) and why."""
        return [entry.line() for entry in self.broken if entry.name in self.requested]

    @property
    def entry(self) -> RoleSpec | None:
        """The enabled role the user talks to (the Planner), if enabled."""
        return next((spec for spec in self.enabled if spec.builtin == "planner"), None)

    @property
    def recipients(self) -> tuple[str, ...]:
        """What the entry role may send to: every other enabled role's alias, and the User."""
        return (*(spec.alias for spec in self.enabled if spec.builtin != "planner"), USER)

    def by_alias(self, alias: str) -> RoleSpec | None:
        """The enabled role with this alias."""
        return next((spec for spec in self.enabled if spec.alias == alias), None)

    def find(self, name: str) -> RoleEntry | None:
        """The entry with this name."""
        return next((e for e in self.entries if e.name == name), None)

    def check_names(self) -> None:
        """ConfigError when `session.roles` names a role that exists nowhere (a typo): one line with the closest name.

        A role that exists but is broken only warns (the session goes on without it); a name that is
        no role at all would run a session missing what was meant, so it stops here, before any call.
        """
        known = sorted({e.name for e in self.entries if e.where != "session.roles"})
        for entry in self.entries:
            if entry.where == "session.roles" and entry.state == "broken":
                close = difflib.get_close_matches(entry.name, known, n=1, cutoff=0.6)
                hint = f"did you mean {close[0]!r}? " if close else ""
                raise ConfigError(f"session.roles: no role is called {entry.name!r}; {hint}known roles: {', '.join(known)} (taskweaver-lite roles lists them)")


def builtin_roles() -> tuple[RoleSpec, ...]:
    """The roles that ship with the package: the Planner, the CodeInterpreter, the echo example and the document retriever."""
    from taskweaver_lite.roles.document_retriever import DOCUMENT_RETRIEVER_INTRO, DocumentRetriever
    from taskweaver_lite.roles.echo import ECHO_INTRO, Echo

    return (
        RoleSpec(
            name="planner",
            alias="Planner",
            intro="Talks with the User, plans the request and delegates its steps.",
            builtin="planner",
            fold_prompt="compression_planner",
        ),
        RoleSpec(
            name="code_interpreter",
            alias="CodeInterpreter",
            key="code_generator",  # its section, prompts and examples keep TaskWeaver's names (project configs and examples use them)
            label="CodeGenerator",
            intro=_CODE_INTERPRETER_INTRO,
            builtin="code_interpreter",
            fold_prompt="compression_code_generator",
            kernel_variables=True,
        ),
        RoleSpec(name="echo", alias="Echo", intro=ECHO_INTRO, handler=Echo),
        RoleSpec(name="document_retriever", alias="DocumentRetriever", intro=DOCUMENT_RETRIEVER_INTRO, handler=DocumentRetriever, requires=("fts5",)),
    )


_CODE_INTERPRETER_INTRO = """\
- It writes and runs Python for your step in a persistent Jupyter kernel: variables, imports
  and loaded data stay for later steps and requests.
- pandas, numpy and matplotlib are installed. Plots are saved as image files whose paths come
  back to you. Files are read by their name in the working folder.
- It reports what the code printed and returned, any error, and the variables it created or
  changed; failing code is retried before it reports.
- Send one clear, self-contained step at a time, naming the data, columns and variables to use."""


def discover_roles(project_dir: Path, *, enabled: Sequence[str], config: Config | None = None) -> RoleCatalog:
    """Every role for this project (built in, the project's, installed packages'), `enabled` picking the active ones."""
    found: list[RoleEntry] = []
    folders, broken = _folders(project_dir)
    for folder, origin in folders:
        for role_dir in sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith((".", "_"))):
            found.append(read_entry(role_dir, origin=origin))
    # A project's own `echo` or `document_retriever` (TaskWeaver's, brought over) takes the place of the built-in
    # role of that name, listed once; a broken one too (the session must not run another class than the one
    # asked for), and then the built-in one is still listed, as replaced, saying how to have it back.
    replacing = {entry.name: entry for entry in found}
    builtin = [RoleEntry(spec.name, spec.origin, "disabled", spec=spec) for spec in builtin_roles() if spec.builtin or spec.name not in replacing]
    catalog = _enable(_unique(builtin + found + broken), enabled, config=config)
    shadowed = tuple(
        RoleEntry(
            spec.name,
            spec.origin,
            "replaced",
            f"the project's {replacing[spec.name].where}, broken, takes its place; remove that folder to use this one",
            spec=spec,
        )
        for spec in builtin_roles()
        if not spec.builtin and spec.name in replacing and replacing[spec.name].state == "broken"
    )
    return dataclasses.replace(catalog, entries=catalog.entries + shadowed)


def _folders(project_dir: Path) -> tuple[list[tuple[Path, str]], list[RoleEntry]]:
    """Role folders, project first; entry points that fail to give one become broken entries."""
    folders, broken = extension_folders(project_dir / ROLES_FOLDER, group=ENTRY_POINT_GROUP)
    return folders, [RoleEntry(b.name, b.where, "broken", b.problem) for b in broken]


def _unique(entries: Iterable[RoleEntry]) -> list[RoleEntry]:
    """The first role with a name or an alias keeps it; a later one is broken, naming the first."""
    names: dict[str, str] = {}
    aliases: dict[str, str] = {}
    kept: list[RoleEntry] = []
    for entry in entries:
        spec = entry.spec
        if spec is not None and entry.name in names:
            entry = RoleEntry(entry.name, entry.where, "broken", f"the name {entry.name!r} is already taken by {names[entry.name]}")
        elif spec is not None and spec.alias in aliases:
            entry = RoleEntry(entry.name, entry.where, "broken", f"alias {spec.alias!r} is already the alias of {aliases[spec.alias]}: give it another")
        elif spec is not None:
            names[entry.name] = aliases[spec.alias] = f"{spec.name} ({spec.where})"
        kept.append(entry)
    return kept


def _enable(entries: list[RoleEntry], enabled: Sequence[str], *, config: Config | None) -> RoleCatalog:
    """Mark the roles `session.roles` lists as enabled, in its order; a name that is no usable role is reported."""
    by_name = {e.name: e for e in entries if e.spec is not None}
    active: list[RoleSpec] = []
    problems: list[RoleEntry] = []
    for name in dict.fromkeys(enabled):
        entry = by_name.get(name)
        off = unmet(entry.spec.requires, config=config, key=entry.spec.key) if entry is not None and entry.spec and config else None
        if entry is not None and off is not None:
            problems.append(RoleEntry(entry.name, entry.where, "off", off, spec=entry.spec))
        elif entry is not None and entry.spec is not None:
            active.append(entry.spec)
        elif not any(e.name == name for e in entries):
            known = ", ".join(sorted(by_name)) or "none"
            problems.append(RoleEntry(name, "session.roles", "broken", f"no role is called {name!r}; known roles: {known}"))
    on = {spec.name for spec in active}
    unavailable = {e.name for e in problems}
    marked = [RoleEntry(e.name, e.where, "enabled", spec=e.spec) if e.name in on and e.spec is not None else e for e in entries if e.name not in unavailable]
    return RoleCatalog(entries=tuple(marked + problems), enabled=tuple(active), requested=tuple(enabled))


def read_entry(role_dir: Path, *, origin: str = "project") -> RoleEntry:
    """One role folder read and checked; a problem makes it a broken entry, never an exception."""
    path = role_dir / f"{role_dir.name}{ROLE_FILE_SUFFIX}"
    try:
        spec = read_spec(path, origin=origin)
    except RoleProblem as problem:
        return RoleEntry(role_dir.name, str(path), "broken", str(problem))
    return RoleEntry(spec.name, str(path), "disabled", spec=spec)


def read_spec(path: Path, *, origin: str = "project") -> RoleSpec:
    """Read one `<name>/<name>.role.yaml` and load its class; RoleProblem says what is wrong."""
    name = path.name.removesuffix(ROLE_FILE_SUFFIX)
    if not _NAME.match(name):
        raise RoleProblem(f"the folder name {name!r} may only hold lower-case letters, digits and _ (it is the role's name)")
    if name in Config.model_fields and name not in REPLACEABLE:  # its section would be that one's (`llm:`, `code_generator:`...)
        raise RoleProblem(f"the name {name!r} is already a section of taskweaver_config.yaml; rename the folder and its files")
    data = _load_yaml(path)
    alias = _text(data, "alias", required=True)
    if not _ALIAS.match(alias) or alias == USER:
        raise RoleProblem(f"key 'alias': {alias!r} must be a word of letters, digits and _ (and not {USER!r})")
    intro = _text(data, "intro", required=True).strip()
    module, prompt = _text(data, "module"), _text(data, "prompt")
    if not module and not prompt:
        raise RoleProblem("key 'module' is missing (the role's class, e.g. module: my_role.MyRole in my_role.py), or give a 'prompt' for a model-only role")
    settings = {key: data[key] for key in _SETTINGS_KEYS if key in data}
    try:
        RoleConfig.model_validate(settings)
    except ValidationError as exc:
        err = exc.errors()[0]
        raise RoleProblem(f"key '{'.'.join(map(str, err['loc']))}': {err['msg'].lower()}") from None
    return RoleSpec(
        name=name,
        alias=alias,
        intro=intro,
        origin=origin,
        path=path,
        prompt=prompt,
        settings=settings,
        options={k: v for k, v in data.items() if k not in (*_TASKWEAVER_KEYS, "prompt", "requires", *_SETTINGS_KEYS)},
        requires=_requires(data),
        handler=load_class(module, folder=path.parent, name=name, alias=alias, intro=intro) if module else ModelOnlyRole,
    )


def load_class(module: str, *, folder: Path, name: str, alias: str = "", intro: str = "") -> Callable[[], RoleHandler]:
    """The class `module` names (`pkg.mod.ClassName`): from `<name>.py` in `folder` when there, else imported.

    A class of another framework (TaskWeaver's `taskweaver.role.Role`) is run by that framework's adapter (roles/adapters.py).
    """
    path, _, class_name = module.rpartition(".")
    if not path or not class_name:
        raise RoleProblem(f"key 'module': {module!r} must name a class as module.ClassName (e.g. {name}.{name.title().replace('_', '')})")
    source = folder / f"{name}.py"
    for adapter in role_adapters():
        adapter.prepare()  # TaskWeaver's role files import taskweaver.role, taskweaver.memory...: they resolve to ours
    try:
        loaded = _load_file(source, name) if source.is_file() else importlib.import_module(path)
    except Exception as exc:  # noqa: BLE001 - whatever a role's module raises on import, the session starts without it
        where = source if source.is_file() else path
        problem = _import_problem(exc) if isinstance(exc, ImportError) else None
        why = problem or f"{type(exc).__name__}: {exc}"
        raise RoleProblem(f"the class could not be imported from {where} ({why})") from None
    cls = getattr(loaded, class_name, None)
    if not isinstance(cls, type):
        raise RoleProblem(f"key 'module': {loaded.__name__} has no class {class_name!r}")
    for adapter in role_adapters():
        try:
            adapted = adapter.adapt(cls, name=name, alias=alias, intro=intro)
        except ValueError as exc:
            raise RoleProblem(str(exc)) from None
        if adapted is not None:
            return adapted
    if not callable(getattr(cls, "reply", None)):
        raise RoleProblem(f"class {class_name} has no method reply(self, request, tools) -> Post")
    handler: Callable[[], RoleHandler] = cls
    return handler


def _import_problem(exc: ImportError) -> str | None:
    """One line for an import a role file could not make: a framework's adapter explains its own, else a missing package is named."""
    problem = next((found for adapter in role_adapters() if (found := adapter.import_problem(exc))), None)
    if problem is None and isinstance(exc, ModuleNotFoundError) and exc.name:
        return f"it needs the package {exc.name.split('.')[0]}, which is not installed here"
    return problem


def _load_file(source: Path, name: str) -> Any:
    """Import a role's own Python file under a private module name (two projects' `echo.py` do not clash)."""
    module_name = f"taskweaver_lite_role_{name}_{abs(hash(str(source.resolve())))}"
    spec = importlib.util.spec_from_file_location(module_name, source)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {source}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[module_name]
        raise
    return module


def _load_yaml(path: Path) -> dict[str, Any]:
    try:
        data = parse_yaml(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise RoleProblem(f"no role file: expected {path.name} in {path.parent}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise RoleProblem(f"cannot be read ({exc})") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise RoleProblem(f"is not valid YAML{where} ({getattr(exc, 'problem', None) or exc})") from None
    if not isinstance(data, dict):
        raise RoleProblem("must be a YAML mapping with at least 'alias', 'intro' and 'module' (or 'prompt')")
    return data


def _requires(data: dict[str, Any]) -> tuple[str, ...]:
    """The role file's `requires`: a capability or a list of them (roles/capabilities.py knows which)."""
    value = data.get("requires") or []
    needs = [value] if isinstance(value, str) else value
    if not isinstance(needs, list) or not all(isinstance(n, str) for n in needs):
        raise RoleProblem(f"key 'requires' must be a list of capabilities such as [vision]; known: {', '.join(KNOWN)}")
    return tuple(needs)


def _text(data: dict[str, Any], key: str, *, required: bool = False) -> str:
    value = data.get(key)
    if value is None:
        if required:
            raise RoleProblem(f"key {key!r} is missing")
        return ""
    if not isinstance(value, str):
        raise RoleProblem(f"key {key!r} must be text, not {type(value).__name__}")
    return value
