"""The documentation: its reference pages list every configuration key, command argument and HTTP
route the code has, and nothing a user reads cites internal documents or issue numbers."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from helpers import REPO

from taskweaver_lite.cli import reference
from taskweaver_lite.cli.main import build_parser, commands
from taskweaver_lite.config.settings import Config, KernelGatewayConfig, MountConfig
from taskweaver_lite.web.app import build_app
from taskweaver_lite.web.auth import Access

pytestmark = pytest.mark.unit

# What a reader cannot open: our internal documents and issue tracker.
CITATIONS = re.compile(r"CONTRACT|\bissues? #?\d|§")


def dotted(values: dict[str, Any], prefix: str) -> list[str]:
    """Every key of a nested mapping as a dotted path."""
    keys = []
    for name, value in values.items():
        key = f"{prefix}.{name}" if prefix else name
        keys.append(key)
        if isinstance(value, dict) and value and name not in ("llm", "headers", "env"):
            keys += dotted(value, key)
    return keys


def test_every_configuration_key_is_on_the_configuration_page() -> None:
    page = reference.config_page()
    keys = dotted(Config().model_dump(), "")
    keys += [f"execution.kernel_gateway.{name}" for name in KernelGatewayConfig.model_fields]
    keys += [f"execution.mounts[].{name}" for name in MountConfig.model_fields]
    missing = [key for key in keys if f"`{key}`" not in page]
    assert not missing, f"keys the configuration page does not list: {missing}"
    rows = [line for line in page.splitlines() if line.startswith("| `")]
    assert all(not line.rstrip().endswith("|  |") for line in rows), "every key says what it means"


def test_every_command_and_its_arguments_are_on_the_commands_page() -> None:
    page = reference.commands_page()
    parser = build_parser()
    names = re.findall(r"^    (\w+) ", parser.format_help(), re.M)  # the commands `taskweaver-lite --help` lists
    assert len(names) >= 10
    for name in names:
        assert f"## `taskweaver-lite {name}`" in page, name
        section = page.split(f"## `taskweaver-lite {name}`", 1)[1].split("\n## ", 1)[0]
        help_text = subcommand_help(parser, name)
        flags = set(re.findall(r"(?<![\w-])(--?[a-z][\w-]*)", help_text)) - {"-h", "--help"}
        missing = [flag for flag in flags if f"`{flag}" not in section]
        assert not missing, f"{name}: arguments its --help shows but the page does not: {missing}"


def test_every_command_is_registered_one_way_under_its_own_name() -> None:
    names = re.findall(r"^    (\w+) ", build_parser().format_help(), re.M)
    assert names == [command.name for command in commands()], "each sub-command is one Command entry in cli/main.py, added under its name"


def subcommand_help(parser: Any, name: str) -> str:
    """What `taskweaver-lite NAME --help` prints."""
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        parser.parse_args([name, "--help"])
    return out.getvalue()


def test_every_http_route_is_on_the_api_page_with_what_it_answers() -> None:
    page = reference.api_page()
    for route in build_app(Config(), Access(None)).routes:
        for method in (getattr(route, "methods", None) or {"GET"}) - {"HEAD"}:
            line = next((row for row in page.splitlines() if row.startswith(f"| `{method} {route.path}` |")), None)  # type: ignore[attr-defined]
            assert line is not None, f"{method} {route.path} is not on the API page"  # type: ignore[attr-defined]
            assert len(line.split("|")[2].strip()) > 10, f"{method} {route.path} does not say what it answers"  # type: ignore[attr-defined]


def user_pages() -> dict[str, str]:
    """Every page a user reads: the README, the security policy, the changelog, docs/ and the generated reference."""
    found = {name: (REPO / name).read_text(encoding="utf-8") for name in ("README.md", "SECURITY.md", "CHANGELOG.md")}
    found |= {str(path.relative_to(REPO)): path.read_text(encoding="utf-8") for path in sorted((REPO / "docs").rglob("*.md"))}
    return found | reference.pages()


def test_nothing_a_user_reads_cites_internal_documents_or_issue_numbers() -> None:
    cited = [
        f"{name}: {match.group(0)!r} in {line.strip()[:80]!r}"
        for name, text in user_pages().items()
        for line in text.splitlines()
        if (match := CITATIONS.search(line))
    ]
    assert not cited, "\n".join(cited)


def nav_pages(items: list[Any]) -> list[str]:
    """The page files an mkdocs nav lists, sections flattened."""
    pages: list[str] = []
    for item in items:
        value = next(iter(item.values())) if isinstance(item, dict) else item
        pages += nav_pages(value) if isinstance(value, list) else [value]
    return pages


# Pages of the site kept at the repository's top level (docs/hooks/reference.py adds them).
TOP_LEVEL = {"security.md": "SECURITY.md", "changelog.md": "CHANGELOG.md"}


def test_the_site_lists_every_page_and_every_listed_page_exists() -> None:
    site = yaml.safe_load((REPO / "mkdocs.yml").read_text(encoding="utf-8"))
    listed = nav_pages(site["nav"])
    generated = set(reference.pages())  # built once: each build renders every reference page
    written = {str(path.relative_to(REPO / "docs")) for path in (REPO / "docs").rglob("*.md")} | generated | set(TOP_LEVEL)
    assert sorted(listed) == sorted(written)
    images = re.findall(r"\]\(([\w./-]+\.(?:png|svg))\)", (REPO / "README.md").read_text(encoding="utf-8"))
    assert images and all((REPO / image).is_file() for image in images), "the README's screenshots exist"
    assert all(Path(REPO / "docs" / page).is_file() for page in listed if page not in generated and page not in TOP_LEVEL)


def heading_anchors(text: str) -> set[str]:
    """The anchors of a page: its headings' (lower case, punctuation dropped, spaces as hyphens, as the site and GitHub make them), and explicit ones."""
    headings = re.findall(r"^#{1,6}\s+(.+?)\s*$", re.sub(r"```.*?```", "", text, flags=re.S), flags=re.M)
    explicit = set(re.findall(r"<a\s+(?:id|name)=\"([\w-]+)\"", text))  # `<a id="tracing"></a>` before a paragraph
    return {re.sub(r"[^\w\- ]", "", heading.lower()).strip().replace(" ", "-") for heading in headings} | explicit


def test_every_readme_section_and_page_anchor_a_page_points_to_exists() -> None:
    pages = {name: text for name, text in user_pages().items() if name.endswith(".md") and (REPO / name).is_file()}
    readme = heading_anchors(pages["README.md"])
    missing = []
    for name, text in pages.items():
        for anchor in re.findall(r"README\.md#([\w-]+)", text):
            if anchor not in readme:
                missing.append(f"{name}: README.md#{anchor}")
        for title in re.findall(r"README's [\"“]([^\"”]+)[\"”]", text):
            if re.sub(r"[^\w\- ]", "", title.lower()).strip().replace(" ", "-") not in readme:
                missing.append(f"{name}: the README's {title!r} section")
        for page, anchor in re.findall(r"\]\(([\w-]+\.md)#([\w-]+)\)", text):
            target = (REPO / name).parent / page
            if not target.is_file() or anchor not in heading_anchors(target.read_text(encoding="utf-8")):
                missing.append(f"{name}: {page}#{anchor}")
    assert not missing, "links to sections that are not there: " + "; ".join(missing)
