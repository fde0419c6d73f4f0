"""The Planner: reads the user's request and the results so far, then answers or delegates a step.

Its prompt is `prompts/planner.yaml` with the project's examples, the intro of each enabled role
it may delegate to (`Teammate`), and its own view of the conversation: the user's messages, its own
replies, and the reports of the roles it delegated to. `send_to` accepts those roles' aliases and
"User"; any other recipient gets a repair turn naming them.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from taskweaver_lite.llm.client import ChatModel, DeltaSink
from taskweaver_lite.llm.replies import planner_schema
from taskweaver_lite.memory.compression import RoleContext
from taskweaver_lite.records.conversation import USER, Plan, Post, Round, RoundMessages
from taskweaver_lite.records.events import Working
from taskweaver_lite.records.execution import FoldPiece
from taskweaver_lite.records.model_calls import Message
from taskweaver_lite.roles.role import Role, as_reply_json
from taskweaver_lite.roles.worker import RoleRequest, RoleTools

# The most entries the Planner's list of working files looks at (a notebook's folder may be a whole home folder).
SCAN_LIMIT = 5_000


@dataclass(frozen=True)
class Teammate:
    """A role the Planner may delegate to, as its prompt shows it."""

    alias: str
    intro: str
    plugins: tuple[str, ...] = ()  # one line per plugin loaded in its kernel (the code-running role's)


class Planner(Role):
    """Plans a request and decides, hop by hop, whether to delegate or to answer."""

    def __init__(
        self,
        model: ChatModel,
        *,
        key: str,
        party: str,
        context: RoleContext,
        examples: Sequence[Message],
        on_delta: DeltaSink | None = None,
        max_hops: int,
        working_files: Callable[[], list[str]],
        team: Sequence[Teammate] = (),
    ) -> None:
        """`team`: the enabled roles it may delegate to, in the order its prompt lists them."""
        super().__init__(key, model, party=party, context=context, examples=examples, on_delta=on_delta)
        self._max_hops = max_hops
        self._working_files = working_files
        # The working folder's files, as the request of each round showed them (None: unchanged since the
        # last listing). Listed with the request, not in the system message: a plot saved must not move
        # the prompt's prefix, and a round's request reads the same for as long as the round is shown.
        self._listings: dict[str, tuple[str, ...] | None] = {}
        self._last_listing: tuple[str, ...] | None = None
        self._team = tuple(team)
        self._schema = planner_schema((USER, *(member.alias for member in self._team)))

    def reply(self, request: RoleRequest, tools: RoleTools) -> Post:
        """The Planner's next post in the request's round: to a teammate or to the User."""
        turn = request.turn
        system = self._prompt.render("system", max_hops=self._max_hops, team=self._team)
        fields = self.ask(
            system=system,
            history=request.history,
            current=request.current,
            schema=self._schema,
            repairs=turn.repairs,
            on_repair=lambda problem: turn.notify(Working("repairing", problem)),
        )
        return Post(
            send_from=self.party,
            send_to=fields["send_to"],
            message=fields["message"],
            plan=Plan(init_plan=fields["init_plan"], plan=fields["plan"], current_plan_step=fields["current_plan_step"]),
            reply_json=as_reply_json(fields),
        )

    def hop_limit_post(self, *, hops: int, last: str, plan: Plan | None) -> Post:
        """The message the user gets when a request used up its hops (JSON-shaped, like any Planner reply)."""
        message = self._prompt.render("hop_limit", hops=hops, last=last)
        plan = plan or Plan(init_plan="", plan="", current_plan_step="")
        fields = {**plan.to_dict(), "send_to": USER, "message": message}
        return Post(send_from=self.party, send_to=USER, message=message, plan=plan, reply_json=as_reply_json(fields))

    def file_note(self, name: str) -> str:
        """The note that tells the Planner a file was loaded into the working folder."""
        return self._prompt.render("file_loaded", name=name)

    def render_round(self, rnd: Round) -> RoundMessages:
        """The current round as the Planner's chat messages: each report ends with the code it ran."""
        return self._render(rnd, with_code=True)

    def render_earlier_round(self, rnd: Round) -> RoundMessages:
        """An earlier round: the reports without their code, and what the code printed cut head and tail.

        The Planner judges the current request's steps by their code and whole output; for earlier
        requests the outcome, the output's gist and the variables are what it plans with (the
        CodeGenerator keeps the code, the output's file keeps the rest). A round is shown this way
        only from the first prompt after a fold lands (the memory before it changed, so the server
        recomputes it anyway); until then it is shown whole and every prompt extends the one before
        it, the reply a server generated included.
        """
        return self._render(rnd, with_code=False)

    def _render(self, rnd: Round, *, with_code: bool) -> RoundMessages:
        messages: list[Message] = []
        masked: list[Message] = []
        pieces: list[FoldPiece] = []
        requests: list[int] = []
        for post in rnd.posts:
            if post.send_to == self.party and post.send_from == USER:
                requests.append(len(messages))
                messages.append(Message(role="user", content=self._prompt.render("user", text=post.message) + self._files_note(rnd)))
                masked.append(messages[-1])
                pieces.append(FoldPiece(f"User: {post.message}", essential=True))
            elif post.send_to == self.party:
                result = ""
                if post.execution is not None and with_code:
                    result = post.execution.prompt_text(outcome_told=True)
                elif post.execution is not None:
                    result = post.execution.shortened_prompt_text(self.cut_earlier_output, outcome_told=True)
                # The report's outcome is its message; the code is its own field, shown for the current
                # request only, at the report's end: leaving it out later changes no byte before it.
                code = post.code.strip() if with_code and post.code else ""
                attachments = [a.to_dict() for a in post.attachments]
                render = functools.partial(self._prompt.render, "report", sender=post.send_from, message=post.message, code=code, attachments=attachments)
                messages.append(Message(role="user", content=render(result=result)))
                short = post.execution.masked_prompt_text(outcome_told=True) if post.execution else ""
                masked.append(Message(role="user", content=render(result=short)))
                # The Planner's summary keeps results, not code: the outcome's first line and what it printed.
                outcome = post.message.partition("\n")[0]
                pieces.append(FoldPiece(f"{post.send_from}: {outcome}", essential=True))
                if post.execution is not None:
                    pieces += post.execution.fold_pieces(outcome_told=True)
            elif post.send_from == self.party:
                messages.append(Message(role="assistant", content=post.reply_json or post.message))
                masked.append(messages[-1])
                pieces.append(FoldPiece(f"Planner to {post.send_to}: {post.message}", essential=True))
        shortened = tuple(masked) if masked != messages else ()
        return RoundMessages(index=rnd.index, messages=tuple(messages), fold_pieces=tuple(pieces), requests=tuple(requests), masked=shortened)

    def _files_note(self, rnd: Round) -> str:
        """The files line a round's request carries: taken once per round, shown when the files changed."""
        if rnd.id not in self._listings:
            files = tuple(self._working_files())
            self._listings[rnd.id] = files if files != self._last_listing else None
            self._last_listing = files
        listing = self._listings[rnd.id]
        return "" if listing is None else "\n\n" + self._prompt.render("files", files=listing)


def list_working_files(folder: Path, *, limit: int = 30, scan: int = SCAN_LIMIT) -> list[str]:
    """Data files in the kernel's working folder, with sizes, for the Planner's prompt.

    Hidden files are left out and hidden folders never entered (a notebook's folder may hold a
    `.venv` or `.git` of tens of thousands of files), and at most `scan` entries are looked at.
    """
    if not folder.is_dir():
        return []
    found, complete = _visible_files(folder, scan=scan)
    # A link the kernel made is named as one, never followed (not even for its size).
    shown = [f"{p.relative_to(folder)} ({'a link, not followed' if p.is_symlink() else _size(p.lstat().st_size)})" for p in found[:limit]]
    if len(found) > limit:
        shown.append(f"... and {len(found) - limit} more files")
    if not complete:
        shown.append(f"... (a large folder: only its first {scan:,} entries were looked at)")
    return shown


def _visible_files(folder: Path, *, scan: int) -> tuple[list[Path], bool]:
    """The regular files and links under `folder` outside hidden folders, sorted; False when `scan` entries ran out first."""
    found: list[Path] = []
    looked = 0
    for root, folders, files in os.walk(folder):  # links to folders are listed, never followed
        here = Path(root)
        folders[:] = sorted(name for name in folders if not name.startswith("."))
        entries = [here / name for name in (*files, *folders) if not name.startswith(".")]
        found += [path for path in entries if path.is_symlink() or path.is_file()]
        looked += len(files) + len(folders)
        if looked > scan:
            return sorted(found), False
    return sorted(found), True


def _size(n: int) -> str:
    size = float(n)
    for unit in ("B", "KB", "MB"):
        if size < 1024:
            return f"{size:.0f} {unit}"
        size /= 1024
    return f"{size:.1f} GB"
