"""Prompt templates: Jinja2 text in YAML files under `prompts/`, rendered with StrictUndefined.

Each YAML file maps part names (`system`, `revise`, ...) to Jinja2 templates. The files live at the
repository's top level as `prompts/` and are installed as the data package `taskweaver_lite.prompts`
(an editable install maps that package to the checkout's folder), so one lookup serves both.
"""

from __future__ import annotations

import functools
import importlib.resources
from typing import Any

import jinja2

from taskweaver_lite.config.yaml_reader import parse_yaml
from taskweaver_lite.errors import ConfigError

_ENV = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=False, autoescape=False)


class PromptTemplate:
    """The named parts of one prompt file, ready to render."""

    def __init__(self, name: str, parts: dict[str, str]) -> None:
        self.name = name
        # The template text is trimmed, never the rendered result: values must arrive verbatim.
        self._templates = {part: _ENV.from_string(text.strip()) for part, text in parts.items()}

    def render(self, part: str, /, **values: Any) -> str:
        """Render one part; a missing value is an error, never an empty string."""
        try:
            template = self._templates[part]
        except KeyError:
            raise ConfigError(f"prompts/{self.name}.yaml: no part '{part}'; it has {', '.join(self._templates)}") from None
        return template.render(**values)


def render_text(text: str, /, **values: Any) -> str:
    """Render a template given as text (a role file's `prompt`); a missing value is an error."""
    try:
        return _ENV.from_string(text).render(**values)
    except jinja2.TemplateError as exc:
        raise ConfigError(f"prompt template: {exc}") from None


@functools.cache
def load_prompt(name: str) -> PromptTemplate:
    """Load and parse `prompts/<name>.yaml` (once per process)."""
    text = _read(f"{name}.yaml")
    data = parse_yaml(text)
    if not isinstance(data, dict) or not all(isinstance(v, str) for v in data.values()):
        raise ConfigError(f"prompts/{name}.yaml: expected a mapping of part names to template text")
    return PromptTemplate(name, data)


def _read(file_name: str) -> str:
    resource = importlib.resources.files("taskweaver_lite.prompts") / file_name
    if not resource.is_file():
        raise ConfigError(f"prompt file {file_name} is missing from the installation; reinstall taskweaver-lite")
    return resource.read_text(encoding="utf-8")
