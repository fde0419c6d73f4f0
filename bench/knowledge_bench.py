"""The document index and experience retrieval, measured: what keeping them current costs a request.

1. Documents: 300 Markdown files (~450 words each) indexed from scratch, against the check before
   each search when nothing changed (a stat per file), against that check with one file edited;
   and a search, against the check. The check is what every DocumentRetriever request pays.
2. Tips: 500 stored tips; picking the top 3 for a request with the in-memory FTS5 index already
   built, against building it (a new session's first request, or the first after a /save or a
   delete), against the
   store read that tells whether the tips changed (paid on every request).

Run: .venv/bin/python bench/knowledge_bench.py
"""

from __future__ import annotations

import random
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from taskweaver_lite.config.settings import ExperienceConfig
from taskweaver_lite.knowledge.doc_index import DocumentIndex
from taskweaver_lite.knowledge.experience import Experience
from taskweaver_lite.llm.tokens import get_tokenizer
from taskweaver_lite.store.database import SessionStore

WORDS = ("sales", "region", "revenue", "margin", "forecast", "quarter", "kernel", "sandbox", "plot", "column", "index", "merge", "pivot", "budget")
FILES = 300
TIPS = 500


def text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) + str(rng.randint(0, 400)) for _ in range(words))


def median_ms(action: Callable[[], object], runs: int) -> float:
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        action()
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1000


def documents(root: Path, rng: random.Random) -> None:
    docs = root / "docs"
    docs.mkdir()
    for n in range(FILES):
        body = "\n\n".join(f"## Section {s}\n\n{text(rng, 90)}" for s in range(5))
        (docs / f"note{n:03}.md").write_text(f"# Note {n}\n\n{body}\n", encoding="utf-8")
    started = time.perf_counter()
    with DocumentIndex(docs, root / "docs_index.db") as index:
        report = index.refresh()
        build = (time.perf_counter() - started) * 1000
        check = median_ms(index.refresh, 20)
        edited = docs / "note007.md"

        def edit_one() -> None:
            edited.write_text(edited.read_text(encoding="utf-8") + f"\n{text(rng, 20)}\n", encoding="utf-8")
            index.refresh()

        one = median_ms(edit_one, 10)
        search = median_ms(lambda: index.search(text(rng, 8), limit=4), 50)
    print(f"1. Documents: {FILES} files, {report.passages} passages")
    print(f"   index from scratch         {build:8.1f} ms")
    print(f"   check, nothing changed     {check:8.1f} ms   ({build / check:.0f}x less than the build)")
    print(f"   check with one file edited {one:8.1f} ms   ({one / check:.1f}x the check)")
    print(f"   search (top 4, BM25)       {search:8.1f} ms   ({search / check:.2f}x the check)")


def tips(root: Path, rng: random.Random) -> None:
    store = SessionStore(root / "sessions.db")
    store.create_session("bench", started=time.time())
    store.save_tips("bench", [("error_resolution" if n % 2 else "preference", text(rng, 30)) for n in range(TIPS)])
    experience = Experience(store=store, folder=root / "experience", settings=ExperienceConfig())
    tokenizer = get_tokenizer()

    def pick() -> str:
        return experience.block(text(rng, 12), tokenizer=tokenizer, max_tokens=400)

    def rebuild() -> str:
        # A new session's first request (or the first after a /save or a delete): the index is built.
        fresh = Experience(store=store, folder=root / "experience", settings=ExperienceConfig())
        return fresh.block(text(rng, 12), tokenizer=tokenizer, max_tokens=400)

    cached = median_ms(pick, 50)
    built = median_ms(rebuild, 10)
    version = median_ms(store.tips_version, 50)
    print(f"2. Tips: {TIPS} stored")
    print(f"   top 3 for a request, index built   {cached:7.2f} ms")
    print(f"   building the index first           {built:7.2f} ms   ({built / cached:.1f}x)")
    print(f"   of which the store's change check  {version:7.2f} ms   ({version / cached:.2f}x of a request's cost)")
    store.close()


def main() -> None:
    rng = random.Random(7)
    with tempfile.TemporaryDirectory() as tmp:
        documents(Path(tmp), rng)
        tips(Path(tmp), rng)


if __name__ == "__main__":
    main()
