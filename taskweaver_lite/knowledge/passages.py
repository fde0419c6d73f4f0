"""A document read into passages: runs of lines short enough to quote, each with its file, lines and heading.

Formats: Markdown, plain text, reStructuredText and Python by lines; a notebook (.ipynb) cell by
cell (lines counted within the cell); a PDF page by page, only when `pypdf` is installed. Anything
else, or a file that cannot be read, raises `Unreadable` with the reason, so the index can list it
as skipped instead of leaving it out silently.

A passage starts at a paragraph (or a heading) and takes the paragraphs after it up to about
`PASSAGE_WORDS` words; a longer paragraph is split between lines.
"""

from __future__ import annotations

import importlib.util
import json
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

TEXT_SUFFIXES = (".md", ".markdown", ".txt", ".rst", ".py")
SUFFIXES = (*TEXT_SUFFIXES, ".ipynb", ".pdf")
PASSAGE_WORDS = 120
MAX_LINE_CHARS = 2_000  # a minified line is kept to this much: one line must not fill a reply
MAX_FILE_BYTES = 20 * 1024 * 1024

_MD_HEADING = re.compile(r"^\s{0,3}#{1,6}\s+(.+?)\s*#*\s*$")
_MD_FENCE = re.compile(r"^\s{0,3}(```|~~~)")
_RST_UNDERLINE = re.compile(r"^([=\-~^\"'`#*+<>:.])\1{2,}\s*$")
_PY_DEFINITION = re.compile(r"^(?:async\s+def|def|class)\s+(\w+)")


class Unreadable(Exception):
    """A file the index cannot read; the message is the reason, for the skipped list."""


@dataclass(frozen=True)
class Passage:
    """Lines `first_line`..`last_line` of `path` (within a notebook cell or PDF page when `part` says so)."""

    path: str  # relative to the documents folder, with '/'
    first_line: int
    last_line: int
    text: str
    heading: str = ""  # the section it is in: a Markdown or reST title, a Python def or class
    part: str = ""  # "cell 3", "page 2", or "" for the file itself

    def citation(self) -> str:
        """Where it is, as `file:line` or `file:first-last` (`file:cell 3:2-9` in a notebook)."""
        lines = str(self.first_line) if self.first_line == self.last_line else f"{self.first_line}-{self.last_line}"
        return ":".join(p for p in (self.path, self.part, lines) if p)


def pdf_support() -> str | None:
    """Why .pdf files cannot be read here (no maintained parser installed), or None when pypdf is there."""
    if importlib.util.find_spec("pypdf") is None:
        return "no PDF parser is installed: pip install pypdf (or 'taskweaver-lite[docs]') to index PDF files"
    return None


def read_passages(path: Path, *, name: str) -> list[Passage]:
    """The passages of one file, `name` being its path in citations; Unreadable with the reason if it cannot be read."""
    suffix = path.suffix.lower()
    if suffix not in SUFFIXES:
        raise Unreadable(f"not a format the index reads ({', '.join(SUFFIXES)})")
    if path.stat().st_size > MAX_FILE_BYTES:
        raise Unreadable(f"larger than {MAX_FILE_BYTES // 1024 // 1024} MB")
    if suffix == ".ipynb":
        return _notebook(path, name=name)
    if suffix == ".pdf":
        return _pdf(path, name=name)
    lines = path.read_bytes().decode("utf-8", errors="replace").splitlines()
    return list(chunk(lines, name=name, headings=heading_lines(lines, suffix=suffix)))


def chunk(lines: Sequence[str], *, name: str, headings: dict[int, str], part: str = "") -> Iterator[Passage]:
    """Passages of `lines` (numbered from 1): paragraphs packed up to PASSAGE_WORDS words, a heading starting a new one."""
    current: list[int] = []  # line numbers in the passage being packed
    words = 0
    for block in _paragraphs(lines):
        size = _words(lines, block)
        for piece in _split_long(lines, block) if size > PASSAGE_WORDS else [block]:
            piece_words = _words(lines, piece)
            if current and (words + piece_words > PASSAGE_WORDS or piece[0] in headings):
                yield _passage(lines, current, name=name, headings=headings, part=part)
                current, words = [], 0
            current += piece
            words += piece_words
    if current:
        yield _passage(lines, current, name=name, headings=headings, part=part)


def _words(lines: Sequence[str], numbers: Sequence[int]) -> int:
    return sum(len(lines[n - 1].split()) for n in numbers)


def heading_lines(lines: Sequence[str], *, suffix: str) -> dict[int, str]:
    """Line number -> section title for the lines that start a section (Markdown, reST, Python)."""
    found: dict[int, str] = {}
    fenced = False
    for number, line in enumerate(lines, 1):
        if suffix in (".md", ".markdown"):
            if _MD_FENCE.match(line):
                fenced = not fenced
            elif not fenced and (m := _MD_HEADING.match(line)):
                found[number] = m.group(1)
        elif suffix == ".rst":
            below = lines[number] if number < len(lines) else ""
            if line.strip() and _RST_UNDERLINE.match(below) and len(below.strip()) >= len(line.strip()):
                found[number] = line.strip()
        elif suffix == ".py" and (m := _PY_DEFINITION.match(line)):
            found[number] = m.group(0).split("(")[0]
    return found


def _paragraphs(lines: Sequence[str]) -> Iterator[list[int]]:
    """Runs of non-blank lines, as 1-based line numbers."""
    block: list[int] = []
    for number, line in enumerate(lines, 1):
        if line.strip():
            block.append(number)
        elif block:
            yield block
            block = []
    if block:
        yield block


def _split_long(lines: Sequence[str], block: list[int]) -> Iterator[list[int]]:
    """A paragraph over PASSAGE_WORDS words in pieces of whole lines (at least one line each)."""
    piece: list[int] = []
    words = 0
    for number in block:
        size = len(lines[number - 1].split())
        if piece and words + size > PASSAGE_WORDS:
            yield piece
            piece, words = [], 0
        piece.append(number)
        words += size
    if piece:
        yield piece


def _passage(lines: Sequence[str], numbers: list[int], *, name: str, headings: dict[int, str], part: str) -> Passage:
    first, last = numbers[0], numbers[-1]
    text = "\n".join(line[:MAX_LINE_CHARS] for line in lines[first - 1 : last])
    starts = [n for n in headings if n <= first]
    return Passage(path=name, first_line=first, last_line=last, text=text, heading=headings[max(starts)] if starts else "", part=part)


def _notebook(path: Path, *, name: str) -> list[Passage]:
    """Each cell's source (Markdown and code), its lines counted within the cell."""
    try:
        notebook = json.loads(path.read_text(encoding="utf-8", errors="replace"))
    except json.JSONDecodeError as exc:
        raise Unreadable(f"not a readable notebook ({' '.join(str(exc).split())[:120]})") from None
    # Read as JSON, not through nbformat: its schema validator takes over a second to import, for nothing read here.
    if not isinstance(notebook, dict) or not isinstance(notebook.get("nbformat"), int) or not isinstance(notebook.get("cells", []), list):
        raise Unreadable("not a readable notebook (no nbformat version or cell list)")
    passages: list[Passage] = []
    for index, cell in enumerate(notebook.get("cells", []), 1):
        if not isinstance(cell, dict):
            continue
        source = cell.get("source", "")
        lines = ("".join(source) if isinstance(source, list) else str(source)).splitlines()
        suffix = ".md" if cell.get("cell_type") == "markdown" else ".py"
        passages += chunk(lines, name=name, headings=heading_lines(lines, suffix=suffix), part=f"cell {index}")
    return passages


def _pdf(path: Path, *, name: str) -> list[Passage]:
    """Each page's text as pypdf extracts it, its lines counted within the page."""
    problem = pdf_support()
    if problem is not None:
        raise Unreadable(problem)
    import pypdf

    try:
        reader = pypdf.PdfReader(path)
        pages = [page.extract_text() or "" for page in reader.pages]
    except Exception as exc:  # noqa: BLE001 - pypdf raises many kinds for a damaged file; each is one skipped file
        raise Unreadable(f"pypdf could not read it ({type(exc).__name__}: {' '.join(str(exc).split())[:120]})") from None
    passages: list[Passage] = []
    for number, text in enumerate(pages, 1):
        passages += chunk(text.splitlines(), name=name, headings={}, part=f"page {number}")
    return passages
