"""The `document_retriever` role: answers from the project's documents, offline (built in, off by default).

    session:
      roles: [planner, code_interpreter, document_retriever]
    document_retriever: {folder: docs, top_k: 4, max_tokens: 700}

The Planner sends it a query; it answers with the passages of `PROJECT_DIR/docs/` that match best
(BM25 over an SQLite FTS5 index in `PROJECT_DIR/docs_index.db`, brought up to date before each
search), each cited as `docs/file:line`, within its token cap; with no documents or no match it
says so. No model call: it needs only SQLite's FTS5 (`requires: fts5`), and is off without it.
"""

from __future__ import annotations

import threading
from pathlib import Path

from taskweaver_lite.config.settings import DocumentRetrieverConfig
from taskweaver_lite.knowledge.doc_index import DocumentIndex, answer
from taskweaver_lite.records.conversation import Post
from taskweaver_lite.roles.worker import RoleRequest, RoleTools

INDEX_FILE = "docs_index.db"
# A reply is part of the Planner's current round: at most this fraction of a role's budget.
REPLY_SHARE = 6

DOCUMENT_RETRIEVER_INTRO = """\
- DocumentRetriever searches the project's documents (its docs/ folder: notes, guides, code, notebooks)
  and returns the passages that match a query best, each cited as file:line.
- Send it a self-contained query with the words the answer would contain; it runs no code and reads no data files."""


class DocumentRetriever:
    """Answers a query with the best passages of the documents folder, cited by file and line."""

    def __init__(self) -> None:
        self._index: DocumentIndex | None = None
        self._lock = threading.Lock()

    def reply(self, request: RoleRequest, tools: RoleTools) -> Post:
        """The passages that match the request, or plainly why there are none."""
        section = tools.config if isinstance(tools.config, DocumentRetrieverConfig) else DocumentRetrieverConfig()
        cap = min(section.max_tokens, tools.context.budget // REPLY_SHARE)
        with self._lock:
            index = self._open(tools, section)
            text = answer(index, request.message, top_k=section.top_k, max_tokens=cap, tokenizer=tools.context.tokenizer, shown_as=section.folder)
        return request.answer(text)

    def _open(self, tools: RoleTools, section: DocumentRetrieverConfig) -> DocumentIndex:
        """The index, opened on first use; its file is in the project folder (a cache, rebuilt when damaged)."""
        if self._index is None:
            folder = Path(section.folder).expanduser()
            docs = folder if folder.is_absolute() else tools.project_dir / folder
            self._index = DocumentIndex(docs, tools.project_dir / INDEX_FILE)
        return self._index
