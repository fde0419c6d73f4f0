"""The chat's input line on a terminal: history, Ctrl-C, and a bound on what one line may hold.

A line longer than MAX_LINE_CHARS is refused at Enter with one line, whether it was pasted at once
(bracketed paste) or arrived key by key (a terminal without bracketed paste types a paste out):
characters past the bound are counted, never kept, so neither the line nor the editor's state
grows with it. A run of plain characters that arrives in one read is such a typed-out paste (no
one types that fast) and is taken in as one paste: key by key, the editor's per-key work would
take minutes over a long one. Ctrl-C clears a half-typed line and leaves at an empty prompt, except in the moment
after a request ends, when it was meant for that request.
"""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path

from prompt_toolkit import PromptSession
from prompt_toolkit.filters import Condition, emacs_insert_mode, vi_insert_mode
from prompt_toolkit.history import FileHistory
from prompt_toolkit.input.vt100 import Vt100Input
from prompt_toolkit.key_binding import KeyBindings, KeyPress, KeyPressEvent
from prompt_toolkit.keys import Keys

# About 5,000 tokens: longer text belongs in a file (`/load`), where the code reads it whole.
MAX_LINE_CHARS = 20_000
# A Ctrl-C this soon after a request ended was pressed to stop that request, not to leave.
CTRL_C_GRACE = 2.0
# This many plain characters in one read of the terminal are a typed-out paste, not typing.
TYPED_PASTE = 32
LATE_CTRL_C = "The request had already finished. Press Ctrl-C again (or Ctrl-D) to leave."
INTERRUPTED = "Interrupted. The session is kept; Ctrl-D or /exit leaves."


def too_long(chars: int) -> str:
    """The one line a line past the bound gets, typed or pasted."""
    return f"That line has {chars:,} characters; a request typed here holds at most {MAX_LINE_CHARS:,}. Put longer text in a file and /load it."


class PromptLine:
    """The `you>` prompt; `read()` returns each line, or None when the user leaves."""

    def __init__(self, history_file: Path) -> None:
        self._dropped = 0  # characters typed or pasted past the bound on the current line
        self._notice: str | None = None  # said instead of a line (a refused line, a late Ctrl-C)
        self._request_ended = -math.inf
        self._session: PromptSession[str] = PromptSession(
            history=FileHistory(str(history_file)), key_bindings=self._bindings(), input=_PasteAwareInput(sys.stdin)
        )

    def read(self, prompt: str) -> tuple[str | None, str | None]:
        """(the line stripped, or None to leave; a notice to show instead of a line, or None)."""
        try:
            text = self._session.prompt(prompt)
        except (EOFError, KeyboardInterrupt):
            return None, None
        notice, self._notice = self._notice, None
        return (None if notice else text.strip()), notice

    def request_ended(self) -> None:
        """A request just ended: a Ctrl-C in the next moments was meant for it."""
        self._request_ended = time.monotonic()

    def _bindings(self) -> KeyBindings:
        bindings = KeyBindings()
        overflowing = Condition(lambda: self._dropped > 0)

        @bindings.add("c-c")
        def _(event: KeyPressEvent) -> None:
            if event.current_buffer.text or self._dropped:
                self._dropped = 0
                event.current_buffer.reset()
            elif time.monotonic() - self._request_ended < CTRL_C_GRACE:
                self._request_ended = -math.inf  # a second Ctrl-C leaves
                self._finish(event, LATE_CTRL_C)
            else:
                event.app.exit(exception=EOFError())

        # Typed keys, as prompt_toolkit's own self-insert (an undo point only where another key came between).
        @bindings.add(Keys.Any, filter=emacs_insert_mode | vi_insert_mode, save_before=lambda event: not event.is_repeat)
        def _(event: KeyPressEvent) -> None:
            self._insert(event, event.data * event.arg)

        @bindings.add(Keys.BracketedPaste)
        def _(event: KeyPressEvent) -> None:
            self._insert(event, event.data.replace("\r\n", "\n").replace("\r", "\n"))

        @bindings.add("enter", filter=overflowing)
        def _(event: KeyPressEvent) -> None:
            chars = len(event.current_buffer.text) + self._dropped
            self._dropped = 0
            self._finish(event, too_long(chars))

        return bindings

    def _insert(self, event: KeyPressEvent, text: str) -> None:
        """Into the line while it stays within the bound; past it, only counted."""
        buffer = event.current_buffer
        if self._dropped or len(buffer.text) + len(text) > MAX_LINE_CHARS:
            self._dropped += len(text)
        else:
            buffer.insert_text(text)

    def _finish(self, event: KeyPressEvent, notice: str) -> None:
        """End this prompt with a notice in place of a line."""
        self._notice = notice
        event.current_buffer.reset()
        event.app.exit(result="")


class _PasteAwareInput(Vt100Input):
    """The terminal's input, with each typed-out paste (a run of plain characters in one read) as one paste."""

    def read_keys(self) -> list[KeyPress]:
        return typed_pastes(super().read_keys())


def typed_pastes(keys: list[KeyPress]) -> list[KeyPress]:
    """`keys` with every run of at least TYPED_PASTE plain characters made one bracketed paste."""
    found: list[KeyPress] = []
    run: list[str] = []
    for key in [*keys, None]:
        if key is not None and key.key == key.data and len(key.data) == 1 and key.data.isprintable():
            run.append(key.data)
            continue
        if len(run) >= TYPED_PASTE:
            found.append(KeyPress(Keys.BracketedPaste, "".join(run)))
        else:
            found += [KeyPress(char, char) for char in run]
        run = []
        if key is not None:
            found.append(key)
    return found
