"""The settings an evaluation runs its cases under: one, or the rows of a matrix file.

A matrix file is YAML: each top-level key names a setting, its value maps config keys (dotted, as
`--set` takes them) to values; an empty setting is the project as configured:

    "off":   {planner.prompt_compression: false, code_generator.prompt_compression: false}
    "(1,1)": {round_compressor.rounds_to_compress: 1, round_compressor.rounds_to_retain: 1}
    "(2,3)": {}
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from taskweaver_lite.config.yaml_reader import parse_yaml
from taskweaver_lite.errors import ConfigError

DEFAULT_SETTING = "project"


@dataclass(frozen=True)
class Setting:
    """A named set of config overrides (`KEY=VALUE`, applied over the project's file and `--set`)."""

    name: str
    overrides: tuple[str, ...] = ()


def load_matrix(path: Path) -> tuple[Setting, ...]:
    """The settings of a matrix file; ConfigError naming the file and the fix."""
    try:
        data = parse_yaml(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"--matrix {path}: cannot be read ({exc.strerror or exc})") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"--matrix {path}: not valid YAML ({' '.join(str(exc).split())[:160]})") from None
    if not isinstance(data, dict) or not data:
        raise ConfigError(f"--matrix {path}: expected a mapping of setting names to config keys, e.g. 'off: {{planner.prompt_compression: false}}'")
    for name in data:
        if not isinstance(name, str):
            raise ConfigError(f'--matrix {path}: the setting name {name!r} was read as YAML\'s {type(name).__name__}: quote it ("off":, "1":)')
    return tuple(_setting(path, name, keys) for name, keys in data.items())


def _setting(path: Path, name: str, keys: Any) -> Setting:
    if keys is None:
        return Setting(name)
    if not isinstance(keys, dict):
        raise ConfigError(f"--matrix {path}: setting {name!r} must map config keys to values (e.g. llm.model: gpt-4o)")
    return Setting(name, tuple(f"{key}={json.dumps(value)}" for key, value in keys.items()))
