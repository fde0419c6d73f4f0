"""What both searches share: SQLite's FTS5 (checked once, with one clear line when it is missing) and a request turned into a query.

Documents and tips are ranked by FTS5's `bm25()`. A request is free text, full of punctuation that
FTS5's query language would read as syntax, so it becomes a plain OR of its quoted words, less the
most common English ones: a passage that shares more (and rarer) words with it ranks higher.
"""

from __future__ import annotations

import functools
import re
import sqlite3

from taskweaver_lite.errors import SearchUnavailableError

# The same split as FTS5's unicode61 tokenizer: letters and digits; '_' and punctuation separate.
_WORD = re.compile(r"[^\W_]+", re.UNICODE)
# Words too common to say what a request is about; without them BM25 does not reward mere length.
_COMMON = """a an and are as at be but by can could did do does for from had has have how i if in into is it its me my
no not of on or our please so some than that the their them then there these they this to us was we were what
when where which who why will with would you your"""
STOPWORDS = frozenset(_COMMON.split())
TOKENIZE = "porter unicode61"  # 'configuring' finds 'configure'


@functools.cache
def fts5_problem() -> str | None:
    """Why this Python's sqlite3 cannot search (no FTS5), or None when it can."""
    db = sqlite3.connect(":memory:")
    try:
        db.execute(f"CREATE VIRTUAL TABLE probe USING fts5(text, tokenize='{TOKENIZE}')")
    except sqlite3.OperationalError as exc:
        return (
            f"this Python's sqlite3 (SQLite {sqlite3.sqlite_version}) has no FTS5 full-text search ({exc}); "
            "use a Python whose SQLite is built with FTS5 (python.org, Debian and conda builds are)"
        )
    finally:
        db.close()
    return None


def require_fts5(what: str) -> None:
    """Raise SearchUnavailableError naming `what` needs FTS5, when this sqlite3 lacks it."""
    problem = fts5_problem()
    if problem is not None:
        raise SearchUnavailableError(f"{what} is off: {problem}")


def match_query(text: str) -> str | None:
    """An FTS5 MATCH expression for free text: its distinct words OR-ed, quoted; None when no word is left."""
    words = [w.lower() for w in _WORD.findall(text)]
    kept = [w for w in dict.fromkeys(words) if w not in STOPWORDS] or list(dict.fromkeys(words))
    if not kept:
        return None
    return " OR ".join(f'"{w}"' for w in kept[:64])
