"""What an editor sees of a turn: the session's events as Agent Client Protocol session updates.

`TurnUpdates` listens to one turn (on the turn's thread) and hands each update on, in order:

- the Planner's answer as `agent_message_chunk`, streamed as the model writes it when the reply
  says early that it goes to the user (its `send_to` comes before its `message`); what was not
  streamed follows when the answer is posted;
- the plan as a `plan` update each time the Planner posts one: the steps before its current step
  `completed`, the current one `in_progress`, the rest `pending`, all `completed` once answered;
- each cell as a `tool_call` of kind `execute` with its code (`pending` while the person is asked
  for permission, `in_progress` while it runs, with what it prints so far), then a
  `tool_call_update` with its output (text; plots as image content) and `completed` or `failed`;
  a cell that was not run (refused by verification, rejected by the person) ends `failed` saying why;
- a reasoning model's thinking (`reasoning_content`, a leading `<think>` block) as `agent_thought_chunk`.

`history_updates` gives a stored session's rounds as the same updates, for `session/load`.
"""

from __future__ import annotations

import base64
import mimetypes
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from acp import (
    plan_entry,
    start_tool_call,
    text_block,
    tool_content,
    update_agent_message_text,
    update_agent_thought_text,
    update_plan,
    update_tool_call,
    update_user_message_text,
)
from acp.schema import (
    AgentMessageChunk,
    AgentPlanUpdate,
    AgentThoughtChunk,
    ContentToolCallContent,
    ImageContentBlock,
    PlanEntry,
    PlanEntryStatus,
    ToolCallProgress,
    ToolCallStart,
    ToolCallStatus,
    UserMessageChunk,
)

from taskweaver_lite.llm.streaming import PartialReply
from taskweaver_lite.records.conversation import USER, Plan, Post, Round
from taskweaver_lite.records.events import CellPrinted, Event, PostAdded, ReplyStreamed, RoundEnded, Working
from taskweaver_lite.records.execution import ExecutionResult

Update = AgentMessageChunk | AgentThoughtChunk | AgentPlanUpdate | ToolCallStart | ToolCallProgress | UserMessageChunk
Send = Callable[[Update], None]

# Seconds between two updates of a running cell's printed text (what it prints in between is sent together).
PRINT_INTERVAL = 0.25
# Characters of a running cell's printed text sent live (its end); the finished cell's output is bounded for prompts anyway.
LIVE_PRINT_CHARS = 8_000
# A plot larger than this is named in the cell's output, not sent as an image.
MAX_IMAGE_BYTES = 5 * 1024 * 1024
IMAGE_TYPES = ("image/png", "image/jpeg", "image/gif", "image/webp")
TITLE_CHARS = 80
_NUMBERED = re.compile(r"^\s*(\d+)[.)]\s*")


class TurnUpdates:
    """One turn's events as ACP updates, handed to `send` in the order they happen (a listener: it never drives the turn)."""

    def __init__(self, send: Send, *, show_reasoning: bool = True) -> None:
        self._send = send
        self._show_reasoning = show_reasoning
        self._partial: dict[str, PartialReply] = {}
        self._thought: dict[str, int] = {}  # characters of a role's <think> block already sent
        self._streamed = ""  # the answer's text sent while it streamed
        self._plan: Plan | None = None
        self._step = ""  # the instruction the running cells carry out: their title
        self.cell: str | None = None  # the tool call of the cell asked about or running
        self._code = ""
        self._printed = ""
        self._last_print = 0.0
        self._print_lock = threading.Lock()  # the turn's thread and the timer that sends a burst's end
        self._print_timer: threading.Timer | None = None

    def listen(self, event: Event) -> None:
        """Turn one session event into the updates it means (most mean none)."""
        if isinstance(event, ReplyStreamed):
            self._streamed_piece(event)
        elif isinstance(event, Working) and event.activity == "code_running":
            self._cell_runs(event.detail)
        elif isinstance(event, CellPrinted):
            self._cell_printed(event.text)
        elif isinstance(event, PostAdded):
            self._posted(event.post)
        elif isinstance(event, RoundEnded) and event.round.state == "finished" and self._plan is not None:
            self._send(plan_update(self._plan, done=True))

    def announce(self, code: str) -> str:
        """A cell about to be asked for: its tool call, `pending`; returns its id for the permission request."""
        self._open_cell(code, status="pending")
        assert self.cell is not None
        return self.cell

    def _streamed_piece(self, event: ReplyStreamed) -> None:
        delta = event.delta
        if delta.kind == "start":
            self._partial[event.role] = PartialReply(("send_to", "message"))
            self._thought[event.role] = 0
            return
        if delta.kind == "reasoning":
            if self._show_reasoning and delta.text:
                self._send(update_agent_thought_text(delta.text))
            return
        partial = self._partial.setdefault(event.role, PartialReply(("send_to", "message")))
        partial.feed(delta.text)
        sent = self._thought.get(event.role, 0)
        if self._show_reasoning and len(partial.reasoning) > sent:
            self._send(update_agent_thought_text(partial.reasoning[sent:]))
            self._thought[event.role] = len(partial.reasoning)
        message = partial.values.get("message")
        # `message` has begun, so `send_to` is whole: only a reply to the user streams as the answer.
        if message is not None and partial.values.get("send_to") == USER and message.startswith(self._streamed) and len(message) > len(self._streamed):
            self._send(update_agent_message_text(message[len(self._streamed) :]))
            self._streamed = message

    def _posted(self, post: Post) -> None:
        if post.plan is not None and post.plan.plan.strip() and post.send_from != USER:
            self._plan = post.plan
            self._send(plan_update(post.plan, done=False))
        if post.execution is not None:
            self._cell_ended(post.execution)
        elif post.send_to != USER and post.send_from != USER:
            self._step = post.message  # an instruction to a role: the title of the cells that follow
        if post.is_answer:
            self._answered(post.message)

    def _answered(self, text: str) -> None:
        """The answer whole: the part not streamed yet (a reply repaired after it streamed is sent again, whole)."""
        if text.startswith(self._streamed):
            rest = text[len(self._streamed) :]
        else:
            rest = "\n\n" + text
        if rest:
            self._send(update_agent_message_text(rest))
        self._streamed = text

    def _open_cell(self, code: str, *, status: ToolCallStatus) -> None:
        self.cell, self._code, self._printed, self._last_print = f"cell-{uuid.uuid4().hex[:12]}", code, "", 0.0
        start = start_tool_call(self.cell, title(self._step, code), kind="execute", status=status, content=[code_content(code)], raw_input={"code": code})
        self._send(start)

    def _cell_runs(self, code: str) -> None:
        if self.cell is None or code != self._code:
            self._open_cell(code, status="in_progress")
        else:
            self._send(update_tool_call(self.cell, status="in_progress"))

    def _cell_printed(self, text: str) -> None:
        """What a running cell printed: sent at once, then at most every PRINT_INTERVAL (a timer sends what a burst left)."""
        with self._print_lock:
            if self.cell is None:
                return
            self._printed += text
            wait = self._last_print + PRINT_INTERVAL - time.monotonic()
            if wait <= 0:
                self._send_printed()
            elif self._print_timer is None:
                self._print_timer = threading.Timer(wait, self._send_late)
                self._print_timer.daemon = True
                self._print_timer.start()

    def _send_late(self) -> None:
        with self._print_lock:
            self._print_timer = None
            if self.cell is not None and self._printed:
                self._send_printed()

    def _send_printed(self) -> None:
        assert self.cell is not None
        self._last_print = time.monotonic()
        live = self._printed[-LIVE_PRINT_CHARS:]
        self._send(update_tool_call(self.cell, content=[code_content(self._code), tool_content(text_block(fenced(live)))]))

    def _cell_ended(self, result: ExecutionResult) -> None:
        with self._print_lock:  # a late print update must not follow the cell's end
            if self._print_timer is not None:
                self._print_timer.cancel()
                self._print_timer = None
            if self.cell is None or result.code != self._code:
                self._open_cell(result.code, status="in_progress")
            assert self.cell is not None
            self._send(finished_cell(self.cell, result))
            self.cell = None


def finished_cell(call_id: str, result: ExecutionResult) -> ToolCallProgress:
    """A cell's end: its code, its output as text, its plots as images; `completed` when it succeeded, else `failed`.

    The output's text is also the raw output: clients that show no content (JupyterLab's chat) show that.
    """
    readable = result.prompt_text(marked=False)
    return update_tool_call(
        call_id,
        status="completed" if result.success else "failed",
        content=[code_content(result.code), *output_content(result, readable)],
        raw_output=readable,
    )


def code_content(code: str) -> ContentToolCallContent:
    """A cell's code as Markdown, as editors show it."""
    return tool_content(text_block(fenced(code, "python")))


def output_content(result: ExecutionResult, readable: str) -> list[ContentToolCallContent]:
    """What a cell did as people read it (`readable`: outcome, error, output, variables), and its plots as image content."""
    content = [tool_content(text_block(fenced(readable)))]
    content += [tool_content(image) for image in (image_block(Path(path)) for path in result.artifacts) if image is not None]
    return content


def image_block(path: Path) -> ImageContentBlock | None:
    """A plot the cell saved, as image content (None for other files, missing ones and ones past MAX_IMAGE_BYTES)."""
    kind = mimetypes.guess_type(path.name)[0]
    try:
        if kind not in IMAGE_TYPES or path.stat().st_size > MAX_IMAGE_BYTES:
            return None
        data = path.read_bytes()
    except OSError:
        return None
    return ImageContentBlock(type="image", data=base64.b64encode(data).decode("ascii"), mime_type=kind)


def fenced(text: str, language: str = "") -> str:
    """`text` as a Markdown code block whose fence no run of backticks inside it can close."""
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}{language}\n{text.rstrip()}\n{fence}"


def title(step: str, code: str) -> str:
    """A tool call's title: the step's first line, else the code's, cut to TITLE_CHARS."""
    line = next((line.strip() for line in (step or code).splitlines() if line.strip()), "Run Python")
    return line if len(line) <= TITLE_CHARS else line[: TITLE_CHARS - 1] + "…"


def plan_steps(plan: str) -> list[str]:
    """The plan's steps, one per line, without their numbers."""
    return [_NUMBERED.sub("", line).strip() for line in plan.splitlines() if line.strip()]


def plan_update(plan: Plan, *, done: bool) -> AgentPlanUpdate:
    """The plan as ACP entries: completed before the current step, in progress at it, pending after (all completed when `done`)."""
    steps = plan_steps(plan.plan)
    current = _current_index(steps, plan.plan, plan.current_plan_step)
    entries: list[PlanEntry] = []
    for index, step in enumerate(steps):
        status: PlanEntryStatus
        if done or index < current:
            status = "completed"
        elif index == current:
            status = "in_progress"
        else:
            status = "pending"
        entries.append(plan_entry(step, status=status))
    return update_plan(entries)


def _current_index(steps: Sequence[str], plan: str, current: str) -> int:
    """Which step `current` names: by its number, else by its words; 0 when it names none."""
    number = _NUMBERED.match(current)
    if number is not None and 1 <= int(number.group(1)) <= len(steps):
        return int(number.group(1)) - 1
    words = _NUMBERED.sub("", current).strip().lower()
    return next((index for index, step in enumerate(steps) if words and (words in step.lower() or step.lower() in words)), 0)


def history_updates(rounds: Sequence[Round]) -> Iterator[Update]:
    """A stored session's rounds as the updates its turns sent: the request, the plan, each cell and its output, the answer."""
    for rnd in rounds:
        yield update_user_message_text(rnd.user_query)
        plan: Plan | None = None
        step = ""
        for post in rnd.posts:
            if post.plan is not None and post.plan.plan.strip() and post.send_from != USER and post.plan != plan:
                plan = post.plan
                yield plan_update(plan, done=False)
            if post.execution is not None:
                call_id = f"cell-{post.id}"
                yield start_tool_call(
                    call_id,
                    title(step, post.execution.code),
                    kind="execute",
                    content=[code_content(post.execution.code)],
                    raw_input={"code": post.execution.code},
                )
                yield finished_cell(call_id, post.execution)
            elif post.send_from != USER and post.send_to != USER:
                step = post.message
            if post.is_answer:
                yield update_agent_message_text(post.message)
        if plan is not None and rnd.state == "finished":
            yield plan_update(plan, done=True)
        if rnd.state == "failed":
            yield update_agent_message_text(f"This request failed: {rnd.error or 'no answer'}")
