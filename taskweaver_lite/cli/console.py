"""Rendering a session for a person: live progress, code, outputs, answers.

`RichConsole` is for a terminal: a spinner saying who is working (with elapsed time while code
runs), highlighted code, outputs, artifact paths, and the answer as Markdown. `PlainConsole` is
for pipes: only the Planner's final answers go to stdout; progress goes to stderr as plain lines.
Both are session listeners. Every text that comes from the model or a cell passes `strip_controls`
before it is rendered, so only the styling added here ever reaches the terminal.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import IO

from rich.console import Console
from rich.markdown import Markdown
from rich.panel import Panel
from rich.status import Status
from rich.syntax import Syntax
from rich.text import Text

from taskweaver_lite.cli.tracebacks import screen_text
from taskweaver_lite.conversation import Post
from taskweaver_lite.events import Event, Folded, PostAdded, RoundEnded, Working
from taskweaver_lite.execution import ExecutionResult
from taskweaver_lite.terminal import strip_controls

_ACTIVITY = {
    "planner_thinking": "Planner is thinking",
    "code_writing": "CodeGenerator is writing code",
    "code_running": "Running code",
    "repairing": "Asking the model to fix a malformed reply",
}


class _Elapsed:
    """A status line that shows how long the current activity has run (re-rendered by rich)."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.started = time.monotonic()

    def __rich__(self) -> Text:
        return Text(f"{self.label}… {time.monotonic() - self.started:.1f} s")


class RichConsole:
    """Renders events on a terminal."""

    def __init__(self, console: Console | None = None) -> None:
        self.console = console or Console(highlight=False)
        self._status: Status | None = None
        self._lock = threading.RLock()
        # Background notices (folds) arrive at any moment, from another thread: printed at once they
        # would land inside a command's output or under the answer. They wait for a quiet moment.
        self._notices: list[Text] = []

    def flush_notices(self) -> None:
        """Print the background notices that arrived since the last call (the chat calls it before each prompt)."""
        with self._lock:
            notices, self._notices = self._notices, []
            for line in notices:
                self._print(line)

    def __call__(self, event: Event) -> None:
        with self._lock:
            self._render(event)

    def _render(self, event: Event) -> None:
        if isinstance(event, Working):
            if event.activity == "repairing":
                self._print(Text(f"The model's reply was malformed ({strip_controls(event.detail)}); asking it to fix it.", style="yellow"))
            if event.activity == "code_running":
                code = strip_controls(event.detail).strip()
                self._print(Syntax(code, "python", theme="monokai", line_numbers=False, word_wrap=True))
            self._set_status(_ACTIVITY[event.activity])
        elif isinstance(event, PostAdded):
            self._post(event.post)
        elif isinstance(event, Folded):
            self._notices.append(Text(strip_controls(event.describe()), style="dim cyan" if event.ok else "yellow"))
        elif isinstance(event, RoundEnded):
            self.stop_status()  # the chat loop reports a failed round, once, with its reason

    def notice(self, text: str) -> None:
        """A message from another thread: shown before the next prompt, never inside other output."""
        with self._lock:
            self._notices.append(Text(strip_controls(text), style="yellow"))

    def say(self, text: str, *, style: str = "") -> None:
        """Print a message of ours that may quote outside text (errors, /history): no markup, no controls."""
        with self._lock:
            self._print(Text(strip_controls(text), style=style))

    def _post(self, post: Post) -> None:
        message = strip_controls(post.message)
        if post.send_from == "Planner" and post.send_to == "CodeInterpreter":
            step = f" [{strip_controls(post.plan.current_plan_step)}]" if post.plan and post.plan.current_plan_step else ""
            self._print(Text(f"Planner → CodeInterpreter{step}: {message}", style="cyan"))
        elif post.send_from == "CodeInterpreter" and post.execution is not None:
            self.stop_status()
            self._execution(post.execution, retrying=post.send_to == "CodeInterpreter")
        elif post.send_from == "CodeInterpreter":
            self._print(Text(f"CodeInterpreter: {message}", style="cyan"))
        elif post.send_to == "User":
            self.stop_status()
            self._print(Panel(Markdown(message), title="Answer", border_style="green"))

    def _execution(self, result: ExecutionResult, *, retrying: bool) -> None:
        style = "green" if result.success else "red"
        body = strip_controls(screen_text(result))
        title = f"Result ({result.elapsed:.2f} s)" + (" — revising the code" if retrying else "")
        self._print(Panel(Text(body), title=title, border_style=style))

    def _set_status(self, label: str) -> None:
        if not self.console.is_terminal:
            return
        if self._status is None:
            self._status = self.console.status(_Elapsed(label), spinner="dots")
            self._status.start()
        else:
            self._status.update(_Elapsed(label))

    def stop_status(self) -> None:
        """Remove the spinner (before printing an answer or returning to the prompt)."""
        if self._status is not None:
            self._status.stop()
            self._status = None

    def _print(self, renderable: object) -> None:
        self.console.print(renderable)


class PlainConsole:
    """Renders events for pipes: answers on stdout, progress on stderr, no colour."""

    def __init__(self, out: IO[str] | None = None, err: IO[str] | None = None) -> None:
        self.out = out or sys.stdout
        self.err = err or sys.stderr
        self._lock = threading.Lock()

    def __call__(self, event: Event) -> None:
        with self._lock:
            self._render(event)

    def _render(self, event: Event) -> None:
        if isinstance(event, Working) and event.activity != "code_running":
            self._progress(_ACTIVITY[event.activity] + (f": {event.detail}" if event.detail else ""))
        elif isinstance(event, Working):
            self._progress("Running code:\n" + indent(event.detail.strip()))
        elif isinstance(event, Folded):
            self._progress(event.describe())
        elif isinstance(event, PostAdded):
            post = event.post
            if post.send_to == "User":
                print(strip_controls(post.message), file=self.out, flush=True)
            elif post.send_from == "CodeInterpreter" and post.execution is not None:
                self._progress(indent(screen_text(post.execution)))
            elif post.send_from == "Planner":
                self._progress(f"Planner -> CodeInterpreter: {post.message}")

    def say(self, text: str) -> None:
        """Print a message of ours that may quote outside text (errors, /history) to stderr."""
        with self._lock:
            self._progress(text)

    def _progress(self, text: str) -> None:
        print(strip_controls(text), file=self.err, flush=True)


def indent(text: str, width: int = 4) -> str:
    """Every line of `text` indented by `width` spaces."""
    return "\n".join(" " * width + line for line in text.splitlines())
