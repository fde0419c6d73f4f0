"""One `%%ask` cell's output: the session's events shown in the notebook as they happen.

A `CellView` is the session's listener for the length of one request. It keeps one status line at
the top of the cell's output (who is working on what; at the end, the steps, model calls and time),
and below it, in order: each step's instruction from the Planner, the code as it starts to run, the
code's own output (the kernel shows that itself, tables and plots included, as for any cell), a note
for code that was not run, and the answer as Markdown. Each piece is published with a `text/plain`
twin, so that a plain IPython terminal, nbconvert and papermill read the same.

With `--insert` (or confirm mode, where the code is not run) the steps' code is collected and put
into one new cell below the `%%ask` cell when the request ends (IPython keeps only the last such
cell of a request: one is all there is).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from taskweaver_lite.records.conversation import USER, Post
from taskweaver_lite.records.events import Event, ModelCalled, PostAdded, RoundEnded, RoundStarted, Working
from taskweaver_lite.safety.confirm import HANDED_OVER
from taskweaver_lite.safety.terminal import strip_controls

if TYPE_CHECKING:
    from IPython.core.interactiveshell import InteractiveShell

_ACTIVITY = {
    "planner_thinking": "The Planner is thinking",
    "code_writing": "Writing code",
    "code_running": "Running code",
    "repairing": "Repairing a reply",
    "role_working": "A role is working",
}
# The longest line of the request that heads a cell of inserted code.
HEADING_CHARS = 100


def show_markdown(markdown: str, plain: str | None = None, *, display_id: bool = False) -> Any:
    """Publish Markdown in the running cell's output, with `plain` (default: the Markdown itself) for text-only readers."""
    from IPython.display import display

    bundle = {"text/markdown": markdown, "text/plain": strip_controls(markdown if plain is None else plain)}
    return display(bundle, raw=True, display_id=display_id)


def code_block(code: str) -> str:
    """`code` as a fenced Python block, its fence longer than any run of backticks inside it."""
    fence = "`" * max(3, _longest_backtick_run(code) + 1)
    return f"{fence}python\n{code.rstrip()}\n{fence}"


def _longest_backtick_run(text: str) -> int:
    longest = run = 0
    for char in text:
        run = run + 1 if char == "`" else 0
        longest = max(longest, run)
    return longest


class CellView:
    """Renders one request's events into the running cell; collects the code to insert below it."""

    def __init__(self, shell: InteractiveShell, *, request: str, insert: bool) -> None:
        """`insert`: the steps' code goes into a new cell below when the request ends."""
        self._shell = shell
        self._request = request
        self._insert = insert
        self._started = time.monotonic()
        self._status: Any = None
        self._calls = 0
        self._code: list[str] = []  # the code of each step, to insert below

    def __call__(self, event: Event) -> None:
        """Show one session event (the session calls this on the thread running the request)."""
        if isinstance(event, RoundStarted):
            self._status = show_markdown("*The Planner is thinking…*", display_id=True)
        elif isinstance(event, Working):
            self._working(event)
        elif isinstance(event, PostAdded):
            self._post(event.post)
        elif isinstance(event, ModelCalled):
            self._calls += 1
        elif isinstance(event, RoundEnded) and event.round.state == "failed":
            show_markdown(f"**The request failed:** {event.round.error}")

    def _working(self, event: Working) -> None:
        if event.activity == "code_running":
            show_markdown(code_block(event.detail), event.detail)
        label = _ACTIVITY.get(event.activity, event.activity)
        detail = f" ({event.detail})" if event.detail and event.activity != "code_running" else ""
        self._set_status(f"*{label}{detail}…*")

    def _post(self, post: Post) -> None:
        if post.send_to == USER:
            show_markdown(post.message)
            return
        result = post.execution
        if post.send_from == USER or (post.send_from == post.send_to and result is None):
            return  # the request itself (it is the cell), or a role's note to itself
        if result is None:
            show_markdown(f"**{post.send_from} → {post.send_to}:** {post.message}")
            return
        # A run's own output and traceback showed as it ran: only what did not run, or ran out of time, is said here.
        if result.refused:  # it never started: its code shows here
            show_markdown(code_block(post.code or ""), post.code or "")
        if result.refused == HANDED_OVER:
            show_markdown("*Not run here: confirm mode (`execution.confirm`) puts the code into a new cell below.*")
        elif result.refused:
            why = f"\n\n{result.error.value}" if result.error is not None else ""
            show_markdown(f"**Not run:** {result.refused}.{why}")
        elif result.timed_out:
            show_markdown(f"*{result.outcome()}*")
        if post.code and post.send_from != post.send_to and (result.success or result.refused == HANDED_OVER):
            self._code.append(post.code)

    def _set_status(self, markdown: str) -> None:
        if self._status is not None:
            self._status.update({"text/markdown": markdown, "text/plain": strip_controls(markdown)}, raw=True)

    def finish(self, *, outcome: str) -> None:
        """The request ended (`outcome`: 'done', 'stopped', 'failed'): the status line sums it up; the code goes below."""
        seconds = time.monotonic() - self._started
        calls = f"{self._calls} model call{'s' * (self._calls != 1)}"
        self._set_status(f"*{outcome.capitalize()}: {calls}, {seconds:.1f} s.*")
        if self._insert and self._code:
            heading = self._request.strip().splitlines()[0][:HEADING_CHARS] if self._request.strip() else ""
            self._shell.set_next_input(f"# %%ask: {heading}\n" + "\n\n".join(code.rstrip() for code in self._code), replace=False)
