"""`%load_ext taskweaver_lite`: ask the agent from a notebook cell, in the notebook's own kernel.

    %%ask [--set KEY=VALUE]... [--insert]
    the request, on as many lines as it takes

    %ask [--set KEY=VALUE]... [--insert] the request, on one line
    %ask_history        the requests of this notebook's session, with how each ended
    %ask_reset          the next request starts a new session (this one stays stored)

The session is the notebook's (notebook_session.py); the request's steps, code, output and answer
show in the cell (cell_view.py); the code runs in this kernel's namespace (kernel/own_kernel.py).
Failures show as one line, not a traceback through our code: a bad option, a setting that does not
hold, the model unreachable, a request that failed. The stop button stops the running step; the
cell then ends with a KeyboardInterrupt, so that "Run all" stops there too, and the session goes on.
"""

from __future__ import annotations

import atexit
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from taskweaver_lite.errors import TaskWeaverError

if TYPE_CHECKING:
    from IPython.core.interactiveshell import InteractiveShell

    from taskweaver_lite.notebook.notebook_session import NotebookSession
    from taskweaver_lite.records.conversation import Round

# `%ask ... so far?`: IPython takes a line ending in `?` for a help request on its last word.
_ASK_LINE = re.compile(r"^(\s*)%ask\s+(.*\S)\s*$")
_OPTION = re.compile(r"""\s*(--insert\b|--set(?:\s+|=)("[^"]*"|'[^']*'|\S+))""")
USAGE = "%%ask [--set KEY=VALUE]... [--insert], then the request on the lines below (or %ask [options] the request, on one line)"
# The longest request or answer shown in a row of %ask_history.
HISTORY_CHARS = 160


class AskError(Exception):
    """A failure the cell shows as its one line (IPython calls `_render_traceback_` instead of printing a traceback)."""

    def _render_traceback_(self) -> list[str]:
        return [f"taskweaver-lite: {self}"]


class AskStopped(KeyboardInterrupt):
    """The stop button ended the request; still a KeyboardInterrupt, so that "Run all" stops at this cell."""

    def _render_traceback_(self) -> list[str]:
        return ["KeyboardInterrupt: the request was stopped. The session goes on: ask again when ready (%ask_history lists it)."]


@dataclass(frozen=True)
class AskOptions:
    """What a `%%ask` or `%ask` line asks for."""

    request: str
    overrides: tuple[str, ...] = ()
    insert: bool = False


def parse_ask(line: str, cell: str | None = None) -> AskOptions:
    """The options at the start of `line`, and the request: the rest of the line, then (for `%%ask`) the cell's text."""
    overrides: list[str] = []
    insert = False
    rest = line
    while match := _OPTION.match(rest):
        if match.group(1) == "--insert":
            insert = True
        else:
            item = match.group(2).strip("\"'")
            if "=" not in item:
                raise AskError(f"--set {item}: expected KEY=VALUE, e.g. --set llm.model=gpt-4o")
            overrides.append(item)
        rest = rest[match.end() :]
    rest = rest.strip()
    if rest.startswith("--"):
        raise AskError(f"unknown option {rest.split()[0]!r}: the options are --set KEY=VALUE and --insert. Usage: {USAGE}")
    # `%%ask Plot sales` with more below: the words after the options begin the request.
    request = (rest if cell is None else f"{rest}\n{cell}").strip()
    if not request:
        raise AskError(f"no request: {USAGE}")
    return AskOptions(request=request, overrides=tuple(overrides), insert=insert)


class AskMagics:
    """The four magics over this kernel's notebook session."""

    def __init__(self, shell: InteractiveShell) -> None:
        self._shell = shell
        self._notebook: NotebookSession | None = None

    @property
    def notebook(self) -> NotebookSession:
        """The notebook's session, its modules imported at the first use of a magic (`%load_ext` stays instant)."""
        if self._notebook is None:
            from taskweaver_lite.notebook.notebook_session import NotebookSession

            self._notebook = NotebookSession(self._shell)
        return self._notebook

    def ask(self, line: str, cell: str | None = None) -> None:
        """`%%ask` / `%ask`: one request in the notebook's session; its steps and answer show in this cell."""
        options = parse_ask(line, cell)
        try:
            rnd = self.notebook.ask(options.request, overrides=options.overrides, insert=options.insert)
        except KeyboardInterrupt:
            raise AskStopped from None
        except TaskWeaverError as exc:
            raise AskError(str(exc)) from None
        if rnd.state == "failed":
            raise AskError(f"the request failed: {rnd.error} The session goes on; %ask_history lists it.")

    def ask_history(self, line: str) -> None:
        """`%ask_history`: the requests of this notebook's session, with how each ended."""
        try:
            session_id, rounds = self.notebook.rounds()
        except TaskWeaverError as exc:
            raise AskError(str(exc)) from None
        from taskweaver_lite.notebook.cell_view import show_markdown

        markdown, plain = history_text(session_id, rounds)
        show_markdown(markdown, plain)

    def ask_reset(self, line: str) -> None:
        """`%ask_reset`: the next request starts a new session; the kernel's variables stay."""
        try:
            earlier = self.notebook.reset()
        except TaskWeaverError as exc:
            raise AskError(str(exc)) from None
        from taskweaver_lite.notebook.cell_view import show_markdown

        kept = f" The earlier one, `{earlier}`, stays stored (`taskweaver-lite sessions` lists it)." if earlier else ""
        show_markdown(f"The next request starts a new session for this notebook.{kept} The kernel's variables are untouched.")

    def close(self) -> None:
        """Close the session (stored as it is) when the kernel ends or the extension is unloaded."""
        if self._notebook is not None:
            self._notebook.close()


def history_text(session_id: str | None, rounds: list[Round]) -> tuple[str, str]:
    """`%ask_history`'s Markdown table and its plain-text twin."""
    if session_id is None or not rounds:
        line = "No requests yet in this notebook's session."
        return line, line
    heading = f"Session `{session_id}` of this notebook: {len(rounds)} request{'s' * (len(rounds) != 1)}."
    rows = ["| # | Request | Outcome |", "|---|---|---|"]
    plain = [heading.replace("`", "")]
    for rnd in rounds:
        request, outcome = _short(rnd.user_query), _short(_outcome(rnd))
        rows.append(f"| {rnd.index} | {_cell(request)} | {_cell(outcome)} |")
        plain.append(f"{rnd.index}. {request} -> {outcome}")
    return "\n".join([heading, "", *rows]), "\n".join(plain)


def _outcome(rnd: Round) -> str:
    if rnd.state == "failed":
        return f"failed: {rnd.error}"
    if rnd.state == "running":
        return "cut off"
    return rnd.answer or "answered"


def _short(text: str) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= HISTORY_CHARS else flat[: HISTORY_CHARS - 1] + "…"


def _cell(text: str) -> str:
    """Text safe inside a Markdown table cell."""
    return text.replace("\\", "\\\\").replace("|", "\\|")


def questions_kept(lines: list[str]) -> list[str]:
    """An input transformer: a `%ask` line ending in `?` is a question for the agent, not a help request (`%ask?` still is)."""
    if lines and lines[0].lstrip().startswith("%%"):
        return lines  # a cell magic's text is its own
    return [_as_call(line) for line in lines]


def _as_call(line: str) -> str:
    match = _ASK_LINE.match(line.rstrip("\n"))
    if match is None or not match.group(2).endswith("?"):
        return line
    return f"{match.group(1)}get_ipython().run_line_magic('ask', {match.group(2)!r})\n"


def load_ipython_extension(shell: InteractiveShell) -> None:
    """Register `%%ask`, `%ask`, `%ask_history` and `%ask_reset` (nothing is opened until the first request)."""
    magics = AskMagics(shell)
    if questions_kept not in shell.input_transformers_cleanup:
        shell.input_transformers_cleanup.append(questions_kept)
    shell.magics_manager.register_function(magics.ask, magic_kind="line_cell", magic_name="ask")
    shell.magics_manager.register_function(magics.ask_history, magic_kind="line", magic_name="ask_history")
    shell.magics_manager.register_function(magics.ask_reset, magic_kind="line", magic_name="ask_reset")
    previous = getattr(shell, "_taskweaver_lite_magics", None)
    if isinstance(previous, AskMagics):  # loaded again (%reload_ext): the old session is closed, not leaked
        previous.close()
        atexit.unregister(previous.close)
    shell._taskweaver_lite_magics = magics  # type: ignore[attr-defined]
    atexit.register(magics.close)


def unload_ipython_extension(shell: InteractiveShell) -> None:
    """`%unload_ext taskweaver_lite`: the session is closed (it stays stored); the magics go."""
    magics = getattr(shell, "_taskweaver_lite_magics", None)
    if isinstance(magics, AskMagics):
        magics.close()
        atexit.unregister(magics.close)
        del shell._taskweaver_lite_magics  # type: ignore[attr-defined]
    if questions_kept in shell.input_transformers_cleanup:
        shell.input_transformers_cleanup.remove(questions_kept)
    for kind, names in (("line", ("ask", "ask_history", "ask_reset")), ("cell", ("ask",))):
        for name in names:
            shell.magics_manager.magics[kind].pop(name, None)
