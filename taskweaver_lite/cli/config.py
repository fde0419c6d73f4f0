"""`taskweaver-lite config --show`: every effective setting of a project, with where its value came from.

Each key's origin is its default, the project's file, an environment variable (a TaskWeaver JSON
project reads them, config/sources.py says when), or `--set`. Secrets are masked. When
`llm.api_base` or `llm.api_key` is null, the line says which of the openai SDK's variables the
client takes instead, so the address prompts go to is never a guess.
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

from taskweaver_lite.cli.project import project_dir
from taskweaver_lite.config.file import load_config, section_type
from taskweaver_lite.config.settings import Config, yaml_text
from taskweaver_lite.config.sources import DEFAULT, effective_values, shown
from taskweaver_lite.safety.terminal import strip_controls

# The openai SDK's variables a null llm.api_base / llm.api_key falls back to.
_FALLBACKS = {"llm.api_base": "OPENAI_BASE_URL", "llm.api_key": "OPENAI_API_KEY"}
_MASKED_MAPPINGS = ("headers", "env")  # values that may hold a proxy's password or a token


def run_config(args: argparse.Namespace) -> int:
    """`taskweaver-lite config --show`: one line per setting, `key = value   (origin)`."""
    config = load_config(project_dir(args), list(args.overrides))
    rows = setting_rows(config)
    if args.json:
        print(json.dumps([{"key": key, "value": value, "source": source} for key, value, source in rows], indent=1))
        return 0
    print(strip_controls(header(config)))
    width = max(len(key) for key, _, _ in rows)
    for key, value, source in rows:
        print(strip_controls(f"{key:<{width}} = {yaml_text(value)}   ({source})"))
    for notice in config.notices:
        print(strip_controls(notice))
    return 0


def header(config: Config) -> str:
    """Which file the settings came from, and whether the environment counts."""
    sources = config.sources
    if sources.file is None:
        return f"{config.project_dir}: no config file; every setting is its default unless --set"
    if sources.reads_environment:
        return f"{sources.file} (TaskWeaver's JSON): --set > environment (KEY_UPPER_WITH_UNDERSCORES) > file > default"
    return f"{sources.file}: --set > file > default (TaskWeaver's LLM_* variables are not read by a YAML project)"


def setting_rows(config: Config) -> list[tuple[str, Any, str]]:
    """(key, printable value, origin) for every setting, role sections included, secrets masked."""
    rows = []
    values = list(effective_values(config, section_of=section_type))
    for name, section in config.role_sections.items():
        values += list(effective_values(section, prefix=f"{name}.", section_of=section_type))
    for key, value in values:
        rows.append((key, _masked(key.rpartition(".")[2], shown(value)), _origin(config, key, value)))
    return rows


def _masked(name: str, value: Any) -> Any:
    """`value` with the values of every `env` and `headers` mapping in it hidden (mcp.servers.NAME.env included), their keys shown."""
    if not isinstance(value, dict):
        return value
    if name in _MASKED_MAPPINGS:
        return dict.fromkeys(value, "(hidden)")
    return {key: _masked(str(key), item) for key, item in value.items()}


def _origin(config: Config, key: str, value: Any) -> str:
    origin = config.sources.origin(key)
    variable = _FALLBACKS.get(key)
    if origin != DEFAULT or value is not None or variable is None:
        return origin
    if variable not in os.environ:
        return f"{origin}; {variable} is not set either"
    taken = "(hidden)" if variable.endswith("KEY") else os.environ[variable]
    return f"{origin}; the client takes env {variable} = {taken}"
