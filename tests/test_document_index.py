"""The document index: formats read into passages with their lines, kept up to date, searched by BM25, answered with citations."""

from __future__ import annotations

import itertools
import json
import os
import sqlite3
import sys
from pathlib import Path

import pytest

from taskweaver_lite.knowledge.doc_index import DocumentIndex, answer
from taskweaver_lite.knowledge.fts import match_query
from taskweaver_lite.knowledge.passages import read_passages
from taskweaver_lite.llm.tokens import get_tokenizer
from taskweaver_lite.records.execution import DATA_CLOSE, DATA_OPEN

pytestmark = pytest.mark.unit

GUIDE = """# Guide

Start here.

## The sandbox

The kernel runs inside bubblewrap: no network,
the home folder hidden.

```
# a comment in a fence, not a heading
```
"""


def tiny_pdf(*lines: str) -> bytes:
    """A one-page PDF whose text is `lines`, built by hand (offsets and all) so the test needs no PDF writer."""
    shown = b" T* ".join(b"(" + line.encode() + b") Tj" for line in lines)
    content = b"BT /F1 12 Tf 14 TL 72 720 Td " + shown + b" ET"
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 4 0 R /Resources << /Font << /F1 5 0 R >> >> >>",
        b"<< /Length %d >>\nstream\n" % len(content) + content + b"\nendstream",
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
    ]
    out = b"%PDF-1.4\n"
    offsets = []
    for number, body in enumerate(objects, 1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % number + body + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1) + b"".join(b"%010d 00000 n \n" % o for o in offsets)
    return out + b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objects) + 1, xref)


@pytest.fixture
def docs(tmp_path: Path) -> Path:
    folder = tmp_path / "docs"
    folder.mkdir()
    (folder / "guide.md").write_text(GUIDE, encoding="utf-8")
    return folder


def open_index(docs: Path) -> DocumentIndex:
    return DocumentIndex(docs, docs.parent / "docs_index.db")


def test_python_sqlite_has_fts5_for_the_searches() -> None:
    db = sqlite3.connect(":memory:")
    db.execute("CREATE VIRTUAL TABLE t USING fts5(x)")  # the whole feature rests on it


def test_markdown_passages_carry_their_lines_and_section_and_a_fenced_comment_is_no_heading(docs: Path) -> None:
    passages = read_passages(docs / "guide.md", name="guide.md")
    sandbox = next(p for p in passages if "bubblewrap" in p.text)
    assert (sandbox.first_line, sandbox.heading) == (5, "The sandbox")
    assert sandbox.text.splitlines()[0] == "## The sandbox" and sandbox.citation() == f"guide.md:5-{sandbox.last_line}"
    assert not any(p.heading.startswith("a comment") for p in passages)


def test_text_rst_and_python_are_read_with_their_sections(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("first line\n\nsecond paragraph about pandas\n", encoding="utf-8")
    (tmp_path / "setup.rst").write_text("Install\n=======\n\nRun pip install.\n", encoding="utf-8")
    (tmp_path / "tool.py").write_text('"""Tools."""\n\n\ndef load_sales(path):\n    return path\n', encoding="utf-8")
    notes = read_passages(tmp_path / "notes.txt", name="notes.txt")
    assert [(p.first_line, p.last_line) for p in notes] == [(1, 3)] and "pandas" in notes[0].text
    assert read_passages(tmp_path / "setup.rst", name="setup.rst")[0].heading == "Install"
    tool = read_passages(tmp_path / "tool.py", name="tool.py")
    assert [(p.first_line, p.heading) for p in tool] == [(1, ""), (4, "def load_sales")]


def test_a_long_paragraph_is_split_between_lines_and_each_piece_keeps_its_lines(tmp_path: Path) -> None:
    lines = [f"word{n} " * 10 for n in range(40)]  # 400 words in one paragraph
    (tmp_path / "long.txt").write_text("\n".join(lines), encoding="utf-8")
    passages = read_passages(tmp_path / "long.txt", name="long.txt")
    assert len(passages) > 2 and passages[0].first_line == 1 and passages[-1].last_line == 40
    assert all(b.first_line == a.last_line + 1 for a, b in itertools.pairwise(passages))


def test_a_notebook_is_read_cell_by_cell_with_lines_within_the_cell(docs: Path) -> None:
    # As Jupyter saves one (nbformat 4): a cell's source is a list of lines.
    cells = [
        {"cell_type": "markdown", "id": "a1", "metadata": {}, "source": ["# Loading\n", "We load the sales."]},
        {
            "cell_type": "code",
            "id": "b2",
            "metadata": {},
            "execution_count": None,
            "outputs": [],
            "source": ["import pandas as pd\n", "df = pd.read_csv('sales.csv')"],
        },
    ]
    notebook = {"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    (docs / "analysis.ipynb").write_text(json.dumps(notebook, indent=1), encoding="utf-8")
    with open_index(docs) as index:
        index.refresh()
        hit = index.search("read_csv", limit=1)[0]
    assert hit.passage.citation() == "analysis.ipynb:cell 2:1-2"


def test_a_pdf_is_read_page_by_page_when_pypdf_is_installed(docs: Path) -> None:
    pytest.importorskip("pypdf")
    (docs / "report.pdf").write_bytes(tiny_pdf("Quarterly revenue grew strongly", "in the northern region"))
    with open_index(docs) as index:
        report = index.refresh()
        hits = index.search("northern revenue", limit=1)
    assert report.skipped == () and hits and hits[0].passage.citation().startswith("report.pdf:page 1:")


def test_without_a_pdf_parser_a_pdf_is_listed_as_skipped_with_the_reason(docs: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pypdf", None)  # this Python as if pypdf were not installed
    (docs / "report.pdf").write_bytes(tiny_pdf("Quarterly revenue"))
    with open_index(docs) as index:
        report = index.refresh()
        reply = answer(index, "quarterly revenue", top_k=3, max_tokens=400, tokenizer=get_tokenizer())
    assert report.skipped == (("report.pdf", report.skipped[0][1]),) and "pip install pypdf" in report.skipped[0][1]
    assert "docs/report.pdf: no PDF parser is installed" in reply, "the reply says which file was not searched and why"


def test_the_index_follows_added_changed_touched_and_deleted_files(docs: Path) -> None:
    with open_index(docs) as index:
        assert index.refresh().added == ("guide.md",)
        assert index.refresh().added == (), "an unchanged folder is not read again"
        (docs / "faq.txt").write_text("How do I export? Use the export command.\n", encoding="utf-8")
        (docs / "guide.md").write_text(GUIDE.replace("bubblewrap", "firejail"), encoding="utf-8")
        report = index.refresh()
        assert (report.added, report.changed) == (("faq.txt",), ("guide.md",))
        assert not index.search("bubblewrap", limit=3) and index.search("firejail", limit=3)
        os.utime(docs / "faq.txt", ns=(1, 1))  # touched, same content
        assert index.refresh().changed == ()
        (docs / "faq.txt").unlink()
        report = index.refresh()
    assert report.removed == ("faq.txt",) and report.files == 1
    with open_index(docs) as index:
        assert not index.search("export", limit=3), "a deleted file's passages are gone, also for the next process"


def test_bm25_ranks_the_passage_sharing_more_and_rarer_words_first(tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    for n in range(8):
        (docs / f"filler{n}.txt").write_text("The data is loaded and the report is written.\n", encoding="utf-8")
    (docs / "some.txt").write_text("The timeout of a cell is set in the data section.\n", encoding="utf-8")
    (docs / "best.txt").write_text("A cell timeout: execution.timeout sets the cell timeout in seconds.\n", encoding="utf-8")
    with open_index(docs) as index:
        index.refresh()
        hits = index.search("How do I change the cell timeout?", limit=3)
    assert [h.passage.path for h in hits[:2]] == ["best.txt", "some.txt"]
    assert hits[0].score < hits[1].score


def test_a_damaged_index_file_is_rebuilt_from_the_documents(docs: Path) -> None:
    (docs.parent / "docs_index.db").write_bytes(b"this is not an sqlite file" * 100)
    with open_index(docs) as index:
        index.refresh()
        assert index.search("bubblewrap", limit=1)


def test_hidden_files_and_files_of_other_kinds_are_not_documents(docs: Path) -> None:
    (docs / ".draft.md").write_text("secret bubblewrap plans", encoding="utf-8")
    (docs / "plot.png").write_bytes(b"\x89PNG bubblewrap")
    with open_index(docs) as index:
        report = index.refresh()
        hits = index.search("bubblewrap", limit=5)
    assert [h.passage.path for h in hits] == ["guide.md"] and report.ignored == ("plot.png",) and report.skipped == ()


def test_the_answer_cites_file_and_lines_within_the_token_cap(docs: Path) -> None:
    for n in range(6):
        (docs / f"part{n}.md").write_text(f"# Part {n}\n\n" + "The sandbox keeps the kernel apart. " * 30 + "\n", encoding="utf-8")
    tokenizer = get_tokenizer()
    with open_index(docs) as index:
        reply = answer(index, "sandbox kernel", top_k=6, max_tokens=300, tokenizer=tokenizer)
    assert tokenizer.count(reply) <= 300
    assert "[1] docs/" in reply and ".md:" in reply and "[6]" not in reply
    assert reply.count(DATA_OPEN) == reply.count(DATA_CLOSE) >= 1, "passages are marked as data, never instructions"


def test_the_answer_says_plainly_when_there_are_no_documents_or_no_match(tmp_path: Path, docs: Path) -> None:
    tokenizer = get_tokenizer()
    with DocumentIndex(tmp_path / "missing", tmp_path / "other_index.db") as index:
        assert "There is no docs/ folder" in answer(index, "anything", top_k=3, max_tokens=200, tokenizer=tokenizer)
    with open_index(docs) as index:
        assert answer(index, "quantum chromodynamics", top_k=3, max_tokens=200, tokenizer=tokenizer).startswith("No passage in docs/ (1 file)")


def test_a_request_becomes_a_query_of_its_words_whatever_its_punctuation() -> None:
    assert match_query('What is "NEAR(a b)" AND -x*?') == '"near" OR "b" OR "x"'
    assert match_query("?!") is None
