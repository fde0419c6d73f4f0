"""One cell's output as it streams in: text bounded for prompts, the full text on disk, images as files.

The prompt's share is one token limit per cell, for all fields together. The error comes first:
its name and message whole, then the last frames of its traceback; the other fields (output,
stderr, displays, the value) share the rest, each keeping its head and tail with a marker.
Repeated warning lines collapse into one line with a count before anything is cut. The complete
text goes, in arrival order, to one file per cell that the result names. While streaming, each
field keeps only a bounded head and tail in memory and large output moves to that file, so a cell
printing in a loop until its timeout cannot fill our memory.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from taskweaver_lite.llm.tokens import Tokenizer, get_tokenizer
from taskweaver_lite.records.execution import CellError, ExecutionResult
from taskweaver_lite.safety.terminal import strip_controls

IMAGE_SUFFIXES = {"image/png": ".png", "image/jpeg": ".jpg", "image/svg+xml": ".svg"}
IMAGE_MAGIC = {"image/png": b"\x89PNG\r\n\x1a\n", "image/jpeg": b"\xff\xd8"}
# Text kept in memory before the transcript moves to disk.
SPILL_CHARS = 1_000_000
# The most a cell's transcript file holds: a print loop writes gigabytes before its timeout; past
# this the file ends with a line saying how much more there was (the prompt's view keeps the tail).
TRANSCRIPT_MAX_CHARS = 50_000_000
# While streaming, each field keeps this many characters per token of the cell's limit, and at
# least MIN_KEPT_CHARS (head and tail): enough that repeated warnings collapse before anything is
# cut, bounded whatever the cell prints.
CHARS_PER_TOKEN_KEPT = 8
MIN_KEPT_CHARS = 100_000
# The error's share of the cell's limit when there is other output too.
ERROR_SHARE = 0.5
_WARNING = re.compile(r"warn", re.IGNORECASE)
_DIGITS = re.compile(r"\d+")


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

    def text(self, full_path: Path | None) -> str:
        """Head and tail with a marker naming the full output's file (None: it could not be saved)."""
        head = "".join(self._head)
        if self.omitted <= 0:
            return head + self._tail
        where = f"full output in {full_path}" if full_path is not None else "the full output could not be saved"
        return f"{head}\n... [{self.omitted:,} characters omitted; {where}] ...\n{self._tail}"


def _clipped(text: str, budget: int) -> _Clip:
    clip = _Clip(budget)
    clip.add(text)
    return clip


class _Transcript:
    """The cell's complete text in arrival order: in memory while small, then streamed to its file.

    A file that cannot be written (a full disk) never fails the cell: the transcript stops, keeps
    no more in memory, and `problem` says why, for the result's notices.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.problem: str | None = None
        self._parts: list[str] = []
        self._size = 0
        self._file: IO[str] | None = None
        self._max_chars = TRANSCRIPT_MAX_CHARS
        self._written = 0  # characters in the file so far
        self._dropped = 0  # characters past max_chars, not written

    def add(self, text: str) -> None:
        if self.problem is not None:
            return
        try:
            if self._file is not None:
                room = max(self._max_chars - self._written, 0)
                if len(text) > room:
                    self._dropped += len(text) - room
                    text = text[:room]
                self._file.write(text)
                self._written += len(text)
                return
            self._parts.append(text)
            self._size += len(text)
            if self._size > min(SPILL_CHARS, self._max_chars):
                self._file = self.path.open("w", encoding="utf-8")
                held, self._parts = "".join(self._parts), []
                self.add(held)
        except OSError as exc:
            self._give_up(exc)

    def save(self, *, needed: bool) -> str | None:
        """Close the file (writing it first if `needed` and still in memory); its path, if written."""
        try:
            if self._file is not None:
                file, self._file = self._file, None
                if self._dropped:
                    file.write(f"\n[... {self._dropped:,} more characters not saved: a cell's output file holds at most {self._max_chars:,} ...]\n")
                file.close()
                return str(self.path) if self.problem is None else None
            if not needed or self.problem is not None:
                return None
            self.path.write_text("".join(self._parts), encoding="utf-8")
            return str(self.path)
        except OSError as exc:
            self._give_up(exc)
            return None

    def _give_up(self, exc: OSError) -> None:
        self.problem = f"the full output could not be saved to {self.path} ({exc.strerror or exc}); what is shown here is all there is"
        self._parts = []
        if self._file is not None:
            with contextlib.suppress(OSError):  # closing flushes, which fails the same way
                self._file.close()
            self._file = None


@dataclass
class DisplayBudget:
    """The images a session's cells may keep: per cell and in all (`execution.display_per_cell`, `display_per_session`).

    An image past either is not saved (nor stored, nor shown); the cell says so in one line per cap.
    """

    per_cell: int | None
    per_session: int | None
    used: int = 0  # bytes of images the session's cells kept so far

    @classmethod
    def for_session(cls, caps: tuple[int | None, int | None], artifacts_dir: Path) -> DisplayBudget:
        """The budget of a session whose earlier cells kept what is in `artifacts_dir` (a resumed session's too)."""
        used = 0
        with contextlib.suppress(OSError), os.scandir(artifacts_dir) as entries:
            for entry in entries:
                with contextlib.suppress(OSError):
                    used += entry.stat(follow_symlinks=False).st_size
        return cls(per_cell=caps[0], per_session=caps[1], used=used)


class CellOutput:
    """Collects one cell's iopub messages into the output fields of an `ExecutionResult`."""

    def __init__(
        self,
        *,
        max_tokens: int,
        transcript_path: Path,
        artifacts_dir: Path,
        stem: str,
        tokenizer: Tokenizer | None = None,
        display: DisplayBudget | None = None,
    ) -> None:
        self._max_tokens = max_tokens
        self._tokenizer = tokenizer or get_tokenizer()
        budget = max(max_tokens * CHARS_PER_TOKEN_KEPT, MIN_KEPT_CHARS)
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
        self._problems: list[str] = []  # files that could not be written, for the result's notices
        self._display = display
        self._cell_images = 0  # bytes of images this cell kept
        self._left_out: dict[str, list[int]] = {}  # the setting whose cap an image passed -> the sizes of those not kept

    def add(self, msg_type: str, content: dict[str, Any]) -> None:
        """Take one iopub message that belongs to this cell; one the kernel garbled becomes a notice, never an exception.

        Code in the kernel decides what its messages hold (a `_repr_png_` returning text, a number
        where text belongs): whatever comes, the cell's other output and the session go on.
        """
        try:
            self._add(msg_type, content if isinstance(content, dict) else {})
        except (TypeError, ValueError, AttributeError, KeyError) as exc:
            self._problems.append(f"the kernel sent a {msg_type} message that could not be read ({type(exc).__name__}: {exc}); it was skipped")

    def _add(self, msg_type: str, content: dict[str, Any]) -> None:
        if msg_type == "stream":
            text = strip_controls(str(content.get("text", "")))
            (self._stderr if content.get("name") == "stderr" else self._stdout).add(text)
            self._transcript.add(text)
        elif msg_type in ("display_data", "update_display_data"):
            data = _mime_bundle(content)
            # A figure's text/plain is just "<Figure size 640x480 ...>": the saved file says more.
            if not self._save_images(data):
                text = _plain_text(data)
                if text:
                    self._displays.append(_clipped(text, self._budget))
                    self._transcript.add(text + "\n")
        elif msg_type == "execute_result":
            data = _mime_bundle(content)
            self._save_images(data)
            text = _plain_text(data)
            self._result = _clipped(text, self._budget)
            self._transcript.add(text + "\n")
            if "text/html" in data:
                html = data["text/html"]
                self._result_html = _clipped("".join(map(str, html)) if isinstance(html, list) else str(html), self._budget)
        elif msg_type == "error":
            lines = content.get("traceback") or []
            traceback = strip_controls("\n".join(map(str, lines)) if isinstance(lines, list) else str(lines))
            value = strip_controls(str(content.get("evalue", "")))
            self._error = (strip_controls(str(content.get("ename", "Error"))), _clipped(value, self._budget), _clipped(traceback, self._budget))
            self._transcript.add(traceback + "\n")

    def finish(self, code: str) -> ExecutionResult:
        """The result's output fields within the cell's token limit; `success` means no error was raised."""
        path = self._transcript.path if self._transcript.problem is None else None  # None: not saved (a full disk)
        clips = [self._stdout, self._stderr, *self._displays, self._result, self._result_html]
        if self._error is not None:
            clips += [self._error[1], self._error[2]]
        clipped = any(clip is not None and clip.omitted > 0 for clip in clips)
        texts = [
            collapse_repeats(self._stdout.text(path)),
            collapse_repeats(self._stderr.text(path), warnings_only=False),
            *(clip.text(path) for clip in self._displays),
            *([self._result.text(path)] if self._result is not None else []),
        ]
        error, error_cut, room = None, False, self._max_tokens
        if self._error is not None:
            error, error_cut = self._bounded_error(share=ERROR_SHARE if any(texts) else 1.0)
            room -= self._tokenizer.count(f"{error.name}: {error.value}\n{error.traceback}")
        bounded = self._tokenizer.fit(texts, room=max(room, 0))
        cut = clipped or error_cut or bounded != texts
        stdout, stderr, *rest = bounded
        displays = tuple(rest[: len(self._displays)])
        result = rest[len(self._displays)] if self._result is not None else None
        return ExecutionResult(
            code=code,
            success=error is None,
            stdout=stdout,
            stderr=stderr,
            result=result,
            result_html=self._result_html.text(path) if self._result_html is not None else None,
            error=error,
            displays=displays,
            artifacts=tuple(self._artifacts),
            full_output_path=self._transcript.save(needed=cut),
            notices=tuple(self._problems) + ((self._transcript.problem,) if self._transcript.problem else ()) + self._left_out_notices(),
        )

    def _left_out_notices(self) -> tuple[str, ...]:
        """One line per cap that left images out: how many, how large, which setting raises it."""
        lines = []
        for setting, sizes in self._left_out.items():
            cap = getattr(self._display, "per_cell" if setting == "execution.display_per_cell" else "per_session", None) or 0
            images = "an image" if len(sizes) == 1 else f"{len(sizes)} images"
            lines.append(
                f"{images} ({_megabytes(sum(sizes))}) the cell displayed were not kept, past {setting} ({_megabytes(cap)}): "
                f"show fewer or smaller ones (savefig to a file), or raise {setting}"
            )
        return tuple(lines)

    def _room_for(self, size: int) -> str | None:
        """The setting whose cap an image of `size` bytes would pass (None: it may be kept)."""
        if self._display is None:
            return None
        if self._display.per_cell is not None and self._cell_images + size > self._display.per_cell:
            return "execution.display_per_cell"
        if self._display.per_session is not None and self._display.used + size > self._display.per_session:
            return "execution.display_per_session"
        return None

    def _bounded_error(self, *, share: float) -> tuple[CellError, bool]:
        """The error within its share (name and message first, cut only if huge; then the traceback's
        last frames), and whether anything was left out."""
        assert self._error is not None
        name, value_clip, traceback_clip = self._error
        path = self._transcript.path if self._transcript.problem is None else None
        limit = max(int(self._max_tokens * share), 64)
        full_value, full_traceback = value_clip.text(path), traceback_clip.text(path)
        value = self._tokenizer.truncate_middle(full_value, limit // 2)
        left = limit - self._tokenizer.count(f"{name}: {value}")
        traceback = self._tokenizer.keep_tail(collapse_repeats(full_traceback), max(left, 0))
        return CellError(name=name, value=value, traceback=traceback), (value, traceback) != (full_value, full_traceback)

    def close(self) -> None:
        """Release the transcript file when the cell is abandoned (Ctrl-C)."""
        self._transcript.save(needed=False)

    def _save_images(self, data: dict[str, Any]) -> bool:
        saved = False
        for mime, suffix in IMAGE_SUFFIXES.items():
            if mime not in data:
                continue
            path = self._artifacts_dir / f"{self._stem}-{len(self._artifacts) + 1}{suffix}"
            try:
                content = _image_content(mime, data[mime])
            except ValueError as exc:  # the kernel's data, not an image: said in one line, the rest of the cell goes on
                self._problems.append(f"a displayed {mime} was not saved: {exc}")
                return True  # its text/plain ("<Figure ...>") says nothing more
            past = self._room_for(len(content))
            if past is not None:
                self._left_out.setdefault(past, []).append(len(content))
                return True
            try:
                path.write_bytes(content)
            except OSError as exc:  # a full disk: say so, and the cell's other output still counts
                self._problems.append(f"an image the cell displayed could not be saved to {path} ({exc.strerror or exc})")
                return True
            self._artifacts.append(str(path))
            self._cell_images += len(content)
            if self._display is not None:
                self._display.used += len(content)
            saved = True
        return saved


def _mime_bundle(content: dict[str, Any]) -> dict[str, Any]:
    data = content.get("data") or {}
    if not isinstance(data, dict):
        raise TypeError(f"its data is a {type(data).__name__}, not a mapping of MIME types")
    return data


def _image_content(mime: str, payload: Any) -> bytes:
    """The bytes of an image the kernel displayed; ValueError saying what is wrong with it."""
    if isinstance(payload, list) and all(isinstance(part, str) for part in payload):
        payload = "".join(payload)
    if not isinstance(payload, str):
        kind = "base64 text" if mime != "image/svg+xml" else "text"
        raise ValueError(f"it is a {type(payload).__name__} where {kind} belongs")
    if mime == "image/svg+xml":
        return payload.encode("utf-8")
    try:
        content = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("it is not valid base64 (a _repr_png_ returning text?)") from None
    if not content.startswith(IMAGE_MAGIC[mime]):
        raise ValueError(f"its bytes are not a {mime.split('/')[1].upper()} image")
    return content


def _plain_text(data: dict[str, Any]) -> str:
    for mime in ("text/plain", "text/markdown", "text/html"):
        value = data.get(mime)
        if value:
            return strip_controls(value if isinstance(value, str) else "".join(map(str, value)) if isinstance(value, list) else str(value))
    return ""


def collapse_repeats(text: str, *, warnings_only: bool = True) -> str:
    """Repeated lines as one line with a count: runs of the same line anywhere, and repeated warning
    lines (digits aside) wherever they recur. With `warnings_only` False (stderr) every repeated line
    counts as a warning would.
    """
    if "\n" not in text:
        return text
    lines = text.split("\n")
    counts: dict[str, int] = {}
    first: dict[str, int] = {}
    kept: list[str] = []
    for line in lines:
        repeatable = bool(line.strip()) and (not warnings_only or _WARNING.search(line) is not None)
        key = _DIGITS.sub("#", line.strip()) if repeatable else None
        if key is not None and key in first:
            counts[key] += 1
            continue
        if key is None and kept and line == kept[-1] and line.strip():
            key = f"\0run{len(kept)}"  # a run of one ordinary line: counted on the line before
            previous = len(kept) - 1
            first.setdefault(key, previous)
            counts[key] = counts.get(key, 1) + 1
            continue
        if key is not None:
            first[key], counts[key] = len(kept), 1
        kept.append(line)
    for key, position in first.items():
        if counts[key] > 1:
            kept[position] += f"  [repeated {counts[key]} times]"
    return "\n".join(kept)


def artifact_file(artifacts_dir: Path, name: str) -> Path:
    """The file of an artifact a cell saved, by its bare file name; KeyError if there is none (or `name` is a path)."""
    return file_inside(artifacts_dir, name)


def file_inside(folder: Path, name: str) -> Path:
    """The regular file `name` directly in `folder`, never followed out of it by a link; KeyError otherwise."""
    path = folder / Path(name).name
    if Path(name).name != name or name in (".", "..") or path.is_symlink() or not path.is_file():
        raise KeyError(name)
    resolved = path.resolve()
    if resolved.parent != folder.resolve():
        raise KeyError(name)
    return resolved


def _megabytes(size: int) -> str:
    return f"{size / 1024**2:.1f} MB"
