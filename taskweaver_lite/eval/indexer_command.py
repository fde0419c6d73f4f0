"""TaskWeaver's document indexing, read for what it asks: the documents a case's document_retriever answers from.

A TaskWeaver case that asks its document_retriever builds a FAISS index first, with a `pre_command`
that runs TaskWeaver's own `scripts/document_indexer.py --doc_paths DOCS... --output_path INDEX`, and
names that index in `config_var` as `document_retriever.index_folder`. That script and its embedding
model are TaskWeaver's, not here; the built-in retriever (roles/document_retriever.py) indexes the
documents itself. So such a command is not run: it is read as "index these documents", said in one
line, and `index_folder` becomes `document_retriever.folder`: the documents the command indexed into
that folder, else the folder itself (its documents, if it has any, are what the retriever reads).

Paths are TaskWeaver's: relative to the folder its `auto_eval` runs in (runner.command_folder).
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

SCRIPT = "document_indexer.py"
INDEX_FOLDER = "document_retriever.index_folder"
_DOCS = ("-d", "--doc_paths", "--doc_path")
_OUTPUT = ("-o", "--output_path")


@dataclass(frozen=True)
class IndexCommand:
    """A pre_command that runs TaskWeaver's indexer: the documents it names (the first is the one read here) and the index it writes."""

    command: str
    docs: tuple[Path, ...]
    output: Path | None

    def line(self) -> str:
        """The one line a run's notes get for it."""
        others = f"; also named, not read: {', '.join(map(str, self.docs[1:]))}" if len(self.docs) > 1 else ""
        return (
            f"pre_command {self.command!r} read as: index the documents in {self.docs[0]} for the document_retriever "
            f"(its own index; TaskWeaver's indexer is not run){others}"
        )


def index_command(command: str, *, cwd: Path) -> IndexCommand | None:
    """`command` read as a run of TaskWeaver's indexer, paths resolved against `cwd`; None for any other command."""
    try:
        words = shlex.split(command)
    except ValueError:
        return None
    start = next((number for number, word in enumerate(words) if Path(word).name == SCRIPT), None)
    if start is None:
        return None
    docs: list[str] = []
    outputs: list[str] = []
    taking: list[str] | None = None  # the option whose values the words are
    for word in words[start + 1 :]:
        option, equals, value = word.partition("=")
        if option in _DOCS or option in _OUTPUT:
            taking = docs if option in _DOCS else outputs
            taking.extend([value] if equals else [])
        elif word.startswith("-"):
            taking = None  # an option of its own (--extensions, --chunk_size): not ours to read
        elif taking is not None:
            taking.append(word)
    output = outputs[0] if outputs else None
    found = docs or ["."]  # the script's default
    return IndexCommand(command, tuple((cwd / path).resolve() for path in found), (cwd / output).resolve() if output else None)


def documents_folder(index_folder: str, commands: Iterable[str], *, cwd: Path) -> Path:
    """Where the retriever finds the documents of `index_folder`: those an indexer command wrote into it, else the folder itself."""
    target = (cwd / index_folder).resolve()
    for command in commands:
        read = index_command(command, cwd=cwd)
        if read is not None and read.output == target:
            return read.docs[0]
    return target
