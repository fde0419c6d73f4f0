"""A project's experience: tips stored by `/save` and handcrafted ones, and the few that fit a request.

    experience = Experience(store=store, folder=project / "experience", settings=config.experience)
    experience.block("plot monthly sales", tokenizer=tokenizer, max_tokens=400)   # '' when none fits

Each request is matched against every tip by FTS5's BM25 in an in-memory index, rebuilt only when
the stored tips or the handcrafted files change. A store that searches its own tips (PostgreSQL, by
`tsvector`) ranks the stored ones itself; the handcrafted ones are still ranked in memory, and the
two lists are interleaved, best first. With an `owner`, only the tips from that user's sessions (and
from sessions made without users) are listed, found or deleted; `for_owner` gives one owner's view
of a project's experience (a workspace's, opened once) that reads the handcrafted files with it. At most `experience.top_k` tips are shown, within
a token cap, in a message that opens the current round (roles/role.py `with_tips`): after the static
instructions, so those stay cached. TaskWeaver instead puts every tip above a cosine-similarity
threshold into the system prompt, with no cap, and needs an embedding model for it.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from taskweaver_lite.errors import ExperienceError
from taskweaver_lite.knowledge.fts import TOKENIZE, fts5_problem, match_query
from taskweaver_lite.knowledge.tips import HandcraftedTips, read_handcrafted
from taskweaver_lite.llm.templates import load_prompt
from taskweaver_lite.records.tips import KIND_LABELS, Tip, TipKind

if TYPE_CHECKING:
    from taskweaver_lite.config.settings import ExperienceConfig
    from taskweaver_lite.llm.tokens import Tokenizer


class TipStore(Protocol):
    """What experience needs of a session store (the store implements it; knowledge does not import the store)."""

    def save_tips(self, session_id: str, tips: Sequence[tuple[TipKind, str]]) -> list[Tip]: ...
    def stored_tips(self, *, owner: str | None = None) -> list[Tip]: ...
    def tips_version(self) -> tuple[int, int]: ...
    def delete_tip(self, tip_id: int, *, owner: str | None = None) -> bool: ...
    def search_tips(self, text: str, *, owner: str | None = None, limit: int) -> list[Tip] | None: ...


class Experience:
    """The tips of one project: listing, saving, deleting, and picking the ones that fit a request."""

    def __init__(self, *, store: TipStore | None, folder: Path, settings: ExperienceConfig, owner: str | None = None) -> None:
        self._store = store
        self.owner = owner
        self.folder = folder
        self.settings = settings
        self._lock = threading.Lock()
        self._key: object = None
        self._index: _TipIndex | None = None
        self._files = _HandcraftedFolder(folder)
        self._this_request: dict[str, list[Tip]] = {}  # what `relevant` found for each text since `new_request`

    def new_request(self) -> None:
        """A new request begins: the tips are searched again (within one, each text is searched once, whichever prompt asks)."""
        with self._lock:
            self._this_request = {}

    def for_owner(self, owner: str | None) -> Experience:
        """The same project's tips as `owner` may see them; the handcrafted files stay read once for every owner."""
        other = Experience(store=self._store, folder=self.folder, settings=self.settings, owner=owner)
        other._files = self._files
        return other

    def problems(self) -> list[str]:
        """One line per thing that keeps tips out: a broken handcrafted file, an SQLite without FTS5."""
        lines = list(self._files.read().problems)
        missing = fts5_problem()
        if missing is not None and self.settings.enabled:
            lines.append(f"experience retrieval is off: {missing}")
        return lines

    def all(self) -> list[Tip]:
        """Every tip: the stored ones, oldest first, then the handcrafted ones."""
        stored = self._store.stored_tips(owner=self.owner) if self._store is not None else []
        return [*stored, *self._files.read().tips]

    def save(self, session_id: str, tips: Sequence[tuple[TipKind, str]]) -> list[Tip]:
        """Store tips distilled from `session_id` in place of its earlier ones (none given: those stay); ExperienceError without a store."""
        if self._store is None:
            raise ExperienceError("this session has no store, so tips cannot be kept")
        self.new_request()  # its own saves count at once
        return self._store.save_tips(session_id, tips) if tips else []

    def delete(self, tip_id: str) -> Tip:
        """Delete a stored tip by its number (`7` or `#7`); for a handcrafted one, ExperienceError names the file to edit."""
        number = tip_id.removeprefix("#")
        self.new_request()  # its own deletes count at once
        stored = {tip.id: tip for tip in (self._store.stored_tips(owner=self.owner) if self._store is not None else [])}
        if number in stored and self._store is not None:
            if not self._store.delete_tip(int(number), owner=self.owner):
                raise ExperienceError(f"tip {number} was saved before there were users and is everyone's: an admin may delete it")
            return stored[number]
        handcrafted = next((tip for tip in self._files.read().tips if tip.id in (tip_id, number)), None)
        if handcrafted is not None:
            raise ExperienceError(f"tip {handcrafted.id} is {KIND_LABELS[handcrafted.kind]}: delete or edit {self.folder / handcrafted.source} to remove it")
        raise ExperienceError(f"there is no tip {tip_id}; /experience lists them with their ids")

    def relevant(self, text: str) -> list[Tip]:
        """The top `experience.top_k` tips for `text`, best first (none when experience is off or nothing matches).

        Searched once per text within a request (`new_request`): a role's prompts for one request
        (the Planner's before and after each step) show the same tips, and the store is asked once.
        """
        with self._lock:
            found = self._this_request.get(text)
        if found is None:
            found = self._search(text)
            with self._lock:
                self._this_request[text] = found
        return list(found)

    def _search(self, text: str) -> list[Tip]:
        if not self.settings.enabled or fts5_problem() is not None:
            return []
        query = match_query(text)
        if query is None:
            return []
        limit = self.settings.top_k
        found = self._store.search_tips(text, owner=self.owner, limit=limit) if self._store is not None else None
        with self._lock:
            if found is not None:  # the store ranked its own tips: only the handcrafted ones are searched here
                key: object = ("files", self._files.key())
            else:
                key = (self._store.tips_version() if self._store is not None else None, self._files.key())
            if self._index is None or key != self._key:  # the tips are read again only when they changed
                tips = list(self._files.read().tips) if found is not None else self.all()
                self._index, self._key = _TipIndex(tips), key
            here = self._index.search(query, limit=limit)
        if found is None:
            return here
        return _interleaved(found, here)[:limit]

    def block(self, text: str, *, tokenizer: Tokenizer, max_tokens: int) -> str:
        """The tips for `text` as prompt text within `max_tokens` (and `experience.max_tokens`); '' when none."""
        cap = min(max_tokens, self.settings.max_tokens)
        template = load_prompt("experience")
        lines: list[str] = []
        for tip in self.relevant(text):
            line = f"[{KIND_LABELS[tip.kind]}] {' '.join(tip.text.split())}"
            if tokenizer.count(template.render("tips", tips=[*lines, line])) > cap:
                if not lines:  # the best tip, cut to fit, rather than none
                    room = cap - tokenizer.count(template.render("tips", tips=[""]))
                    if room >= 16:
                        lines.append(tokenizer.truncate_middle(line, room))
                break
            lines.append(line)
        return template.render("tips", tips=lines) if lines else ""


class _HandcraftedFolder:
    """The handcrafted tips of one folder, read again only when its files change; shared by the owners' views of a project."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._lock = threading.Lock()
        self._tips = HandcraftedTips()
        self._key: object = None

    def read(self) -> HandcraftedTips:
        """The tips as the files are now."""
        key = self.key()
        with self._lock:
            if key != self._key:
                self._tips, self._key = read_handcrafted(self.folder), key
            return self._tips

    def key(self) -> object:
        """What the handcrafted files are now: names, sizes, modification times."""
        if not self.folder.is_dir():
            return ()
        return tuple((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(self.folder.iterdir()) if p.suffix in (".yaml", ".yml"))


def _interleaved(first: Sequence[Tip], second: Sequence[Tip]) -> list[Tip]:
    """The best of each list in turn: two rankings on different scales are merged by rank, not by score."""
    merged: list[Tip] = []
    for n in range(max(len(first), len(second))):
        merged += [*first[n : n + 1], *second[n : n + 1]]
    return merged


class _TipIndex:
    """An in-memory FTS5 table of tips (a few hundred at most): built in milliseconds, searched by BM25."""

    def __init__(self, tips: Sequence[Tip]) -> None:
        self._tips = list(tips)
        self._db = sqlite3.connect(":memory:", check_same_thread=False)
        self._db.execute(f"CREATE VIRTUAL TABLE tips USING fts5(text, tokenize='{TOKENIZE}')")
        self._db.executemany("INSERT INTO tips (rowid, text) VALUES (?, ?)", [(n, tip.text) for n, tip in enumerate(self._tips)])

    def search(self, query: str, *, limit: int) -> list[Tip]:
        rows = self._db.execute("SELECT rowid FROM tips WHERE tips MATCH ? ORDER BY bm25(tips) LIMIT ?", (query, limit)).fetchall()
        return [self._tips[int(r[0])] for r in rows]
