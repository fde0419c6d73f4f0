"""Where each setting's value came from: its default, the project's file, an environment variable, or `--set`.

A TaskWeaver JSON project (`taskweaver_config.json`) is read with TaskWeaver's order, highest
first: `--set`, then the environment, then the file, then the default. In the environment every
key is spelled KEY_UPPER_WITH_UNDERSCORES (`llm.api_base` is `LLM_API_BASE`), as TaskWeaver spells
it, so a TaskWeaver user's `LLM_API_BASE`, `LLM_API_KEY` and `LLM_MODEL` keep working. A YAML
project (`taskweaver_config.yaml`) reads no such variables: a variable left over in a shell must
not send its prompts to another server without a word. It is told, in one line, about each
`LLM_*` variable that is set and differs from what it uses. Both kinds fall back to the openai
SDK's `OPENAI_BASE_URL` and `OPENAI_API_KEY` when `llm.api_base` and `llm.api_key` are null.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, SecretStr

DEFAULT = "default"
SET = "--set"


def env_name(dotted: str) -> str:
    """The environment variable TaskWeaver reads for `dotted`: `llm.api_base` -> `LLM_API_BASE`."""
    return dotted.upper().replace(".", "_")


def from_env(name: str) -> str:
    """The origin of a value read from the environment variable `name`."""
    return f"env {name}"


def from_file(path: Path) -> str:
    """The origin of a value written in the file at `path`."""
    return f"file {path}"


@dataclass(frozen=True)
class ConfigSources:
    """The file a config was read from, whether it reads the environment, and the origin of each key set anywhere."""

    file: Path | None = None
    reads_environment: bool = False
    origins: Mapping[str, str] = field(default_factory=dict)  # dotted key -> origin; keys set nowhere are defaults
    overrides: tuple[str, ...] = ()  # the --set values it was loaded with

    def origin(self, dotted: str) -> str:
        """Where `dotted`'s value came from: its own origin, else that of the section it was set with, else the default."""
        parts = dotted.split(".")
        for end in range(len(parts), 0, -1):
            found = self.origins.get(".".join(parts[:end]))
            if found is not None:
                return found
        # A mapping of sections (mcp.servers) is set by its entries' keys: it came from where they did.
        within = [origin for key, origin in self.origins.items() if key.startswith(f"{dotted}.")]
        return " and ".join(dict.fromkeys(within)) if within else DEFAULT

    def hint(self, dotted: str, *, also: str | None = None) -> str:
        """Where a user sets `dotted`, for messages: the file by name, for a JSON project its variable too; `also` another variable read."""
        if self.file is None or not self.reads_environment:
            name = self.file.name if self.file is not None else "taskweaver_config.yaml"
            return f"{dotted} in {name}" + (f" or the {also} environment variable" if also else "")
        return f'"{dotted}" in {self.file}, or the {env_name(dotted)}' + (f" (or {also})" if also else "") + " environment variable"


def flat_keys(data: Mapping[str, Any], prefix: str = "") -> Iterator[str]:
    """The dotted keys of the values in nested `data` (a mapping's leaves; an empty mapping is a leaf)."""
    for key, value in data.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            yield from flat_keys(value, dotted + ".")
        else:
            yield dotted


def effective_values(config: BaseModel, *, prefix: str = "", section_of: Any) -> Iterator[tuple[str, Any]]:
    """Each leaf setting of `config` as (dotted key, value), nested sections walked; `section_of(annotation)` names a section's model."""
    for name, info in type(config).model_fields.items():
        if info.exclude:
            continue
        value = getattr(config, name)
        section = section_of(info.annotation)
        if isinstance(section, type) and issubclass(section, BaseModel) and isinstance(value, BaseModel):
            yield from effective_values(value, prefix=f"{prefix}{name}.", section_of=section_of)
        else:
            yield f"{prefix}{name}", value
    extra = config.model_extra or {}
    for name, value in extra.items():  # a role's own keys (`echo.decorator`)
        yield f"{prefix}{name}", value


def shown(value: Any) -> Any:
    """A setting's value as it may be printed: secrets masked."""
    if isinstance(value, SecretStr):
        return "(hidden)" if value.get_secret_value() else ""
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if isinstance(value, list):
        return [shown(item) for item in value]
    if isinstance(value, dict):  # a mapping of sections (mcp.servers: NAME -> its settings)
        return {key: shown(item) for key, item in value.items()}
    return value
