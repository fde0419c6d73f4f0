"""Confirm mode on the terminal: each cell is shown highlighted and waits for run, edit or skip."""

from __future__ import annotations

from prompt_toolkit import PromptSession
from prompt_toolkit.key_binding import KeyBindings, KeyPressEvent
from rich.syntax import Syntax

from taskweaver_lite.cli.console import RichConsole
from taskweaver_lite.safety.confirm import CellChoice, ConfirmCell
from taskweaver_lite.safety.terminal import strip_controls

QUESTION = "Run this cell? [r]un / [e]dit / [s]kip: "


def terminal_confirm(renderer: RichConsole) -> ConfirmCell:
    """A `ConfirmCell` that asks on this terminal."""

    def ask(code: str) -> CellChoice:
        renderer.stop_status()
        renderer.console.print(Syntax(strip_controls(code).strip(), "python", theme="monokai", line_numbers=True, word_wrap=True))
        while True:
            answer = PromptSession[str]().prompt(QUESTION).strip().lower()
            if answer in ("r", "run", "y", "yes", ""):
                return CellChoice.run(code)
            if answer in ("s", "skip", "n", "no"):
                renderer.say("Skipped: the CodeGenerator is told you declined this cell.", style="yellow")
                return CellChoice.skip(code)
            if answer in ("e", "edit"):
                edited = _edit(code)
                if edited.strip():
                    return CellChoice.run(edited)
                renderer.say("The edit was empty: the cell is skipped.", style="yellow")
                return CellChoice.skip(code)
            renderer.say("Answer r (run), e (edit) or s (skip).")

    return ask


def _edit(code: str) -> str:
    """The code in a multi-line editor: Enter adds a line, Esc then Enter (or Alt-Enter) runs it."""
    bindings = KeyBindings()

    @bindings.add("c-d")
    def _(event: KeyPressEvent) -> None:
        event.current_buffer.validate_and_handle()

    session: PromptSession[str] = PromptSession(multiline=True, key_bindings=bindings)
    return session.prompt("edit (Esc Enter or Ctrl-D to run)>\n", default=code)
