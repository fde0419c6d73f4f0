"""The project's documents as an SQLite FTS5 index: built on first use, brought up to date before each search.

    index = DocumentIndex(project / "docs", project / "docs_index.db")
    report = index.refresh()          # new, changed and deleted files; skipped ones with the reason
    hits = index.search("how is the sandbox configured", limit=4)   # best first, by BM25

The index is a cache in its own file (beside the session store): a damaged one, or one from
another version, is rebuilt. A file is read again when its size or modification time changed and
its content hash did too; a deleted file's passages go with it. Refreshes from several processes
take turns on SQLite's write lock, so each sees the other's work.
"""

from __future__ import annotations

import hashlib
import os
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from taskweaver_lite.errors import SearchUnavailableError
from taskweaver_lite.knowledge.fts import TOKENIZE, match_query, require_fts5
from taskweaver_lite.knowledge.passages import SUFFIXES, Passage, Unreadable, pdf_support, read_passages
from taskweaver_lite.records.execution import as_data

if TYPE_CHECKING:
    from taskweaver_lite.llm.tokens import Tokenizer

INDEX_VERSION = 1
BUSY_TIMEOUT_SECONDS = 30.0
HEADING_WEIGHT = 2.0
QUOTED_CHARS = 120  # a word in a section title says more about the passage than one in its text

_SCHEMA = (
    "CREATE TABLE files (path TEXT PRIMARY KEY, mtime_ns INTEGER NOT NULL, size INTEGER NOT NULL, sha256 TEXT NOT NULL, reader TEXT NOT NULL, skipped TEXT)",
    "CREATE VIRTUAL TABLE passages USING fts5(heading, text, path UNINDEXED, part UNINDEXED,"
    f" first_line UNINDEXED, last_line UNINDEXED, tokenize='{TOKENIZE}')",
)


@dataclass(frozen=True)
class Hit:
    """A passage that matched, with its BM25 score (lower is better, as FTS5 gives it)."""

    passage: Passage
    score: float


@dataclass(frozen=True)
class IndexReport:
    """What a refresh found: files indexed, what changed, and what was skipped and why."""

    folder_exists: bool
    files: int = 0  # files with passages in the index
    passages: int = 0
    added: tuple[str, ...] = ()
    changed: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()
    skipped: tuple[tuple[str, str], ...] = field(default=())  # (file, reason): documents that could not be read
    ignored: tuple[str, ...] = ()  # files of other kinds (images, data), not documents


class DocumentIndex:
    """The FTS5 index of one documents folder, kept in `index_path`."""

    def __init__(self, docs_dir: Path, index_path: Path) -> None:
        """Open (or create, or rebuild) the index file; SearchUnavailableError when sqlite3 has no FTS5."""
        require_fts5("the document search")
        self.docs_dir = Path(docs_dir)
        self.index_path = Path(index_path)
        self._db = self._open()

    def _open(self) -> sqlite3.Connection:
        self.index_path.parent.mkdir(parents=True, exist_ok=True)
        try:
            return self._connect()
        except sqlite3.DatabaseError:
            # A cache: a damaged file or another version's is rebuilt from the documents.
            for suffix in ("", "-wal", "-shm"):
                Path(f"{self.index_path}{suffix}").unlink(missing_ok=True)
            return self._connect()

    def _connect(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.index_path, timeout=BUSY_TIMEOUT_SECONDS, isolation_level=None, check_same_thread=False)
        try:
            db.execute("PRAGMA journal_mode=WAL")
            version = int(db.execute("PRAGMA user_version").fetchone()[0])
            if version not in (0, INDEX_VERSION):
                raise sqlite3.DatabaseError(f"index version {version}")
            if version == 0:
                db.execute("BEGIN IMMEDIATE")
                if int(db.execute("PRAGMA user_version").fetchone()[0]) == 0:  # not made by another process meanwhile
                    for statement in _SCHEMA:
                        db.execute(statement)
                    db.execute(f"PRAGMA user_version = {INDEX_VERSION}")
                db.execute("COMMIT")
        except sqlite3.DatabaseError:
            db.close()
            raise
        return db

    def refresh(self) -> IndexReport:
        """Bring the index up to date with the folder: read new and changed files, forget deleted ones."""
        found = dict(self._files())
        present = {name: path for name, path in found.items() if path.suffix.lower() in SUFFIXES}
        reader = _reader_key()
        added: list[str] = []
        changed: list[str] = []
        with self._transaction() as db:
            known = {row[0]: row[1:] for row in db.execute("SELECT path, mtime_ns, size, sha256, reader FROM files")}
            for name, path in present.items():
                outcome = self._update(db, name, path, known.get(name), reader=reader)
                if outcome == "added":
                    added.append(name)
                elif outcome == "changed":
                    changed.append(name)
            removed = sorted(set(known) - set(present))
            for name in removed:
                db.execute("DELETE FROM passages WHERE path = ?", (name,))
                db.execute("DELETE FROM files WHERE path = ?", (name,))
            skipped = tuple((str(r[0]), str(r[1])) for r in db.execute("SELECT path, skipped FROM files WHERE skipped IS NOT NULL ORDER BY path"))
            files = db.execute("SELECT COUNT(*) FROM files WHERE skipped IS NULL").fetchone()[0]
            passages = db.execute("SELECT COUNT(*) FROM passages").fetchone()[0]
        return IndexReport(
            folder_exists=self.docs_dir.is_dir(),
            files=files,
            passages=passages,
            added=tuple(added),
            changed=tuple(changed),
            removed=tuple(removed),
            skipped=skipped,
            ignored=tuple(sorted(set(found) - set(present))),
        )

    def _update(self, db: sqlite3.Connection, name: str, path: Path, known: tuple[int, int, str, str] | None, *, reader: str) -> str:
        """Index one file if it is new or changed; returns 'added', 'changed' or 'same'."""
        try:
            stat = os.stat(path)
            if known is not None and known[0] == stat.st_mtime_ns and known[1] == stat.st_size and known[3] == reader:
                return "same"
            digest = hashlib.sha256(path.read_bytes()).hexdigest()
        except FileNotFoundError:
            return "same"  # deleted since the folder was listed: the next refresh forgets it
        except OSError as exc:  # unreadable (permissions): listed as skipped, with the reason
            return self._store(db, name, [], skipped=f"cannot be read ({exc.strerror or exc})", fingerprint=(0, 0, ""), reader=reader, known=known)
        if known is not None and known[2] == digest and known[3] == reader:
            db.execute("UPDATE files SET mtime_ns = ?, size = ? WHERE path = ?", (stat.st_mtime_ns, stat.st_size, name))
            return "same"  # touched, not changed
        try:
            passages, skipped = read_passages(path, name=name), None
        except Unreadable as exc:
            passages, skipped = [], str(exc)
        except OSError as exc:
            passages, skipped = [], f"cannot be read ({exc.strerror or exc})"
        return self._store(db, name, passages, skipped=skipped, fingerprint=(stat.st_mtime_ns, stat.st_size, digest), reader=reader, known=known)

    def _store(
        self,
        db: sqlite3.Connection,
        name: str,
        passages: list[Passage],
        *,
        skipped: str | None,
        fingerprint: tuple[int, int, str],
        reader: str,
        known: object,
    ) -> str:
        """Replace one file's passages and its row; 'added' or 'changed'."""
        db.execute("DELETE FROM passages WHERE path = ?", (name,))
        db.executemany(
            "INSERT INTO passages (heading, text, path, part, first_line, last_line) VALUES (?, ?, ?, ?, ?, ?)",
            [(p.heading, p.text, p.path, p.part, p.first_line, p.last_line) for p in passages],
        )
        db.execute(
            "INSERT INTO files (path, mtime_ns, size, sha256, reader, skipped) VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (path) DO UPDATE SET"
            " mtime_ns = excluded.mtime_ns, size = excluded.size, sha256 = excluded.sha256, reader = excluded.reader, skipped = excluded.skipped",
            (name, *fingerprint, reader, skipped),
        )
        return "added" if known is None else "changed"

    def documents(self) -> list[tuple[str, int, str | None]]:
        """Every document the index knows, as (file, passages, the reason it was skipped or None), by name."""
        with self._errors():
            counts = dict(self._db.execute("SELECT path, COUNT(*) FROM passages GROUP BY path").fetchall())
            rows = self._db.execute("SELECT path, skipped FROM files ORDER BY path").fetchall()
        return [(str(path), int(counts.get(path, 0)), skipped) for path, skipped in rows]

    def search(self, text: str, *, limit: int) -> list[Hit]:
        """The passages that best match `text`, best first (BM25, a title's words counting double)."""
        query = match_query(text)
        if query is None:
            return []
        with self._errors():
            rows = self._db.execute(
                "SELECT path, part, first_line, last_line, heading, text, bm25(passages, ?, 1.0) AS score"
                " FROM passages WHERE passages MATCH ? ORDER BY score LIMIT ?",
                (HEADING_WEIGHT, query, limit),
            ).fetchall()
        return [Hit(Passage(path=r[0], part=r[1], first_line=int(r[2]), last_line=int(r[3]), heading=r[4], text=r[5]), score=float(r[6])) for r in rows]

    def close(self) -> None:
        """Close the index file."""
        self._db.close()

    def __enter__(self) -> DocumentIndex:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _files(self) -> Iterator[tuple[str, Path]]:
        """Every regular file under the folder (hidden ones and hidden folders left out), by its name in citations."""
        if self.docs_dir.is_dir():
            yield from _walk(self.docs_dir, prefix="")

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        with self._errors():
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                if self._db.in_transaction:
                    self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    @contextmanager
    def _errors(self) -> Iterator[None]:
        try:
            yield
        except sqlite3.Error as exc:
            raise SearchUnavailableError(
                f"{self.index_path}: the document index could not be read or written ({exc}); delete the file and it is rebuilt"
            ) from None


def _walk(folder: Path, *, prefix: str) -> Iterator[tuple[str, Path]]:
    """Files below `folder`, sorted, with os.scandir: a check of a folder runs before every search, so no pathlib per file."""
    with os.scandir(folder) as listing:
        entries = sorted(listing, key=lambda e: e.name)
    for entry in entries:
        if entry.name.startswith("."):
            continue
        if entry.is_dir(follow_symlinks=False):
            yield from _walk(Path(entry.path), prefix=f"{prefix}{entry.name}/")
        elif entry.is_file(follow_symlinks=False):
            yield f"{prefix}{entry.name}", Path(entry.path)


def _reader_key() -> str:
    """What the readers can read now: when it changes (pypdf installed), every file is read again."""
    return f"{INDEX_VERSION}:{'pdf' if pdf_support() is None else 'no-pdf'}"


def answer(index: DocumentIndex, query: str, *, top_k: int, max_tokens: int, tokenizer: Tokenizer, shown_as: str = "docs") -> str:
    """The document search's reply: the best passages with `file:line` citations within `max_tokens`, or plainly why there are none."""
    report = index.refresh()
    skipped = _skipped_line(report, shown_as)
    if not report.folder_exists:
        return f"There is no {shown_as}/ folder in the project ({index.docs_dir}), so there are no documents to search."
    if not report.files:
        other = f" ({len(report.ignored)} files of other kinds)" if report.ignored else ""
        return f"{shown_as}/ holds no document the search can read (.md, .txt, .rst, .py, .ipynb, .pdf){other}.{skipped}"
    hits = index.search(query, limit=top_k)
    scope = f"{report.files} file{'s' if report.files != 1 else ''}"
    if not hits:
        return f'No passage in {shown_as}/ ({scope}) matches "{_quoted(query)}". Try other words.{skipped}'
    head = f'Passages from {shown_as}/ ({scope}) for "{_quoted(query)}", best first; cite them by file:line:'
    parts = [head]
    room = max_tokens - tokenizer.count(head) - tokenizer.count(skipped)
    for number, hit in enumerate(hits, 1):
        title = f" ({hit.passage.heading})" if hit.passage.heading else ""
        # A document's words are data, like a cell's output: the prompts tell the roles never to obey them.
        block = f"[{number}] {shown_as}/{hit.passage.citation()}{title}\n{as_data(hit.passage.text)}"
        cost = tokenizer.count(block) + 2
        if cost > room:
            if number == 1:  # the best passage, cut to fit, rather than nothing
                parts.append(tokenizer.truncate_middle(block, max(room, 32)))
            break
        parts.append(block)
        room -= cost
    return "\n\n".join(parts) + skipped


def _quoted(query: str, limit: int = QUOTED_CHARS) -> str:
    """The query on one line, cut when long: the reply repeats it only to say what was searched."""
    line = " ".join(query.split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


def _skipped_line(report: IndexReport, shown_as: str) -> str:
    if not report.skipped:
        return ""
    listed = "; ".join(f"{shown_as}/{name}: {reason}" for name, reason in report.skipped[:3])
    more = f"; and {len(report.skipped) - 3} more" if len(report.skipped) > 3 else ""
    return f"\n(Not searched: {listed}{more}.)"
