"""Rendering a session for a person: live progress, code, outputs, answers.

`RichConsole` is for a terminal: a spinner saying who is working (with elapsed time while code
runs), the Planner's message and the code while they stream (`live.py`), highlighted code,
outputs, artifact paths, and the answer as Markdown. `PlainConsole` is
for pipes: only the Planner's final answers go to stdout (never streamed pieces); progress goes to
stderr as plain lines.
Both are session listeners. Every text that comes from the model or a cell passes `strip_controls`
before it is rendered, so only the styling added here ever reaches the terminal.
"""

from __future__ import annotations

import re
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO
from urllib.parse import quote

from rich.console import Console, ConsoleOptions, RenderableType, RenderResult
from rich.live import Live
from rich.markdown import Markdown
from rich.panel import Panel
from rich.segment import Segment
from rich.status import Status
from rich.style import Style
from rich.syntax import Syntax
from rich.text import Text

from taskweaver_lite.cli.images import TerminalImages
from taskweaver_lite.cli.live import CellView, StreamView
from taskweaver_lite.cli.tracebacks import screen_text
from taskweaver_lite.records.conversation import USER, Post
from taskweaver_lite.records.events import CellPrinted, Event, Folded, ModelCalled, PostAdded, ReplyStreamed, RoundEnded, Working
from taskweaver_lite.records.execution import ExecutionResult
from taskweaver_lite.safety.terminal import strip_controls

_ACTIVITY = {
    "planner_thinking": "Planner is thinking",
    "code_writing": "CodeGenerator is writing code",
    "code_running": "Running code",
    "repairing": "Asking the model to fix a malformed reply",
    "role_working": "Waiting for",
}


_REFRESHES_PER_SECOND = 10
_MIN_REDRAW = 0.005
_SHOW_AFTER = 0.02  # seconds a reply streams before its live view appears
_MIN_CELL_REDRAW = 0.05  # a print loop sends thousands of pieces a second; the screen needs 20
_REASONING_CHARS = 4_000  # only the tail is shown; more is memory for nothing


class _Elapsed:
    """A status line that shows how long the current activity has run (re-rendered by rich)."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.started = time.monotonic()

    def __rich__(self) -> Text:
        return Text(f"{self.label}… {time.monotonic() - self.started:.1f} s")


class _Alarm:
    """Calls an action after a delay, unless cancelled first, on one thread that lasts (started on
    first use): a thread per streamed reply cost more to start and stop than an instant reply took."""

    def __init__(self) -> None:
        self._wake = threading.Condition()
        self._due: tuple[float, Callable[[], None]] | None = None
        self._thread: threading.Thread | None = None

    @property
    def waiting(self) -> bool:
        return self._due is not None

    def ring_in(self, delay: float, action: Callable[[], None]) -> None:
        with self._wake:
            self._due = (time.monotonic() + delay, action)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="console-alarm", daemon=True)
                self._thread.start()
            self._wake.notify()

    def cancel(self) -> None:
        with self._wake:
            self._due = None

    def _run(self) -> None:
        while True:
            with self._wake:
                while self._due is None or self._due[0] > time.monotonic():
                    self._wake.wait(None if self._due is None else self._due[0] - time.monotonic())
                action, self._due = self._due[1], None
            action()


class RichConsole:
    """Renders events on a terminal."""

    def __init__(self, console: Console | None = None, *, show_reasoning: bool = True) -> None:
        self.console = console or Console(highlight=False)
        self.show_reasoning = show_reasoning
        self._status: Status | None = None
        self._label = _ACTIVITY["planner_thinking"]
        # The reply streaming or the cell running now, in a transient live display the finished post replaces.
        self._stream: tuple[StreamView | CellView, Live] | None = None
        self._pending: StreamView | None = None
        self._alarm = _Alarm()  # shows a waiting reply view on time if its stream stalls
        self._refreshed = 0.0
        self._lock = threading.RLock()
        # Background notices (folds) arrive at any moment, from another thread: printed at once they
        # would land inside a command's output or under the answer. They wait for a quiet moment.
        self._notices: list[Text] = []
        self.images: TerminalImages | None = None  # plots drawn inline where the terminal can (the chat sets it)
        self.artifact_total: Callable[[], int] | None = None  # the session's files so far: /open's numbers
        self.folders: tuple[Path, ...] = ()  # the session's working and artifacts folders: paths in them become links

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
        if isinstance(event, ReplyStreamed):
            self._streamed(event)
            return
        if isinstance(event, CellPrinted):
            self._printed(event)
            return
        if not isinstance(event, ModelCalled):
            self._end_stream()
        if isinstance(event, Working):
            if event.activity == "repairing":
                self._print(Text(f"The model's reply was malformed ({strip_controls(event.detail)}); asking it to fix it.", style="yellow"))
            if event.activity == "code_running":
                code = strip_controls(event.detail).strip()
                # The spinner goes first: printed over its line, the code would leave it on screen ("⠋ … 0.1 sprint(1)").
                self.stop_status()
                self._print(Syntax(code, "python", theme="monokai", line_numbers=False, word_wrap=True))
                if self.console.is_terminal:  # the cell's output shows as it is printed, under the code
                    self._label = _ACTIVITY["code_running"]
                    self._show_live(CellView(self._label))
                    return
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
        if post.send_from == USER:
            return
        if post.send_to == USER:
            self.stop_status()
            answer = Panel(Markdown(message), title="Answer", border_style="green")
            links = file_links(message, self.folders)
            self._print(Linked(answer, links) if links else answer)
        elif post.execution is not None:
            self.stop_status()
            self._execution(post.execution, retrying=post.send_to == post.send_from)
        elif post.plan is not None:  # a step delegated to a role
            step = f" [{strip_controls(post.plan.current_plan_step)}]" if post.plan.current_plan_step else ""
            self._print(Text(f"{post.send_from} → {post.send_to}{step}: {message}", style="cyan"))
        else:
            self._print(Text(f"{post.send_from}: {message}", style="cyan"))

    def _execution(self, result: ExecutionResult, *, retrying: bool) -> None:
        style = "green" if result.success else "red"
        body = strip_controls(screen_text(result))
        title = f"Result ({result.elapsed:.2f} s)" + (" — revising the code" if retrying else "")
        self._print(Panel(Text(body), title=title, border_style=style))
        self._show_files(result.artifacts)

    def _show_files(self, artifacts: tuple[str, ...]) -> None:
        """Each plot inline where the terminal draws images, else its /open number (the numbers count the session's files)."""
        if self.artifact_total is None:
            return
        first = self.artifact_total() - len(artifacts) + 1
        for number, artifact in enumerate(artifacts, first):
            drawn = self.images.renderable(Path(artifact), width=self.console.width) if self.images is not None else None
            if drawn is not None:
                try:
                    self._print(drawn)
                except Exception:  # noqa: BLE001 - a terminal that misreports its size (0 columns) must not end the chat
                    self.images = None
            self._print(Text(f"[{number}] {strip_controls(Path(artifact).name)}: /open {number} shows it in your viewer", style="dim"))

    def _streamed(self, event: ReplyStreamed) -> None:
        """Show a piece of a streaming reply; a `start` opens the live view or voids what it showed."""
        if not self.console.is_terminal:
            return
        delta = event.delta
        view = self._view_for(event)
        if delta.kind == "start":
            view.restart()
        elif delta.kind == "content":
            view.partial.feed(delta.text)
        else:
            view.reasoning = (view.reasoning + delta.text)[-_REASONING_CHARS:]
        if delta.kind == "start":
            return
        if view is self._pending and view.has_text():
            if view.age() >= _SHOW_AFTER:
                self._show_pending(view)
            elif not self._alarm.waiting:
                # The next piece may be seconds away (a stalled or slow model): show it on time anyway.
                self._alarm.ring_in(_SHOW_AFTER - view.age(), lambda: self._show_pending(view))
        self._redraw(_MIN_REDRAW)

    def _show_pending(self, view: StreamView) -> None:
        """Put a waiting reply view on screen, unless its reply is already over (called from a timer too)."""
        with self._lock:
            if self._pending is not view:
                return
            self._pending = None
            self._show_live(view)
            if self._stream is not None:
                self._stream[1].refresh()

    def _view_for(self, event: ReplyStreamed) -> StreamView:
        """The view of `event`'s reply: on screen, waiting to be shown, or new (then waiting)."""
        shown = self._stream[0] if self._stream is not None else None
        if isinstance(shown, StreamView) and shown.role == event.role:
            return shown
        if self._pending is None or self._pending.role != event.role:
            # Shown only once it has been streaming a moment: a reply that arrives all at once
            # (a fast model, a short answer) goes straight to its post, without a live display
            # that would cost more to draw and clear than the reply took.
            self._pending = StreamView(event.role, self._label, alias=event.alias, show_reasoning=self.show_reasoning)
        return self._pending

    def _printed(self, event: CellPrinted) -> None:
        """Show what the running cell just printed (its view keeps only the last lines)."""
        if self._stream is not None and isinstance(self._stream[0], CellView):
            self._stream[0].add(event.text)
            self._redraw(_MIN_CELL_REDRAW)

    def _show_live(self, view: StreamView | CellView) -> None:
        """Start a transient live display of `view` (one at a time: the spinner and any other view end first)."""
        self._end_stream()
        self.stop_status()
        live = Live(view, console=self.console, transient=True, refresh_per_second=_REFRESHES_PER_SECOND)
        live.start()
        self._stream = (view, live)

    def _redraw(self, gap: float) -> None:
        # At once, not at the next tick: text should appear as it arrives. A burst of tiny pieces
        # is drawn at most every few milliseconds; the ticking refresh draws the rest.
        now = time.monotonic()
        if self._stream is not None and now - self._refreshed >= gap:
            self._refreshed = now
            self._stream[1].refresh()

    def _end_stream(self) -> None:
        """Clear the live view of a streamed reply (its post, printed next, replaces it)."""
        self._pending = None
        self._alarm.cancel()
        if self._stream is not None:
            self._stream[1].stop()
            self._stream = None

    def _set_status(self, label: str) -> None:
        self._label = label
        if not self.console.is_terminal:
            return
        if self._status is None:
            self._status = self.console.status(_Elapsed(label), spinner="dots")
            self._status.start()
        else:
            self._status.update(_Elapsed(label))

    def stop_status(self) -> None:
        """Remove the spinner or a streaming reply's view (before printing an answer or returning to the prompt)."""
        self._end_stream()
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
            if post.send_to == USER and post.send_from != USER:
                print(strip_controls(post.message), file=self.out, flush=True)
            elif post.execution is not None:
                self._progress(indent(screen_text(post.execution)))
            elif post.plan is not None or (post.send_from != USER and post.code is None):
                self._progress(f"{post.send_from} -> {post.send_to}: {post.message}")

    def say(self, text: str) -> None:
        """Print a message of ours that may quote outside text (errors, /history) to stderr."""
        with self._lock:
            self._progress(text)

    def _progress(self, text: str) -> None:
        print(strip_controls(text), file=self.err, flush=True)


def indent(text: str, width: int = 4) -> str:
    """Every line of `text` indented by `width` spaces."""
    return "\n".join(" " * width + line for line in text.splitlines())


_PATH = re.compile(r"/[^\s`'\"<>()[\]]*[^\s`'\"<>()[\].,;:!?]")  # an absolute path, less the punctuation after it


def file_links(text: str, folders: tuple[Path, ...]) -> dict[str, str]:
    """Each path in `text` naming an existing file inside `folders`, with its `file://` address."""
    links = {}
    for written in set(_PATH.findall(text)) if folders else ():
        path = Path(written).resolve()  # `..` and links resolved: what is linked is what the path reaches
        if path.is_file() and any(folder.resolve() in path.parents for folder in folders):
            links[written] = f"file://{quote(str(path))}"
    return links


class Linked:
    """`inner` as rendered, with each of `links`' paths a terminal hyperlink wherever a line shows it whole."""

    def __init__(self, inner: RenderableType, links: dict[str, str]) -> None:
        self.inner = inner
        self.links = links
        self._any = re.compile("|".join(re.escape(path) for path in sorted(links, key=len, reverse=True)))

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        for segment in console.render(self.inner, options):
            if segment.control or not self.links or not self._any.search(segment.text):
                yield segment
                continue
            last = 0
            for match in self._any.finditer(segment.text):
                yield Segment(segment.text[last : match.start()], segment.style)
                yield Segment(match[0], (segment.style or Style()) + Style(link=self.links[match[0]]))
                last = match.end()
            yield Segment(segment.text[last:], segment.style)
