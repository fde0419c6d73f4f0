"""The project's config file: `PROJECT_DIR/taskweaver_config.yaml` (or TaskWeaver's JSON) read into one `Config`.

YAML is read within bounds (size, depth, aliases). `--set a.b=value` overrides are parsed as YAML and
applied before validation, so they are checked exactly like the file. Errors name the file, the
key, its line and what was expected, on one line.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import UnionType
from typing import Any, Union, get_args, get_origin

import yaml
from pydantic import BaseModel, SecretStr, ValidationError
from pydantic_core import ErrorDetails

from taskweaver_lite.config.settings import Config, RoleConfig, RoleSectionConfig
from taskweaver_lite.config.sources import SET, ConfigSources, env_name, flat_keys, from_file
from taskweaver_lite.config.store_url import redact
from taskweaver_lite.config.taskweaver_json import JSON_FILE_NAME, Environment, read_taskweaver_json
from taskweaver_lite.config.yaml_reader import YAML_MAX_CHARS, load_yaml, parse_yaml
from taskweaver_lite.errors import ConfigError

CONFIG_FILE_NAME = "taskweaver_config.yaml"


ROLES_FOLDER = "roles"
_ROLE_SECTIONS = "role_sections"


def role_names(project: Path, data: dict[str, Any]) -> set[str]:
    """Names whose top-level section is a role's: the project's role folders and the roles `session.roles` lists."""
    folder = project / ROLES_FOLDER
    names = {p.name for p in folder.iterdir() if p.is_dir()} if folder.is_dir() else set()
    listed = data.get("session", {}).get("roles") if isinstance(data.get("session"), dict) else None
    if isinstance(listed, list):
        names.update(str(name) for name in listed)
    return names - set(Config.model_fields)


def load_config(project_dir: str | Path = "project", overrides: list[str] | None = None, *, environ: Mapping[str, str] | None = None) -> Config:
    """Read the project's config file, apply `KEY=VALUE` overrides, and validate once.

    A TaskWeaver JSON project also reads `environ` (default: this process's environment) as TaskWeaver
    does, between the file and the overrides (config/sources.py says why a YAML project does not).
    """
    project = Path(project_dir)
    path = project / CONFIG_FILE_NAME
    environ = os.environ if environ is None else environ
    if not project.is_dir():
        raise ConfigError(f"{project}: project folder not found; create one with `taskweaver-lite init {project}`")
    data: dict[str, Any] = {}
    notices: list[str] = []
    origins: dict[str, str] = {}
    reads_environment = not path.exists() and (project / JSON_FILE_NAME).exists()
    if reads_environment:
        path, data, notices, origins = _taskweaver_json(project / JSON_FILE_NAME, environ=environ)
    elif path.exists():
        data = _yaml_settings(path)
        origins = dict.fromkeys(flat_keys(data), from_file(path))
    data.pop(_ROLE_SECTIONS, None)  # not a key of the file: role sections are written at the top level
    for item in overrides or []:  # `--set session.roles=[...]` first: it decides which sections are roles'
        if item.partition("=")[0].strip() == "session.roles":
            _apply_override(data, item, roles=set())
    roles = role_names(project, data)
    unknown = [problem for item in overrides or [] if (problem := _apply_override(data, item, roles=roles))]
    if unknown:
        raise ConfigError("; ".join(unknown))
    for item in overrides or []:
        key = item.partition("=")[0].strip()
        origins = {dotted: origin for dotted, origin in origins.items() if not f"{dotted}.".startswith(f"{key}.")}
        origins[key] = SET
    data[_ROLE_SECTIONS] = {name: data.pop(name) for name in sorted(roles) if name in data}
    try:
        config = Config.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_describe(exc, path, overrides or [], origins=origins)) from None
    config.project_dir = project
    config.notices.extend(notices)
    config.sources = ConfigSources(file=path if path.exists() else None, reads_environment=reads_environment, origins=origins, overrides=tuple(overrides or ()))
    if not reads_environment:
        config.notices.extend(unread_variables(config, environ=environ))
    return config


def _yaml_settings(path: Path) -> dict[str, Any]:
    """The YAML file's mapping of sections; ConfigError naming the file and line when it is not one."""
    text = _read_text(path)
    try:
        loaded = load_yaml(text, source=path)
    except yaml.YAMLError as exc:
        raise ConfigError(missing_colon(path, text, exc) or f"{path}: not valid YAML: {_yaml_problem(exc)}; fix the syntax") from None
    if loaded is not None and not isinstance(loaded, dict):
        raise ConfigError(f"{path}: expected a mapping of sections (llm:, planner:, ...) at the top")
    return loaded or {}


def _taskweaver_json(path: Path, *, environ: Mapping[str, str]) -> tuple[Path, dict[str, Any], list[str], dict[str, str]]:
    """TaskWeaver's JSON config under the environment, mapped to our keys; errors from here on name that file."""
    roles = role_names(path.parent, {})
    keys = [*setting_keys(), *(f"{role}.{key}" for role in roles for key in setting_keys(RoleConfig))]
    environment = Environment(variables=environ, keys=keys, kind=_value_kind)
    settings = read_taskweaver_json(path, known=is_config_key, role_folders=roles, environment=environment)
    return path, settings.data, settings.notices(path), settings.origins


# The variables a YAML project is told about when they are set: TaskWeaver's names for the model settings.
_TOLD_VARIABLES = ("llm.api_base", "llm.api_key", "llm.model")


def unread_variables(config: Config, *, environ: Mapping[str, str]) -> list[str]:
    """One line per TaskWeaver `LLM_*` variable that is set and differs from what a YAML project uses: it is not read."""
    lines = []
    for key in _TOLD_VARIABLES:
        variable = env_name(key)
        value = environ.get(variable)
        used = getattr(config.llm, key.rpartition(".")[2])
        used = used.get_secret_value() if isinstance(used, SecretStr) else used
        if value is None or value == used:
            continue
        where = config.sources.file.name if config.sources.file is not None else "the defaults"
        lines.append(
            f"{variable} is set but not read: a YAML project takes {key} from {where} or --set "
            f"(TaskWeaver's variables are read by a taskweaver_config.json project only); to use it: --set {key}=${variable}"
        )
    return lines


def setting_keys(model: type[BaseModel] = Config, prefix: str = "") -> list[str]:
    """Every leaf setting's dotted key under `model` (`llm.model`, `execution.kernel_gateway.url`)."""
    keys = []
    for name, info in model.model_fields.items():
        if info.exclude or name in _NOT_KEYS:
            continue
        section = section_type(info.annotation)
        if isinstance(section, type) and issubclass(section, BaseModel):
            keys += setting_keys(section, f"{prefix}{name}.")
        else:
            keys.append(f"{prefix}{name}")
    return keys


def _value_kind(dotted: str) -> str:
    """What the text of `dotted`'s environment variable holds: a list, a mapping, or a value pydantic converts."""
    node: Any = Config
    annotation: Any = None
    for part in dotted.split("."):
        fields = getattr(node, "model_fields", None)
        if fields is None or part not in fields:
            return "value"
        annotation = fields[part].annotation
        node = section_type(annotation)
    origin = get_origin(annotation)
    kinds = {get_origin(arg) or arg for arg in get_args(annotation)} if origin is Union or origin is UnionType else {origin or annotation}
    return "list" if list in kinds else "mapping" if dict in kinds else "value"


def is_config_key(dotted: str) -> bool:
    """Whether `dotted` (`llm.model`, `execution.kernel_gateway.url`) names one of our settings."""
    node: Any = Config
    for part in dotted.split("."):
        fields = getattr(node, "model_fields", None)
        if fields is None or part not in fields or part in _NOT_KEYS:
            return False
        node = section_type(fields[part].annotation)
    return True


def key_description(dotted: str) -> str:
    """What the setting `dotted` means, from its field's description in the typed config ('' when it has none)."""
    node: Any = Config
    description = ""
    for part in dotted.split("."):
        fields = getattr(node, "model_fields", None)
        if fields is None or part not in fields:
            return ""
        description = fields[part].description or ""
        node = section_type(fields[part].annotation)
    return description


def _read_text(path: Path) -> str:
    """The config file's text; ConfigError naming the encoding problem if it is not UTF-8."""
    if path.stat().st_size > YAML_MAX_CHARS * 4:  # never read a huge file whole
        raise ConfigError(f"{path}: {path.stat().st_size:,} bytes, more than a taskweaver-lite YAML file may have; nothing was loaded")
    raw = path.read_bytes()
    if raw.startswith((b"\xff\xfe", b"\xfe\xff")):
        raise ConfigError(f"{path}: the file is UTF-16 encoded; save it as UTF-8")
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise ConfigError(
            f"{path}: line {line} is not UTF-8 (byte 0x{raw[exc.start]:02x} at offset {exc.start}, perhaps Latin-1); save the file as UTF-8"
        ) from None


def merge_overrides(earlier: Sequence[str], later: Sequence[str]) -> list[str]:
    """One `KEY=VALUE` per key, the later value winning, in the order the keys first appeared (what was set before, then anew)."""
    merged: dict[str, str] = {}
    for item in [*earlier, *later]:
        merged[item.partition("=")[0].strip()] = item
    return list(merged.values())


def _apply_override(data: dict[str, Any], item: str, *, roles: set[str]) -> str | None:
    """Put one `KEY=VALUE` into `data`; returns the problem when the key is unknown (all are reported together).

    A first part naming a role in `roles` is that role's section (`--set echo.llm.model=...`).
    """
    key, sep, raw = item.partition("=")
    key = key.strip()
    if not sep or not key:
        raise ConfigError(f"--set {item}: expected KEY=VALUE, for example --set llm.model=gpt-4o")
    try:
        value = parse_yaml(raw) if raw.strip() else ""
    except yaml.YAMLError as exc:
        # Taking the raw text instead would pass `[x` on as an address and fail later as a network error.
        raise ConfigError(f"--set {_masked(item)}: the value is not valid YAML ({_yaml_problem(exc)}); quote it: --set '{key}=\"...\"'") from None
    parts = key.split(".")
    node: Any = Config
    for number, part in enumerate(parts):
        fields = getattr(node, "model_fields", None)
        if number == 0 and part in roles:
            node = RoleSectionConfig
            continue
        if node is RoleSectionConfig and fields is not None and part not in fields:  # a role's own key (`echo.decorator`): the role reads it
            break
        if fields is None or part not in fields or part in _NOT_KEYS:
            return f"--set {key}: unknown config key '{part}'; known here: {_known(node)}"
        node = section_type(fields[part].annotation)
    target = data
    for part in parts[:-1]:
        child = target.get(part)
        if not isinstance(child, dict):
            child = {}
            target[part] = child
        target = child
    target[parts[-1]] = value
    return None


def section_type(annotation: Any) -> Any:
    """The settings class inside an optional section's type (`KernelGatewayConfig | None`), else the type itself."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    sections = [arg for arg in get_args(annotation) if isinstance(arg, type) and issubclass(arg, BaseModel)]
    return sections[0] if len(sections) == 1 else annotation


_NOT_KEYS = ("project_dir", _ROLE_SECTIONS)


def _known(node: Any) -> str:
    fields = getattr(node, "model_fields", {})
    return ", ".join(name for name in fields if name not in _NOT_KEYS) or "(none: this is a value)"


def _describe(exc: ValidationError, path: Path, overrides: list[str], *, origins: Mapping[str, str]) -> str:
    """Every problem pydantic found on one line: unknown keys grouped by section, then wrong values."""
    unknown: dict[tuple[str, str], list[tuple[str, ...]]] = {}  # (source, section) -> where the unknown keys are
    problems: list[str] = []
    for err in exc.errors():
        if err["loc"][:1] == (_ROLE_SECTIONS,):  # a role's section is written at the top level: name it so
            err["loc"] = err["loc"][1:]
        key = ".".join(str(p) for p in err["loc"])
        if not key:  # a check across keys of a section: its message names them
            touched = [o for o in overrides if o.split("=", 1)[0].strip() in err["msg"]]
            source = ", ".join(f"--set {_masked(o)}" for o in touched) if touched else str(path)
            problems.append(f"{source}: {err['msg'].removeprefix('Value error, ')}")
            continue
        loc = tuple(str(p) for p in err["loc"])
        if err["type"] == "extra_forbidden":
            unknown.setdefault((_setters(loc, overrides) or str(path), ".".join(loc[:-1])), []).append(loc)
        else:
            source = _variable(loc, origins) or _source(loc, path, overrides, missing=err["type"] == "missing")
            problems.append(f"{source}: {_wrong_value(err, key)}")
    named = [
        f"{_with_lines(source, locs, path)}: unknown key {' and '.join(repr('.'.join(loc)) for loc in locs)}; "
        f"known keys {f'in {section}' if len(unknown) > 1 else 'here'}: " + _known(_section(section))
        for (source, section), locs in unknown.items()
    ]
    if any("." in str(err["loc"][-1]) for err in exc.errors() if err["type"] == "extra_forbidden" and err["loc"]):
        named.append("in the file keys nest, one per line (`llm:` then `  model: gpt-4o` below it); dotted keys are for --set")
    return "; ".join(dict.fromkeys(named + problems))


def _variable(loc: tuple[str, ...], origins: Mapping[str, str]) -> str | None:
    """The environment variable that set the key at `loc` (a TaskWeaver JSON project reads them), if one did."""
    origin = origins.get(".".join(loc), "")
    return f"environment variable {origin.removeprefix('env ')}" if origin.startswith("env ") else None


def _source(loc: tuple[str, ...], path: Path, overrides: list[str], *, missing: bool = False) -> str:
    """Who set the key at `loc`: the --set values that wrote it (or, for a missing key, its section), else the file with the key's line.

    Keys are compared part by part: a dotted key written in the file (`llm.model:`) is one
    part, so it is the file's, not that of a valid `--set llm.model=...`.
    """
    scope = loc[:-1] if missing else loc
    setters = _setters(scope, overrides)
    if setters:
        return setters
    line = key_line(path, scope)
    return f"{path}, line {line}" if line is not None else str(path)


def _setters(scope: tuple[str, ...], overrides: list[str]) -> str | None:
    """The --set values that wrote the key at `scope` or inside it, compared part by part."""
    touched = [o for o in overrides if tuple(o.split("=", 1)[0].strip().split("."))[: len(scope)] == scope]
    return ", ".join(f"--set {_masked(o)}" for o in touched) or None


def _with_lines(source: str, locs: list[tuple[str, ...]], path: Path) -> str:
    """The file named with the lines of the keys at `locs`; --set sources as they are."""
    if source != str(path):
        return source
    lines = sorted({n for loc in locs if (n := key_line(path, loc)) is not None})
    if not lines:
        return source
    return f"{source}, line{'s' if len(lines) > 1 else ''} {' and '.join(map(str, lines))}"


def _section(dotted: str) -> type[BaseModel]:
    parent: type[BaseModel] = Config
    named = False  # the part before was a mapping of named sections (`mcp.servers`): this part is a name
    for part in filter(None, dotted.split(".")):
        if named:
            named = False
            continue
        if part not in parent.model_fields:  # a role's section (`echo`), written at the top level
            parent = RoleSectionConfig
            continue
        annotation = parent.model_fields[part].annotation
        named = get_origin(annotation) is dict
        section = section_type(annotation)
        if not (isinstance(section, type) and issubclass(section, BaseModel)):
            break
        parent = section
    return parent


def _wrong_value(err: ErrorDetails, key: str) -> str:
    got = err.get("input")
    # Only scalars are echoed: a whole section could hold the API key; an address without its password.
    shown = "" if "api_key" in key or isinstance(got, (dict, list)) else f", got {redact(got) if isinstance(got, str) else got!r}"
    return f"key '{key}': {err['msg'].lower()}{shown}"


def _masked(override: str) -> str:
    key, sep, value = override.partition("=")
    if key.strip().endswith("url") and value:
        return f"{key}{sep}{redact(value)}"
    return f"{key}{sep}***" if ("api_key" in key or key.strip().endswith("token")) and value else override


COLON_PROBLEMS = ("mapping values are not allowed here", "could not find expected ':'")


def missing_colon(path: Path, text: str, exc: yaml.YAMLError) -> str | None:
    """The line whose key lacks its colon, said plainly, when that is what PyYAML tripped on (it names a later line)."""
    if not isinstance(exc, yaml.MarkedYAMLError) or exc.problem_mark is None or exc.problem not in COLON_PROBLEMS:
        return None
    lines = text.splitlines()
    last = exc.context_mark.line if exc.context_mark is not None else exc.problem_mark.line - 1
    for number in range(min(last, len(lines) - 1), -1, -1):
        line = lines[number].strip()
        if not line or line.startswith(("#", "-")):
            continue
        if ":" in line.split(" #")[0]:
            return None  # the nearest key has its colon: some other slip, PyYAML's words say it better
        key, _, rest = line.partition(" ")
        fixed = f"{key}: {rest.strip()}" if rest.strip() else f"{key}:"
        return f"{path}, line {number + 1}: `{line}` has no colon after its key; write `{fixed}`"
    return None


def key_line(path: Path, loc: tuple[str, ...]) -> int | None:
    """The line of the file where the key at `loc` is written (1-based), if the file has it."""
    try:
        node = yaml.compose(path.read_text(encoding="utf-8-sig"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return None
    line = None
    for part in loc:
        if not isinstance(node, yaml.MappingNode):
            break
        match = next(((k, v) for k, v in node.value if isinstance(k, yaml.ScalarNode) and k.value == part), None)
        if match is None:
            break
        line, node = match[0].start_mark.line + 1, match[1]
    return line


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """PyYAML's own explanation with the line it points at, and where the enclosing construct began."""
    if not isinstance(exc, yaml.MarkedYAMLError) or exc.problem_mark is None:
        return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    mark = exc.problem_mark
    text = f"line {mark.line + 1}, column {mark.column + 1}: {exc.problem}"
    if exc.context and exc.context_mark is not None:
        text += f" ({exc.context} on line {exc.context_mark.line + 1})"
    return text
