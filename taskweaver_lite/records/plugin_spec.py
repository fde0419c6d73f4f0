"""A plugin's spec as a record: what the prompts show of a validated plugin and what the kernel loads.
Finding and validating plugins is `plugins/catalog.py`'s job."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Parameter:
    """One parameter or return value of a plugin, as its YAML declares it."""

    name: str
    type: str = "Any"
    required: bool = False
    description: str = ""
    default: Any = None
    has_default: bool = False  # `default: null` is a default; no `default` key is none

    def to_dict(self) -> dict[str, Any]:
        """JSON shape: {name, type, required, description[, default]}."""
        data: dict[str, Any] = {"name": self.name, "type": self.type, "required": self.required, "description": self.description}
        if self.has_default:
            data["default"] = self.default
        return data


@dataclass(frozen=True)
class PluginSpec:
    """A plugin that passed validation: what the prompts show and what the kernel loads."""

    name: str
    code: str
    description: str
    yaml_path: Path
    source_path: Path
    enabled: bool = True
    required: bool = False
    plugin_only: bool = False
    examples: str = ""
    parameters: tuple[Parameter, ...] = ()
    returns: tuple[Parameter, ...] = ()
    configurations: dict[str, Any] = field(default_factory=dict)
    origin: str = "project"  # "project" or the entry point that supplied it

    def kernel_spec(self) -> dict[str, Any]:
        """What `plugin_runtime.install` needs: names, the source text (not a path), the configuration."""
        return {
            "name": self.name,
            "code": self.code,
            "source_file": str(self.source_path),
            "source": self.source_path.read_text(encoding="utf-8"),
            "config": self.configurations,
        }
