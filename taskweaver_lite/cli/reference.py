"""The documentation's reference pages, generated from the code so they cannot drift from it.

The configuration keys come from the typed config (`config/settings.py`), the commands from the argument
parser (`cli/main.py`), the HTTP API from the web server's routes (`web/app.py`). The docs site's
build calls `pages()` (docs/hooks/reference.py); a route without a description fails it.
"""

from __future__ import annotations

import argparse
import itertools
import types
import typing
from collections.abc import Iterator
from typing import Any, Literal

from annotated_types import Ge, Gt, Le, Lt
from pydantic import BaseModel, SecretStr
from pydantic.fields import FieldInfo

from taskweaver_lite.config.settings import Config, LLMOverrides, RoleConfig, yaml_text

CONFIG_PAGE = "reference/configuration.md"
COMMANDS_PAGE = "reference/commands.md"
API_PAGE = "reference/http-api.md"
GENERATED = "<!-- generated from the code when the site is built: edit the code, not this page -->\n\n"


def pages() -> dict[str, str]:
    """Every generated page by its path in the site."""
    return {CONFIG_PAGE: config_page(), COMMANDS_PAGE: commands_page(), API_PAGE: api_page()}


# --- configuration ---------------------------------------------------------------------------


def config_page() -> str:
    """Every configuration key with its type, default and meaning, section by section."""
    parts = [
        "# Configuration keys\n\n",
        GENERATED,
        "Every key of `PROJECT_DIR/taskweaver_config.yaml`, all optional. In the file they nest "
        "(`llm:` then `model: ...`); on the command line they are dotted: `--set llm.model=gpt-4o`. "
        "[Configuration](../configuration.md) says how they work together.\n",
    ]
    for name, field in Config.model_fields.items():
        if field.exclude:
            continue
        section = _model_of(field.annotation)
        assert section is not None, f"config section {name} is not a model"
        parts.append(f"\n## `{name}`\n\n{_first_line(section.__doc__)}\n\n")
        parts.append(_config_table(section, prefix=name))
    parts.append(
        "\n## A project role's section\n\nA role of the project (`roles/<name>/`) or of an installed package is "
        "configured under its own name, with these keys (and any key of its own, which it reads as its options):\n\n"
    )
    parts.append(_config_table(RoleConfig, prefix="<role>"))
    return "".join(parts)


def config_keys() -> Iterator[str]:
    """Every dotted key the configuration page lists."""
    for name, field in Config.model_fields.items():
        section = _model_of(field.annotation)
        if field.exclude or section is None:
            continue
        yield from (key for key, *_ in _config_rows(section, prefix=name))
    yield from (key for key, *_ in _config_rows(RoleConfig, prefix="<role>"))


def _config_table(model: type[BaseModel], *, prefix: str) -> str:
    rows = ["| key | type | default | meaning |\n", "|---|---|---|---|\n"]
    rows += [f"| `{key}` | {_cell(kind)} | {_cell(default)} | {_cell(meaning)} |\n" for key, kind, default, meaning in _config_rows(model, prefix=prefix)]
    return "".join(rows)


def _config_rows(model: type[BaseModel], *, prefix: str) -> Iterator[tuple[str, str, str, str]]:
    """(key, type, default, meaning) of each key under `model`, nested sections flattened into dotted keys."""
    for name, field in model.model_fields.items():
        if field.exclude:
            continue
        key = f"{prefix}.{name}"
        nested = _model_of(field.annotation)
        meaning = field.description or ""
        if nested is LLMOverrides:
            yield key, "mapping", "`{}`", f"{meaning}: any key of `llm` (`model`, `api_base`, `context_window`, ...)"
        elif nested is not None and _is_list(field.annotation):
            yield key, "list", _default(field), meaning
            yield from _config_rows(nested, prefix=f"{key}[]")
        elif nested is not None and typing.get_origin(field.annotation) is dict:  # named sections (`mcp.servers.NAME`)
            yield key, "mapping of NAME to mapping", _default(field), meaning
            yield from _config_rows(nested, prefix=f"{key}.<NAME>")
        elif nested is not None:
            yield key, "mapping" + (" or null" if _optional(field.annotation) else ""), _default(field), meaning or _first_line(nested.__doc__)
            yield from _config_rows(nested, prefix=key)
        else:
            yield key, _type_text(field), _default(field), meaning


def _model_of(annotation: Any) -> type[BaseModel] | None:
    """The config model an annotation holds (itself, in an Optional or a list), if any."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _model_of(arg)
        if found is not None:
            return found
    return None


def _is_list(annotation: Any) -> bool:
    return typing.get_origin(annotation) is list or any(_is_list(arg) for arg in typing.get_args(annotation) if arg is not type(None))


def _optional(annotation: Any) -> bool:
    return type(None) in typing.get_args(annotation)


def _type_text(field: FieldInfo) -> str:
    """The annotation as a reader writes values: `int ≥ 1`, `"auto" | "off"`, `str or null`."""
    text = _annotation_text(field.annotation)
    for item in field.metadata:
        if isinstance(item, Gt):
            text += f", > {item.gt}"
        elif isinstance(item, Ge):
            text += f", ≥ {item.ge}"
        elif isinstance(item, Lt):
            text += f", < {item.lt}"
        elif isinstance(item, Le):
            text += f", ≤ {item.le}"
    return text


def _annotation_text(annotation: Any) -> str:
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is Literal:
        return " or ".join(f"`{yaml_text(arg)}`" for arg in args)
    if origin in (typing.Union, types.UnionType):
        return " or ".join("null" if arg is type(None) else _annotation_text(arg) for arg in args)
    if origin is list:
        return f"list of {_annotation_text(args[0])}"
    if origin is dict:
        return f"mapping of {_annotation_text(args[0])} to {_annotation_text(args[1])}"
    if annotation is SecretStr:
        return "str (secret)"
    return getattr(annotation, "__name__", str(annotation))


def _default(field: FieldInfo) -> str:
    if field.is_required():
        return "required"
    value = field.get_default(call_default_factory=True)
    if isinstance(value, BaseModel):
        return "(its keys' defaults)"
    return f"`{yaml_text(value)}`"


# --- commands ----------------------------------------------------------------------------------


def commands_page() -> str:
    """Every command with its usage line and arguments, from the parser `taskweaver-lite` runs."""
    from taskweaver_lite.cli.main import build_parser

    parser = build_parser()
    parts = ["# Commands\n\n", GENERATED, f"{parser.description}\n\n```text\n{parser.format_usage()}```\n"]
    for name, command, about in _commands(parser):
        parts.append(f"\n## `taskweaver-lite {name}`\n\n{about}\n\n```text\n{command.format_usage()}```\n\n")
        parts.append("| argument | meaning | default |\n|---|---|---|\n")
        for action in command._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            parts.append(f"| {_cell(_argument(action))} | {_cell(action.help or '')} | {_cell(_argument_default(action))} |\n")
    return "".join(parts)


def _commands(parser: argparse.ArgumentParser) -> Iterator[tuple[str, argparse.ArgumentParser, str]]:
    """(name, parser, help) of each sub-command, in the order `--help` lists them."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help or "" for choice in action._choices_actions}
            for name, command in action.choices.items():
                yield name, command, helps.get(name, "")


def _argument(action: argparse.Action) -> str:
    if not action.option_strings:
        return f"`{action.metavar or action.dest}`"  # a positional's metavar is one name
    value = "" if action.nargs == 0 else f" {action.metavar or action.dest.upper()}"
    return ", ".join(f"`{flag}{value}`" for flag in action.option_strings)


def _argument_default(action: argparse.Action) -> str:
    if action.nargs == 0 or action.default in (None, [], argparse.SUPPRESS):
        return ""
    return f"`{action.default}`"


# --- HTTP API ----------------------------------------------------------------------------------


def api_page() -> str:
    """Every route of `serve` with what it answers, from the server's own routing table."""
    parts = [
        "# HTTP API\n\n",
        GENERATED,
        "What `taskweaver-lite serve` answers. JSON unless said otherwise; errors are "
        '`{"error": message}` with the status. [Web page and API](../web.md) says who may call it.\n\n',
        "| request | answer |\n|---|---|\n",
    ]
    parts += [f"| `{method} {path}` | {_cell(about)} |\n" for method, path, about in api_routes()]
    return "".join(parts)


def api_routes() -> list[tuple[str, str, str]]:
    """(method, path, what it answers) of every route the server has; AssertionError for one not described."""
    from starlette.routing import Route

    from taskweaver_lite.web.app import ROUTES_ABOUT, build_app
    from taskweaver_lite.web.auth import Access

    found = []
    for route in build_app(Config(), Access(None)).routes:
        assert isinstance(route, Route), f"{route!r} is not a plain route"
        for method in sorted((route.methods or {"GET"}) - {"HEAD"}):
            about = ROUTES_ABOUT.get((method, route.path))
            assert about, f"{method} {route.path} has no line in web/app.py's ROUTES_ABOUT"
            found.append((method, route.path, about))
    return found


def _cell(text: str) -> str:
    """Text safe inside a Markdown table cell: pipes escaped, and `<` outside code spans (<think> is no HTML tag)."""
    pieces = text.replace("|", "\\|").replace("\n", " ").split("`")
    return "`".join(piece if odd else piece.replace("<", "&lt;") for odd, piece in zip(itertools.cycle((False, True)), pieces))


def _first_line(doc: str | None) -> str:
    return (doc or "").strip().splitlines()[0] if doc else ""
