"""One cell's output as it streams in: text bounded for prompts, the full text on disk, images as files.

Every text field keeps its head and tail within the budget and says how much it left out; the
complete text goes, in arrival order, to one file per cell that the cut text names. Large output
moves to that file while it streams, so a cell printing in a loop until its timeout cannot fill
our memory.
"""

from __future__ import annotations

import base64
import re
from pathlib import Path
from typing import IO, Any

from taskweaver_lite.execution import ExecutionError, ExecutionResult

# CSI sequences (colours, cursor moves) and OSC sequences (terminal titles, hyperlinks).
_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)")
IMAGE_SUFFIXES = {"image/png": ".png", "image/jpeg": ".jpg", "image/svg+xml": ".svg"}
# Text kept in memory before the transcript moves to disk.
SPILL_CHARS = 1_000_000


def strip_ansi(text: str) -> str:
    """Remove terminal escape codes (tracebacks are coloured by IPython)."""
    return _ANSI.sub("", text) if "\x1b" in text else text


class _Clip:
    """The head and tail of a growing text, and how long it is in total."""

    def __init__(self, budget: int) -> None:
        self._head_room = budget // 2
        self._tail_room = budget - self._head_room
        self._head: list[str] = []
        self._head_len = 0
        self._tail = ""
        self.size = 0

    def add(self, text: str) -> None:
        self.size += len(text)
        if self._head_len < self._head_room:
            taken = text[: self._head_room - self._head_len]
            self._head.append(taken)
            self._head_len += len(taken)
            text = text[len(taken) :]
        if text:
            self._tail = (self._tail + text)[-self._tail_room :]

    @property
    def omitted(self) -> int:
        return self.size - self._head_len - len(self._tail)

    def text(self, full_path: Path) -> str:
        head = "".join(self._head)
        if self.omitted <= 0:
            return head + self._tail
        return f"{head}\n... [{self.omitted:,} characters omitted; full output in {full_path}] ...\n{self._tail}"


def _clipped(text: str, budget: int) -> _Clip:
    clip = _Clip(budget)
    clip.add(text)
    return clip


class _Transcript:
    """The cell's complete text in arrival order: in memory while small, then streamed to its file."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._parts: list[str] = []
        self._size = 0
        self._file: IO[str] | None = None

    def add(self, text: str) -> None:
        if self._file is not None:
            self._file.write(text)
            return
        self._parts.append(text)
        self._size += len(text)
        if self._size > SPILL_CHARS:
            self._file = self.path.open("w", encoding="utf-8")
            self._file.write("".join(self._parts))
            self._parts = []

    def save(self, *, needed: bool) -> str | None:
        """Close the file (writing it first if `needed` and still in memory); its path, if written."""
        if self._file is not None:
            self._file.close()
            self._file = None
            return str(self.path)
        if not needed:
            return None
        self.path.write_text("".join(self._parts), encoding="utf-8")
        return str(self.path)


class CellOutput:
    """Collects one cell's iopub messages into the output fields of an `ExecutionResult`."""

    def __init__(self, *, budget: int, transcript_path: Path, artifacts_dir: Path, stem: str) -> None:
        self._budget = budget
        self._artifacts_dir = artifacts_dir
        self._stem = stem
        self._transcript = _Transcript(transcript_path)
        self._stdout = _Clip(budget)
        self._stderr = _Clip(budget)
        self._displays: list[_Clip] = []
        self._result: _Clip | None = None
        self._result_html: _Clip | None = None
        self._error: tuple[str, _Clip, _Clip] | None = None
        self._artifacts: list[str] = []

    def add(self, msg_type: str, content: dict[str, Any]) -> None:
        """Take one iopub message that belongs to this cell."""
        if msg_type == "stream":
            text = strip_ansi(str(content.get("text", "")))
            (self._stderr if content.get("name") == "stderr" else self._stdout).add(text)
            self._transcript.add(text)
        elif msg_type in ("display_data", "update_display_data"):
            data = content.get("data") or {}
            # A figure's text/plain is just "<Figure size 640x480 ...>": the saved file says more.
            if not self._save_images(data):
                text = _plain_text(data)
                if text:
                    self._displays.append(_clipped(text, self._budget))
                    self._transcript.add(text + "\n")
        elif msg_type == "execute_result":
            data = content.get("data") or {}
            self._save_images(data)
            text = _plain_text(data)
            self._result = _clipped(text, self._budget)
            self._transcript.add(text + "\n")
            if "text/html" in data:
                self._result_html = _clipped(str(data["text/html"]), self._budget)
        elif msg_type == "error":
            traceback = strip_ansi("\n".join(content.get("traceback") or []))
            value = strip_ansi(str(content.get("evalue", "")))
            self._error = (str(content.get("ename", "Error")), _clipped(value, self._budget), _clipped(traceback, self._budget))
            self._transcript.add(traceback + "\n")

    def finish(self, code: str) -> ExecutionResult:
        """The result's output fields; `success` means no error was raised (the caller adds status)."""
        path = self._transcript.path
        clips = [self._stdout, self._stderr, *self._displays, self._result, self._result_html]
        if self._error is not None:
            clips += [self._error[1], self._error[2]]
        cut = any(clip is not None and clip.omitted > 0 for clip in clips)
        full_output_path = self._transcript.save(needed=cut)
        error = None
        if self._error is not None:
            name, value, traceback = self._error
            error = ExecutionError(name=name, value=value.text(path), traceback=traceback.text(path))
        return ExecutionResult(
            code=code,
            success=error is None,
            stdout=self._stdout.text(path),
            stderr=self._stderr.text(path),
            result=self._result.text(path) if self._result is not None else None,
            result_html=self._result_html.text(path) if self._result_html is not None else None,
            error=error,
            displays=tuple(clip.text(path) for clip in self._displays),
            artifacts=tuple(self._artifacts),
            full_output_path=full_output_path,
        )

    def close(self) -> None:
        """Release the transcript file when the cell is abandoned (Ctrl-C)."""
        self._transcript.save(needed=False)

    def _save_images(self, data: dict[str, Any]) -> bool:
        saved = False
        for mime, suffix in IMAGE_SUFFIXES.items():
            if mime not in data:
                continue
            path = self._artifacts_dir / f"{self._stem}-{len(self._artifacts) + 1}{suffix}"
            payload = data[mime]
            if mime == "image/svg+xml":
                path.write_text(payload if isinstance(payload, str) else "".join(payload), encoding="utf-8")
            else:
                path.write_bytes(base64.b64decode(payload))
            self._artifacts.append(str(path))
            saved = True
        return saved


def _plain_text(data: dict[str, Any]) -> str:
    for mime in ("text/plain", "text/markdown", "text/html"):
        value = data.get(mime)
        if value:
            return strip_ansi(value if isinstance(value, str) else "".join(value))
    return ""
