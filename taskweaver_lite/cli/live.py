"""What the terminal shows while things happen: a streaming reply, a running cell's output.

`StreamView` is a rich renderable over a `PartialReply`: only the fields meant for the user (never
the raw JSON, init_plan or plan), the tail of the model's reasoning dimmed, and the elapsed time.
It is shown in a transient live display and replaced by the finished post when it arrives, so the
screen ends as it would without streaming. Every piece of model text passes `strip_controls`, and
every part is cut to its last lines, so a long reply cannot flood the screen.

`CellView` is the same for a running cell: the last lines it printed (kept to a few kilobytes
however much it prints) and the elapsed time, ticking.
"""

from __future__ import annotations

import time

from rich.console import Console, ConsoleOptions, Group, RenderableType, RenderResult
from rich.syntax import Syntax
from rich.text import Text

from taskweaver_lite.llm.streaming import SHOWN_FIELDS, PartialReply
from taskweaver_lite.safety.terminal import strip_controls

REASONING_LINES = 3
MESSAGE_LINES = 12
CODE_LINES = 24
CELL_LINES = 10
CELL_CHARS = 8_000


class StreamView:
    """One streaming reply as the terminal shows it (rendered by rich on every refresh)."""

    def __init__(self, role: str, label: str, *, alias: str = "", show_reasoning: bool) -> None:
        self.role = role
        self.label = label
        self.alias = alias
        self.partial = PartialReply(SHOWN_FIELDS)
        self.reasoning = ""  # reasoning_content pieces (a <think> block is in `partial.reasoning`)
        self.restarts = 0
        self._show_reasoning = show_reasoning
        self._started = time.monotonic()

    def has_text(self) -> bool:
        """True once there is something of the reply to show."""
        return bool(self.partial.values or (self._show_reasoning and (self.reasoning or self.partial.reasoning)))

    def age(self) -> float:
        """Seconds since the reply began streaming."""
        return time.monotonic() - self._started

    def restart(self) -> None:
        """The request is being made again (a cut stream, a repair turn): what was read so far is void."""
        if self.partial.values or self.partial.reasoning or self.reasoning:
            self.restarts += 1
        self.partial = PartialReply(self.partial.fields)
        self.reasoning = ""

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield Group(*self._parts())

    def _parts(self) -> list[RenderableType]:
        parts: list[RenderableType] = []
        thought = self.reasoning + self.partial.reasoning
        if self._show_reasoning and thought.strip():
            parts.append(Text(tail(strip_controls(thought), REASONING_LINES), style="dim italic"))
        values = self.partial.values
        if values.get("reply_content"):
            code = tail(strip_controls(values["reply_content"]), CODE_LINES)
            parts.append(Syntax(code, "python", theme="monokai", word_wrap=True))
        elif "message" in values or "current_plan_step" in values:
            step = strip_controls(values.get("current_plan_step", "")).strip()
            head = f"{self.alias} [{step}]: " if step else f"{self.alias}: "
            parts.append(Text(head + tail(strip_controls(values.get("message", "")), MESSAGE_LINES), style="cyan"))
        again = " (the reply broke off; asked again)" if self.restarts else ""
        parts.append(Text(f"{self.label}… {time.monotonic() - self._started:.1f} s{again}", style="dim"))
        return parts


class CellView:
    """A running cell as the terminal shows it: its latest output lines and how long it has run."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.printed = ""  # the tail of what the cell printed (stdout and stderr in order)
        self.dropped = False
        self._started = time.monotonic()

    def add(self, text: str) -> None:
        """Take more printed text, keeping only a tail: a print loop cannot grow memory or the screen."""
        self.printed += text
        if len(self.printed) > CELL_CHARS:
            self.printed = self.printed[-CELL_CHARS:]
            self.dropped = True

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        parts: list[RenderableType] = []
        shown = strip_controls(self.printed.rstrip("\n"))
        if shown:
            lines = [line[: options.max_width] for line in shown.split("\n")]  # long lines cut, not wrapped
            if len(lines) > CELL_LINES or self.dropped:
                lines = ["… (earlier output above)", *lines[-CELL_LINES:]]
            parts.append(Text("\n".join(lines), style="dim"))
        parts.append(Text(f"{self.label}… {time.monotonic() - self._started:.1f} s", style="dim"))
        yield Group(*parts)


def tail(text: str, lines: int) -> str:
    """The last `lines` lines of `text` (a marker first when some were left out)."""
    kept = text.split("\n")
    if len(kept) <= lines:
        return text
    return f"… {len(kept) - lines} lines above\n" + "\n".join(kept[-lines:])
