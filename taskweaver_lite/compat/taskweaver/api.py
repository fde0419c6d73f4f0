"""TaskWeaver's role classes and their config, so that a role written for TaskWeaver runs unchanged.

A TaskWeaver role subclasses `taskweaver.role.Role`, is built by the `injector` package with its
config (a `RoleConfig` subclass reading `<role>.<key>` settings), a logger, tracing, the session's
event emitter, its `RoleEntry` and, when it asks, the `LLMApi`; its `reply(memory)` returns a
`Post`, usually from `event_emitter.create_post_proxy(alias)`. This module holds those pieces:

- `AppConfigSource`/`ModuleConfig`/`RoleConfig`: a role's settings read as TaskWeaver reads them,
  from the role's section of the project config (`echo: {decorator: "**"}`, or TaskWeaver's JSON
  `"echo.decorator"`) over its role file's keys, then the environment (`ECHO_DECORATOR`), then the default;
- `Role` and `RoleEntry`; what the session lends a role besides (its event emitter, logger,
  tracing, model) is in compat/taskweaver/session.py.

What TaskWeaver has and this does not (experience and example loading for a custom role, shared
memory entries, extra LLM aliases, embeddings) raises `NotProvided`, one line saying what to port
to our `reply(request, tools)`. `compat/taskweaver/role.py` registers these under TaskWeaver's
module names and runs the role.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from taskweaver_lite.compat.taskweaver.memory import Memory, Post
from taskweaver_lite.compat.taskweaver.session import NotProvided, SessionEventEmitter, TelemetryLogger, Tracing

F = TypeVar("F", bound=Callable[..., Any])


def injectable(init: F) -> F:
    """`injector.inject(init)` when the package is installed (TaskWeaver's roles are built by it), else `init` as it is."""
    try:
        from injector import inject
    except ImportError:
        return init
    injected: F = inject(init)
    return injected


class AppConfigSource:
    """The settings a role's config reads: the project config's role sections, then the environment, then the default."""

    def __init__(self, values: Mapping[str, Any], *, app_base_path: Path) -> None:
        self.values = dict(values)  # dotted keys: "echo.decorator"
        self.app_base_path = str(app_base_path)
        self.module_base_path = str(app_base_path)
        self.read: set[str] = set()  # the keys a role asked for

    def _value(self, key: str, default: Any, required: bool = True) -> Any:
        self.read.add(key)
        if self.values.get(key) is not None:
            return self.values[key]
        env = os.environ.get(key.upper().replace(".", "_"))  # TaskWeaver's rule: echo.decorator -> ECHO_DECORATOR
        if env is not None:
            return None if env.lower() in ("null", "none", "nil") else env
        if default is None and required:
            section, _, name = key.rpartition(".")
            env_name = key.upper().replace(".", "_")
            raise ValueError(f"the role needs the setting {key}: add `{section}: {{{name}: ...}}` to taskweaver_config.yaml (or set {env_name})")
        return default

    def get_str(self, key: str, default: str | None = None, required: bool = True) -> str:
        """A text setting."""
        value = self._value(key, default, required)
        return value if value is None else str(value)  # type: ignore[return-value]  # TaskWeaver returns None for an optional unset key

    def get_bool(self, key: str, default: bool | None = None, required: bool = True) -> bool:
        """A yes/no setting (true/false, yes/no, 1/0)."""
        value = self._value(key, default, required)
        if isinstance(value, bool) or value is None:
            return bool(value)
        words = {"true": True, "yes": True, "1": True, "false": False, "no": False, "0": False}
        if str(value).lower() not in words:
            raise ValueError(f"the setting {key} must be true or false, not {value!r}")
        return words[str(value).lower()]

    def get_int(self, key: str, default: int | None = None, required: bool = True) -> int:
        """A whole-number setting."""
        return int(self._value(key, default, required))

    def get_float(self, key: str, default: float | None = None, required: bool = True) -> float:
        """A number setting."""
        return float(self._value(key, default, required))

    def get_list(self, key: str, default: list[Any] | None = None, required: bool = True) -> list[Any]:
        """A list setting (a comma-separated text counts)."""
        value = self._value(key, default, required)
        return [part.strip() for part in value.split(",")] if isinstance(value, str) else list(value or [])

    def get_dict(self, key: str, default: dict[str, Any] | None = None, required: bool = True) -> dict[str, Any]:
        """A mapping setting."""
        return dict(self._value(key, default, required) or {})

    def get_enum(self, key: str, options: list[str], default: str | None = None, required: bool = True) -> str:
        """A setting that must be one of `options`."""
        value = self.get_str(key, default, required)
        if value not in options:
            raise ValueError(f"the setting {key} must be one of {', '.join(options)}, not {value!r}")
        return value

    def get_path(self, key: str, default: str | None = None, required: bool = True) -> str:
        """A path setting; TaskWeaver's `${AppBaseDir}` is the project folder."""
        value = self.get_str(key, default, required)
        return value if value is None else value.replace("${AppBaseDir}", self.app_base_path)


class ModuleConfig:
    """A config section: `_configure` reads `<name>.<key>` settings with the `_get_*` helpers."""

    @injectable
    def __init__(self, src: AppConfigSource) -> None:
        self.src = src
        self.name = ""
        self._configure()

    def _set_name(self, name: str) -> None:
        self.name = name

    def _config_key(self, key: str) -> str:
        return f"{self.name}.{key}" if self.name else key

    def _configure(self) -> None:
        pass

    def _get_str(self, key: str, default: str | None, required: bool = True) -> str:
        return self.src.get_str(self._config_key(key), default, required)

    def _get_enum(self, key: str, options: list[str], default: str | None, required: bool = True) -> str:
        return self.src.get_enum(self._config_key(key), options, default, required)

    def _get_bool(self, key: str, default: bool | None) -> bool:
        return self.src.get_bool(self._config_key(key), default)

    def _get_list(self, key: str, default: list[Any] | None) -> list[Any]:
        return self.src.get_list(self._config_key(key), default)

    def _get_dict(self, key: str, default: dict[str, Any] | None) -> dict[str, Any]:
        return self.src.get_dict(self._config_key(key), default)

    def _get_int(self, key: str, default: int | None) -> int:
        return self.src.get_int(self._config_key(key), default)

    def _get_float(self, key: str, default: float | None) -> float:
        return self.src.get_float(self._config_key(key), default)

    def _get_path(self, key: str, default: str | None) -> str:
        return self.src.get_path(self._config_key(key), default)


class RoleConfig(ModuleConfig):
    """A role's config: named after its file (`echo.py` reads `echo.*`), with TaskWeaver's experience and example switches."""

    @injectable
    def __init__(self, src: AppConfigSource) -> None:
        self.src = src
        self.name = os.path.basename(inspect.getfile(type(self))).split(".")[0]
        base = Path(src.app_base_path)
        self.use_experience = self._get_bool("use_experience", False)
        self.experience_dir = self._get_path("experience_dir", str(base / "experience"))
        self.dynamic_experience_sub_path = self._get_bool("dynamic_experience_sub_path", False)
        self.use_example = self._get_bool("use_example", False)
        self.example_base_path = self._get_path("example_base_path", str(base / "examples" / f"{self.name}_examples"))
        self.dynamic_example_sub_path = self._get_bool("dynamic_example_sub_path", False)
        self._configure()


@dataclass
class RoleEntry:
    """A role as its file declares it: name (the folder's), alias, class and intro."""

    name: str
    alias: str
    module: type
    intro: str


class Role:
    """The base of a TaskWeaver role class: its config, logger, tracing, event emitter and entry; `reply(memory)` answers."""

    @injectable
    def __init__(
        self,
        config: ModuleConfig,
        logger: TelemetryLogger,
        tracing: Tracing,
        event_emitter: SessionEventEmitter,
        role_entry: RoleEntry | None = None,
    ) -> None:
        self.config: Any = config
        self.logger = logger
        self.tracing = tracing
        self.event_emitter = event_emitter
        self.role_entry = role_entry
        # A role with no config class of its own gets the base one, named after no file: it takes its folder's name.
        self.name = config.name or (role_entry.name if role_entry else "")
        if role_entry is not None and self.name != role_entry.name:
            raise ValueError(f"the role's config is named {self.name!r} (after its file) but its folder is {role_entry.name!r}: name them alike")
        self.alias = role_entry.alias if role_entry else ""
        self.intro = role_entry.intro if role_entry else ""
        self.experiences: list[Any] = []
        self.examples: list[Any] = []

    def get_intro(self) -> str:
        """The role's intro."""
        return self.intro

    def get_alias(self) -> str:
        """The role's alias."""
        return self.alias

    def set_alias(self, alias: str) -> None:
        """Change the alias."""
        self.alias = alias

    def reply(self, memory: Memory, **kwargs: Any) -> Post:
        """Every role class overrides this."""
        raise NotImplementedError("a TaskWeaver role class defines reply(self, memory, **kwargs)")

    def close(self) -> None:
        """Nothing to release."""

    def format_experience(self, template: str) -> str:
        """'' (experience for a custom role is not loaded here)."""
        if getattr(self.config, "use_experience", False):
            raise NotProvided("Role.format_experience (experience for a custom role)")
        return ""

    def role_load_experience(self, query: str, memory: Memory | None = None) -> None:
        """Nothing when experience is off; NotProvided when a role turns it on."""
        if getattr(self.config, "use_experience", False):
            raise NotProvided("Role.role_load_experience (experience for a custom role)")

    def role_load_example(self, role_set: set[str], memory: Memory | None = None) -> None:
        """Nothing when examples are off; NotProvided when a role turns them on."""
        if getattr(self.config, "use_example", False):
            raise NotProvided("Role.role_load_example (few-shot examples for a custom role)")
