"""`taskweaver-lite docs`: what the document retriever can search, file by file, and why a file is not searched."""

from __future__ import annotations

import json
from pathlib import Path

from taskweaver_lite.config.file import load_config
from taskweaver_lite.knowledge.doc_index import DocumentIndex
from taskweaver_lite.roles.document_retriever import INDEX_FILE
from taskweaver_lite.safety.terminal import strip_controls


def run_docs(project: Path, *, as_json: bool) -> int:
    """Bring the index up to date and list each document: its passages, or the reason it is skipped."""
    config = load_config(project)
    folder = Path(config.document_retriever.folder).expanduser()
    docs = folder if folder.is_absolute() else config.project_dir / folder
    with DocumentIndex(docs, config.state_dir / INDEX_FILE) as index:
        report = index.refresh()
        documents = index.documents()
    if as_json:
        rows = [{"file": name, "passages": passages, "skipped": skipped} for name, passages, skipped in documents]
        print(json.dumps({"folder": str(docs), "documents": rows, "other_files": list(report.ignored)}, indent=2))
        return 0
    if not report.folder_exists:
        print(f"No documents folder: {docs} does not exist (document_retriever.folder).")
        return 0
    width = max((len(name) for name, _, _ in documents), default=4)
    for name, passages, skipped in documents:
        state = f"skipped: {skipped}" if skipped else f"{passages} passage{'s' if passages != 1 else ''}"
        print(strip_controls(f"{name:<{width}}  {state}"))
    other = f"; {len(report.ignored)} other file{'s' if len(report.ignored) != 1 else ''} (not documents)" if report.ignored else ""
    counted = f"{report.files} document{'s' if report.files != 1 else ''}, {report.passages} passage{'s' if report.passages != 1 else ''}"
    print(f"{counted} in {docs}{other}. Index: {index.index_path}")
    return 0
