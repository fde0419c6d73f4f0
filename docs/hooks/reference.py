"""MkDocs hook: the reference pages generated from the code, and SECURITY.md and CHANGELOG.md as pages of the site."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

from taskweaver_lite.cli.reference import pages

ROOT = Path(__file__).resolve().parents[2]


def on_files(files: Files, config: Any) -> Files:
    """Add the generated pages before the site is built (they are never written into docs/)."""
    for path, text in pages().items():
        files.append(File.generated(config, path, content=text))
    # The security policy and the changelog stay at the repository's top level, where people look for them.
    files.append(File.generated(config, "security.md", content=(ROOT / "SECURITY.md").read_text(encoding="utf-8")))
    files.append(File.generated(config, "changelog.md", content=(ROOT / "CHANGELOG.md").read_text(encoding="utf-8")))
    return files


# A page links the policy and the changelog where they are in the repository (so the link works on GitHub too); on the site they are pages.
_TOP_LEVEL = {"](../SECURITY.md": "](security.md", "](../CHANGELOG.md": "](changelog.md"}


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    """Links to ../SECURITY.md and ../CHANGELOG.md point at their pages on the site."""
    for there, here in _TOP_LEVEL.items():
        markdown = markdown.replace(there, here)
    return markdown
