"""YAML as the package reads it: through libyaml when PyYAML has it, and a project's files only within bounds.

A file is checked before PyYAML builds its values: too big, nested too deep (PyYAML builds values
recursively) or an alias bomb (small on disk, huge once expanded) is one error naming the file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from taskweaver_lite.errors import ConfigError

YAML_MAX_CHARS = 1_000_000
YAML_MAX_DEPTH = 64
YAML_MAX_NODES = 200_000  # values once every alias is expanded
# libyaml's parser where PyYAML was built with it (its wheels are): the same values, about ten times faster. Its
# errors are worded differently, so a text it refuses is read again by PyYAML's own parser, whose words and
# marks the messages here are built on.
_FAST_LOADER: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def load_yaml(text: str, *, source: Path | str, max_chars: int = YAML_MAX_CHARS) -> Any:
    """`yaml.safe_load` of a project's file within bounds: ConfigError naming `source` if it is too big, too deep or alias-heavy.

    PyYAML builds nested values recursively (10,000 levels end in a RecursionError) and an alias
    bomb is small on disk but explodes once the values are walked: the events are counted first,
    without recursion, and only a file within the bounds is loaded.
    """
    problem = yaml_bounds_problem(text, max_chars=max_chars)
    if problem is not None:
        raise ConfigError(f"{source}: {problem}; nothing was loaded")
    return parse_yaml(text)


def parse_yaml(text: str) -> Any:
    """`yaml.safe_load(text)`, through libyaml when PyYAML has it: every YAML file the package reads goes through here."""
    try:
        return yaml.load(text, Loader=_FAST_LOADER)  # a safe loader: SafeLoader, or libyaml's CSafeLoader
    except yaml.YAMLError:
        if _FAST_LOADER is yaml.SafeLoader:
            raise
    return yaml.safe_load(text)  # PyYAML's own error, or the value if only libyaml refused it


def yaml_bounds_problem(text: str, *, max_chars: int = YAML_MAX_CHARS) -> str | None:
    """What makes `text` too big, too deep or too alias-heavy to load (None: within the bounds), read without recursion."""
    if len(text) > max_chars:
        return f"{len(text):,} characters, more than the {max_chars:,} a taskweaver-lite YAML file may have"
    try:
        return _bounds_problem(text, _FAST_LOADER)
    except yaml.YAMLError:
        if _FAST_LOADER is yaml.SafeLoader:
            raise
    return _bounds_problem(text, yaml.SafeLoader)  # PyYAML's own error (see parse_yaml)


def _bounds_problem(text: str, loader: type[yaml.SafeLoader]) -> str | None:
    sizes: dict[str, int] = {}  # an anchor's value, in values once expanded
    open_counts = [0]  # values in each collection being read, outermost first
    anchors: list[str | None] = [None]
    for event in yaml.parse(text, Loader=loader):
        if isinstance(event, yaml.CollectionStartEvent):
            open_counts.append(0)
            anchors.append(event.anchor)
            if len(open_counts) > YAML_MAX_DEPTH + 1:
                return f"nested more than {YAML_MAX_DEPTH} levels deep: flatten it"
            continue
        if isinstance(event, yaml.CollectionEndEvent):
            added, anchor = open_counts.pop() + 1, anchors.pop()
        elif isinstance(event, yaml.ScalarEvent):
            added, anchor = 1, event.anchor
        elif isinstance(event, yaml.AliasEvent):
            added, anchor = sizes.get(event.anchor or "", 1), None
        else:
            continue
        if anchor is not None:
            sizes[anchor] = added
        open_counts[-1] += added
        if open_counts[-1] > YAML_MAX_NODES:
            return f"its aliases (*name) expand to more than {YAML_MAX_NODES:,} values: write the values out"
    return None
