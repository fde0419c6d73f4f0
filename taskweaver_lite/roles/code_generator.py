"""The CodeGenerator: write code for a step, run it, fix it, report to the Planner.

In the conversation this role is the party its alias names ("CodeInterpreter": it writes and runs
code; the registry calls it `code_interpreter`, its config section `code_generator`). Its prompt
carries the kernel's live variables (from the executor's snapshot, never from the model's memory),
its examples, and its earlier code with results. With `auto_plugin_selection` the plugins that fit
a step are described in a message just before the step, never in the system message, so the
instructions stay the same from one step to the next (a server's prefix cache keeps them). The code runs in the session's executor; on an
error the traceback goes back for a revision, up to `code_interpreter.max_retry_count` times, and
the outcome goes to the Planner as one post: the outcome in its message, the code in its `code`
field, the result in its `execution` (fields the Planner reads, never text it parses back).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

from taskweaver_lite.errors import ContextOverflowError
from taskweaver_lite.kernel.interface import Executor
from taskweaver_lite.llm.client import ChatModel, DeltaSink
from taskweaver_lite.llm.replies import CODE_GENERATOR_SCHEMA
from taskweaver_lite.memory.compression import RoleContext
from taskweaver_lite.plugins.prompt import PLUGINS_SHARE, render_block, render_mcp_block, select, used_plugins
from taskweaver_lite.records.conversation import Post, Round, RoundMessages
from taskweaver_lite.records.events import CellPrinted, Working
from taskweaver_lite.records.execution import CellCancelled, CellError, ExecutionResult, FoldPiece, as_data
from taskweaver_lite.records.model_calls import Message
from taskweaver_lite.records.plugin_spec import PluginSpec
from taskweaver_lite.roles.role import RepairTurns, Role, as_reply_json
from taskweaver_lite.roles.worker import RoleRequest, RoleTools
from taskweaver_lite.safety.confirm import DECLINED, EDITED_NOTICE, HANDED_OVER, ConfirmCell
from taskweaver_lite.safety.verification import CodeVerifier, refusal_text


class CodeGenerator(Role):
    """Turns one Planner step into code, runs it, revises it on errors, and reports back."""

    def __init__(
        self,
        model: ChatModel,
        *,
        key: str,
        party: str,
        executor: Executor,
        context: RoleContext,
        examples: Sequence[Message],
        on_delta: DeltaSink | None = None,
        max_retry_count: int,
        plugins: Sequence[PluginSpec] = (),
        plugin_top_k: int | None = None,
        verifier: CodeVerifier | None = None,
        confirm: ConfirmCell | None = None,
    ) -> None:
        """`plugin_top_k` set: show only that many plugins, the most relevant to the step (and those used before).

        `verifier` (verification on) refuses cells that break its rules; `confirm` (confirm mode)
        lets a person run, edit or skip each cell that passed. Neither: every cell runs.
        """
        super().__init__(key, model, party=party, context=context, examples=examples, on_delta=on_delta)
        self._executor = executor
        self._max_retry = max_retry_count
        self._plugins = tuple(plugins)
        self._plugin_top_k = plugin_top_k
        self._verifier = verifier
        self._confirm = confirm
        self._step_plugins: dict[str, str] = {}  # a step's post id -> the plugin block shown before it (auto_plugin_selection)

    def reply(self, request: RoleRequest, tools: RoleTools) -> Post:
        """The report on the request's step: the code run, its result, and the outcome."""
        turn = request.turn
        return self.handle(
            request.post, history=request.history, current=lambda: request.current, add_post=turn.add_post, repairs=turn.repairs, notify=turn.notify
        )

    def handle(
        self,
        request: Post,
        *,
        history: Sequence[Round],
        current: Callable[[], Round],
        add_post: Callable[[Post], None],
        repairs: RepairTurns,
        notify: Callable[[Working | CellPrinted], None],
    ) -> Post:
        """Work on `request` (already the last post of `current()`, this role's live view of the round) and return the report."""
        attempts = self._max_retry + 1
        fixed: list[str] = []  # the errors of attempts that were revised, for the Planner's report
        for attempt in range(1, attempts + 1):
            notify(Working("code_writing", f"attempt {attempt}" if attempt > 1 else ""))
            fields = self._generate(history, current(), repairs, notify)
            reply_json = as_reply_json(fields)
            if fields["reply_type"] == "text":
                return Post(send_from=self.party, send_to=request.send_from, message=fields["reply_content"], thought=fields["thought"], reply_json=reply_json)
            code, result = self._reviewed_run(fields["reply_content"], request=request, add_post=add_post, notify=notify)
            if code != fields["reply_content"]:  # a person's edit: later prompts show what ran
                reply_json = as_reply_json({**fields, "reply_content": code})
            handed_over = result.refused == HANDED_OVER  # nothing ran, so nothing to revise: the step ends here
            final = result.success or result.timed_out or result.kernel_died or handed_over or attempt == attempts
            if final:
                return Post(
                    send_from=self.party,
                    send_to=request.send_from,
                    message=_outcome(result, fixed),
                    thought=fields["thought"],
                    code=code,
                    execution=result,
                    reply_json=reply_json,
                )
            if result.error is not None:
                fixed.append(f"{result.error.name}: {as_data(result.error.value, block=False)}")
            add_post(
                Post(
                    send_from=self.party,
                    send_to=self.party,
                    message=self._prompt.render("revise", attempt=attempt + 1, max_attempts=attempts, message=request.message, refused=result.refused),
                    thought=fields["thought"],
                    code=code,
                    execution=result,
                    reply_json=reply_json,
                )
            )
        raise AssertionError("unreachable: the last attempt always returns")

    def _reviewed_run(
        self, proposed: str, *, request: Post, add_post: Callable[[Post], None], notify: Callable[[Working | CellPrinted], None]
    ) -> tuple[str, ExecutionResult]:
        """The code as reviewed (a person may edit or refuse it) and what running it did."""
        code, result = self._review(proposed)
        if result is None:
            notify(Working("code_running", code))
            result = self._run(code, request=request, add_post=add_post, notify=notify)
            if code != proposed:
                result = dataclasses.replace(result, notices=(*result.notices, EDITED_NOTICE))
        return code, result

    def _run(self, code: str, *, request: Post, add_post: Callable[[Post], None], notify: Callable[[Working | CellPrinted], None]) -> ExecutionResult:
        """Run `code`; cut short by Ctrl-C, the cell is still posted with what it printed (/last, /history, exports), then Ctrl-C goes on."""
        try:
            return self._executor.run(code, on_output=lambda stream, text: notify(CellPrinted(stream, text)))
        except CellCancelled as cancelled:
            add_post(Post(send_from=self.party, send_to=request.send_from, message=cancelled.result.outcome(), code=code, execution=cancelled.result))
            raise

    def _review(self, code: str) -> tuple[str, ExecutionResult | None]:
        """The code to run and, when it must not run, the result that says why (verification, then the person)."""
        if self._verifier is not None:
            violations = self._verifier.check(code)
            if violations:
                error = CellError(name="CodeVerificationError", value=refusal_text(violations), traceback="")
                return code, self._not_run(code, "it breaks the verification rules", error=error)
        if self._confirm is None:
            return code, None
        choice = self._confirm(code)
        if choice.action == "skip":
            return code, self._not_run(code, DECLINED)
        if choice.action == "hand_over":
            return code, self._not_run(code, HANDED_OVER)
        return choice.code, None

    def _not_run(self, code: str, why: str, *, error: CellError | None = None) -> ExecutionResult:
        return ExecutionResult(code=code, success=False, error=error, refused=why, variables=self._executor.variables())

    def _generate(self, history: Sequence[Round], current: Round, repairs: RepairTurns, notify: Callable[[Working | CellPrinted], None]) -> dict[str, str]:
        shown = self.shown_plugins(history, current)
        block = render_block(shown, max_tokens=int(self.context.budget * PLUGINS_SHARE), tokenizer=self.context.tokenizer)
        per_step = self._selects_plugins
        step = self._step(current)
        if per_step and step is not None and block:
            # Chosen once per step (its retries show the same), before the round is first rendered.
            self._step_plugins.setdefault(step.id, block)
        kernel = self._executor.environment()
        tools = render_mcp_block(kernel.mcp_servers, max_tokens=int(self.context.budget * PLUGINS_SHARE), tokenizer=self.context.tokenizer)
        system = self._prompt.render(
            "system",
            plugins="" if per_step else block,
            plugins_with_steps=per_step,
            mcp_tools=tools,
            libraries=", ".join(kernel.libraries),
            mounts=", ".join(kernel.mounts),
        )
        try:
            return self.ask(
                system=system,
                history=history,
                current=current,
                schema=CODE_GENERATOR_SCHEMA,
                repairs=repairs,
                on_repair=lambda problem: notify(Working("repairing", problem)),
            )
        except ContextOverflowError as exc:
            if not shown or self._plugin_top_k is not None:
                raise
            raise ContextOverflowError(
                f"{exc} The descriptions of {len(shown)} plugins are part of the instructions: set "
                "code_generator.auto_plugin_selection: true to show only those that fit the step."
            ) from exc

    @property
    def _selects_plugins(self) -> bool:
        """Whether each step shows only the plugins that fit it (auto_plugin_selection, with more plugins than its top-k)."""
        return self._plugin_top_k is not None and len(self._plugins) > self._plugin_top_k

    def _step(self, current: Round) -> Post | None:
        """The step this role is working on: the latest post sent to it by another party."""
        return next((p for p in reversed(current.posts) if p.send_to == self.party and p.send_from != self.party), None)

    def shown_plugins(self, history: Sequence[Round], current: Round) -> tuple[PluginSpec, ...]:
        """The plugins this call's prompt shows: all, or the top-k for the step plus those used earlier."""
        if self._plugin_top_k is None or not self._selects_plugins:
            return self._plugins
        code = [post.code for rnd in (*history, current) for post in rnd.posts if post.code]
        step = self._step(current)
        return select(self._plugins, step.message if step is not None else "", top_k=self._plugin_top_k, keep=used_plugins(self._plugins, code))

    def render_round(self, rnd: Round) -> RoundMessages:
        """One round as the CodeGenerator's chat messages: steps, its code, and what the code did."""
        return self._render(rnd, whole=True)

    def render_earlier_round(self, rnd: Round) -> RoundMessages:
        """An earlier round: steps and code whole, what the code printed and raised cut head and tail.

        Shown this way only from the first prompt after a fold lands, when the server recomputes
        it anyway (compression.py); the code and the error lines are what later code builds on."""
        return self._render(rnd, whole=False)

    def _render(self, rnd: Round, *, whole: bool) -> RoundMessages:
        messages: list[Message] = []
        masked: list[Message] = []
        pieces: list[FoldPiece] = []
        requests: list[int] = []
        names: list[str] = []
        for post in rnd.posts:
            if post.send_to == self.party and post.send_from != self.party:
                plugins = self._step_plugins.get(post.id, "") if whole else ""
                if plugins:  # auto_plugin_selection: the step's plugins, just before it (kept with the round until a fold)
                    messages.append(Message(role="user", content=self._prompt.render("step_plugins", plugins=plugins)))
                requests.append(len(messages))
                messages.append(Message(role="user", content=self._prompt.render("request", message=post.message)))
                pieces.append(FoldPiece(f"{post.send_from} asked: {post.message}", essential=True))
            elif post.send_from == self.party:
                messages.append(Message(role="assistant", content=post.reply_json or post.message))
                if post.execution is None:
                    pieces.append(FoldPiece(f"CodeGenerator answered: {post.message}", essential=True))
                    continue
                masked += messages[len(masked) :]
                retry = "\n\n" + post.message if post.send_to == self.party else ""
                result = post.execution.prompt_text() if whole else post.execution.shortened_prompt_text(self.cut_earlier_output)
                messages.append(Message(role="user", content=self._prompt.render("execution", result=result) + retry))
                masked.append(Message(role="user", content=self._prompt.render("execution", result=post.execution.masked_prompt_text()) + retry))
                pieces.append(FoldPiece(f"Code:\n{post.code}"))
                pieces += post.execution.fold_pieces()
                names += [*post.execution.changes.created, *post.execution.changes.changed]
        masked += messages[len(masked) :]
        return RoundMessages(
            index=rnd.index,
            messages=tuple(messages),
            fold_pieces=tuple(pieces),
            requests=tuple(requests),
            masked=tuple(masked) if masked != messages else (),
            variables=tuple(dict.fromkeys(names)),
        )


def _outcome(result: ExecutionResult, fixed: list[str]) -> str:
    """The report's message: how the code ended and the errors fixed on the way (the code is the post's own field)."""
    attempts = len(fixed) + 1
    if result.refused == HANDED_OVER:
        outcome = f"The code was not run: {HANDED_OVER}."
    elif result.kernel_died:
        outcome = "The kernel died while running the code; it was restarted."
    elif result.timed_out:
        outcome = "The code ran too long and was stopped."
    elif result.success:
        outcome = "The code ran successfully" + (f" (after {len(fixed)} fixes)." if fixed else ".")
    else:
        outcome = f"The code still failed after {attempts} attempts."
    if fixed and (result.success or result.timed_out or result.kernel_died):
        outcome += "\nErrors fixed on the way: " + "; ".join(fixed)
    return outcome
