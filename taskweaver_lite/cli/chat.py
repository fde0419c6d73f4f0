"""The chat loop behind `taskweaver-lite chat`: the interactive prompt, piped input, slash commands.

On a terminal: a prompt with history and multi-line paste; Ctrl-C during a step cancels the step,
Ctrl-C or Ctrl-D at an empty prompt exits (not a Ctrl-C meant for a request that just ended; see
prompt_line.py, which also bounds a line). With piped stdin: each non-empty line is one request,
answers go to stdout and everything else to stderr.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from taskweaver_lite.cli.confirm import terminal_confirm
from taskweaver_lite.cli.console import PlainConsole, RichConsole, indent
from taskweaver_lite.cli.experience import experience_command, save_tips
from taskweaver_lite.cli.images import TerminalImages
from taskweaver_lite.cli.plugins import mcp_lines, plugin_table, report_kernel_failures
from taskweaver_lite.cli.project import project_dir, sessions_command
from taskweaver_lite.cli.prompt_line import INTERRUPTED, PromptLine
from taskweaver_lite.cli.roles import role_table
from taskweaver_lite.cli.sessions import export_format
from taskweaver_lite.cli.turns import TurnCommands, session_artifacts
from taskweaver_lite.config.file import CONFIG_FILE_NAME, load_config, merge_overrides
from taskweaver_lite.config.settings import DISTILLER, FOLDER, Config
from taskweaver_lite.config.taskweaver_json import JSON_FILE_NAME
from taskweaver_lite.errors import ConfigError, LLMError, TaskWeaverError, UnknownSessionError
from taskweaver_lite.llm.client import usage_by_purpose
from taskweaver_lite.llm.counting import ModelTokenizer
from taskweaver_lite.llm.discovery import discover, needs_discovery, no_model_found, use_local_server
from taskweaver_lite.llm.tokens import get_tokenizer
from taskweaver_lite.memory.compression import RoleContext
from taskweaver_lite.memory.summary import render_summary
from taskweaver_lite.memory.variables import render_variables
from taskweaver_lite.records.conversation import Round
from taskweaver_lite.records.events import FileLoaded, timeline
from taskweaver_lite.records.execution import ExecutionResult, KernelEnvironment
from taskweaver_lite.records.model_calls import Usage
from taskweaver_lite.safety.confirm import ConfirmCell
from taskweaver_lite.safety.terminal import strip_controls
from taskweaver_lite.safety.workfiles import owner_only_file
from taskweaver_lite.session.assembly import reset_session
from taskweaver_lite.session.export import write_export
from taskweaver_lite.session.model_choice import model_users
from taskweaver_lite.session.session import Session, numbered
from taskweaver_lite.session.workspace import Workspace

# /summary shows the variables list more fully than a prompt can afford to.
SUMMARY_VARIABLES_TOKENS = 4_000

HELP = """Commands:
  /help            this list
  /load <file>     copy a data file (a regular file up to session.max_upload_bytes) into the
                   working folder and tell the Planner
  /info            session id, model, rounds, tokens used so far
  /context         the last prompt sent to each role: tokens per part, against the budget
  /summary         the text each role's prompt carries for its folded rounds (written for the model)
  /history         every earlier request in full, also those folded out of the prompts
  /last            the last cell that ran, with its whole output and traceback
  /plugins         the plugins: enabled, disabled, or why they are not loaded
  /save            distil this session into experience tips for later sessions (a model call)
  /experience [delete ID]   list the experience tips, or delete a stored one
  /roles           the roles: enabled, disabled, or why they are off
  /export [ipynb|md] [file] [--force]   write this session as a notebook or Markdown
  /undo            drop the last request (from the prompts and the store); the kernel is rebuilt
                   by re-running the earlier cells
  /retry           ask the last request again, in place of its first answer
  /model [ROLE] NAME   switch the model from the next request on (ROLE: planner, code_generator,
                   round_compressor); kept when the session is resumed; /model alone shows them
  /open [N]        list the plots and files the cells produced; open number N in the system viewer
  /reset           start over: new session, fresh kernel, working files copied
  /exit            leave (Ctrl-D or Ctrl-C at an empty prompt too)
Ctrl-C while a request runs cancels it and keeps the session."""
EXPORT_USAGE = "Usage: /export [ipynb|md] [file] [--force]"


def run_chat(args: argparse.Namespace) -> int:
    """`taskweaver-lite chat`: interactive on a terminal, line by line when piped."""
    project = project_dir(args)
    overrides: list[str] = list(args.overrides)
    config = load_config(project, overrides)
    if not (project / CONFIG_FILE_NAME).exists() and not (project / JSON_FILE_NAME).exists():
        _to_stderr(f"{project / CONFIG_FILE_NAME} not found: using the defaults (`taskweaver-lite init` writes a commented one).")
    for notice in config.notices:
        _to_stderr(notice)
    if any(item.split("=", 1)[0].strip() == "llm.api_key" for item in overrides):
        _to_stderr(
            "Warning: a key given with --set llm.api_key is visible to every program on this machine (ps, "
            "/proc/<pid>/cmdline) and in your shell history: set OPENAI_API_KEY in the environment instead."
        )
    if needs_discovery(config):
        servers = discover()
        found = use_local_server(config, servers)
        if found is None:
            raise ConfigError(no_model_found(config, servers))
        _to_stderr(found)
    shown = project if args.project is not None else None
    return chat_with(config, project=shown, resume=args.resume, replay=not args.no_replay, confirm=args.confirm, overrides=overrides)


def chat_with(
    config: Config,
    *,
    project: Path | None,
    resume: str | None = None,
    replay: bool = True,
    confirm: bool = False,
    overrides: Sequence[str] = (),
    preload: Sequence[Path] = (),
    command: str = "taskweaver-lite chat",
) -> int:
    """The chat on `config` (a new session, or `resume` one); `preload` files are loaded into a new one first.

    The closing hint says how to continue: `command`, with `-p project` when one is given.
    """
    interactive = sys.stdin.isatty()  # piped behaviour is decided by stdin alone (stdout may be a terminal)
    confirm_mode = confirm or config.execution.confirm
    if confirm_mode and not interactive:
        raise ConfigError(
            "Confirm mode (--confirm or execution.confirm: true) asks before each cell runs, so it needs a terminal; "
            "stdin is piped here. Run without it, or interactively."
        )
    renderer: RichConsole | PlainConsole = RichConsole(show_reasoning=config.llm.show_reasoning) if interactive else PlainConsole()
    say: Callable[[str], None] = renderer.say
    asks = terminal_confirm(renderer) if confirm_mode and isinstance(renderer, RichConsole) else None
    workspace = Workspace(config)  # the project opened once: its store and catalogs serve every session of this chat
    try:
        if resume:
            session, kept = _resume(workspace, resume, replay=replay, overrides=list(overrides), renderer=renderer, say=say, confirm=asks)
        else:
            _fit_display(config, renderer)
            session, kept = workspace.new_session(listeners=[renderer], confirm=asks), list(overrides)
        return _converse(session, kept, renderer, preload=() if resume else preload, project=project, command=command, fresh=not resume)
    finally:
        workspace.close()


def _converse(
    session: Session, kept: list[str], renderer: RichConsole | PlainConsole, *, preload: Sequence[Path], project: Path | None, command: str, fresh: bool
) -> int:
    """The chat itself, on an open session: its --set values kept, problems told, `preload` loaded, then the requests.

    `command` continues it; a `fresh` session is shown the suggested requests.
    """
    say = renderer.say
    if session.store is not None:
        session.store.save_overrides(session.id, kept)
    _report_problems(session, renderer)
    for path in preload:
        loaded = session.load_file(path)
        say(f"Loaded {loaded.name} into the working folder.")
    suggested = session.config.session.suggested_requests
    if suggested and fresh:
        say("Requests to try (type one, or its number):\n" + numbered(suggested))
    commands = SlashCommands(session, say=say, remember=lambda item: _remember(commands.session, item))
    if isinstance(renderer, RichConsole):
        renderer.images = TerminalImages.detect()  # asks the terminal: before the prompt reads stdin
        renderer.artifact_total = lambda: len(session_artifacts(commands.session.conversation.rounds))
        renderer.folders = (session.working_dir, session.working_dir.parent / "artifacts")  # an answer's paths in them become links
    try:
        if isinstance(renderer, RichConsole):
            code = _interactive(renderer, commands)
        else:
            code = _piped(commands)
    finally:
        commands.session.close()
    say(resume_hint(commands.session, project, command=command))
    return code


def _report_problems(session: Session, renderer: RichConsole | PlainConsole) -> None:
    """Broken plugins and roles, unreadable experience files, and (once it has started) the kernel's plugin imports: a line each on stderr."""
    for entry in session.plugins.broken:
        _to_stderr(strip_controls(entry.line()))
    for line in [*session.role_problems, *session.experience.problems()]:
        _to_stderr(strip_controls(line))
    report_kernel_failures(session, renderer, to_stderr=_to_stderr)


def _remember(session: Session, item: str) -> None:
    """Store a `KEY=VALUE` with the session's --set values, so that a resume applies it."""
    if session.store is not None:
        session.store.save_overrides(session.id, merge_overrides(session.store.overrides(session.id), [item]))


def _fit_display(config: Config, renderer: RichConsole | PlainConsole) -> None:
    """The kernel's DataFrames as wide as this terminal, unless execution.display_width fixes a width."""
    if isinstance(renderer, RichConsole) and config.execution.display_width is None and renderer.console.width >= MIN_DISPLAY_WIDTH:
        config.execution.display_width = renderer.console.width


MIN_DISPLAY_WIDTH = 40


def _kernel_lines(kernel: KernelEnvironment) -> list[str]:
    """/info's kernel lines: its Python, the libraries it can import, the user's folders it sees, its sandbox, filter and disk use."""
    lines = [f"Kernel:   {kernel.python}"] if kernel.python else []
    lines.append(f"Libraries: {', '.join(kernel.libraries) or 'not known yet'}")
    lines += [f"Mount:    {mount}" for mount in kernel.mounts]
    lines += [f"{layer + ':':<9} {state}" for layer, state in kernel.safety]
    return lines


def model_names(session: Session) -> str:
    """The banner's model: one name, or each part's when they differ."""
    models = {user: session.config.llm_for(user).model for user in model_users(session)}
    if len(set(models.values())) == 1:
        return f"model {session.config.llm.model}"
    return "models " + ", ".join(f"{user} {model}" for user, model in models.items())


def _model_lines(config: Config, contexts: Sequence[RoleContext]) -> list[str]:
    """/info's model lines: one when every part uses `llm`, else one per role, the folder and the distiller, with its window."""
    models = {**{context.role: context.llm for context in contexts}, FOLDER: config.llm_for(FOLDER), DISTILLER: config.llm_for(DISTILLER)}
    if all(llm == config.llm for llm in models.values()):
        return [f"Model:    {config.llm.model} (context window {config.llm.context_window:,} tokens)"]
    return ["Models:"] + [f"  {user}: {llm.model} (context window {llm.context_window:,} tokens)" for user, llm in models.items()]


def resume_hint(session: Session, project: Path | None, *, command: str = "taskweaver-lite chat") -> str:
    """The lines printed on the way out: prompt tokens per role (cached and not), the session id and the command that continues it."""
    if not session.conversation.rounds:
        return f"Session {session.id} had no requests; nothing was kept to resume."
    option = f" -p {project}" if project is not None else ""
    by_purpose = usage_by_purpose(session.usage_by_model())
    # A purpose whose calls all failed (an unreachable server on the first request) sent no tokens worth a line.
    by_role = "; ".join(f"{purpose} {_cached_and_not(part)}" for purpose, part in by_purpose.items() if part.prompt_tokens)
    tokens = f"Prompt tokens by role: {by_role}.\n" if by_role else ""
    return f"{tokens}Session {session.id} is saved. Continue it with: {command}{option} --resume {session.id}"


def _cached_and_not(usage: Usage) -> str:
    """'12,345 (9,000 cached, 3,345 uncached)': prompt tokens and what the servers cached of them."""
    return f"{usage.prompt_tokens:,} ({usage.cached_tokens:,} cached, {usage.uncached_tokens:,} uncached)"


def cache_lines(session: Session, role: str) -> list[str]:
    """/context's lines on what the servers cached of a role's prompts and of its folds', this process's calls."""
    by_purpose = usage_by_purpose(session.usage_by_model())
    named = ((f"{role}'s calls", by_purpose.get(role)), ("its folds", by_purpose.get(f"compression_{role}")))
    return [f"{who}: {part.cache_line()}" for who, part in named if part is not None and part.calls]


def _resume(
    workspace: Workspace,
    ref: str,
    *,
    replay: bool,
    overrides: list[str],
    renderer: RichConsole | PlainConsole,
    say: Callable[[str], None],
    confirm: ConfirmCell | None,
) -> tuple[Session, list[str]]:
    """Resume with the --set values the session was started with (new ones win); returns it and those values."""
    project = workspace.config.project_dir
    try:
        remembered = workspace.remembered_overrides(ref)
        if remembered:
            overrides = merge_overrides(remembered, overrides)
            # Under what the workspace was opened with (the demo's model and address are --set values too), the
            # remembered ones, then this command's: a resume changes what the session changed, nothing more.
            base = list(workspace.config.sources.overrides)
            workspace = workspace.reconfigured(load_config(project, merge_overrides(base, overrides)))  # the same store: the caller closes it
        _fit_display(workspace.config, renderer)  # after the reload: the stored settings must not undo the terminal's width
        session = _resume_session(workspace, ref, replay=replay, renderer=renderer, say=say, confirm=confirm)
    except UnknownSessionError as exc:
        raise exc.listed_with(sessions_command(project)) from None
    if remembered:
        say("Re-applied the settings this session was started with: " + " ".join(f"--set {item}" for item in remembered))
    return session, overrides


def _resume_session(
    workspace: Workspace, ref: str, *, replay: bool, renderer: RichConsole | PlainConsole, say: Callable[[str], None], confirm: ConfirmCell | None = None
) -> Session:
    if isinstance(renderer, RichConsole):
        from rich.progress import Progress

        with Progress(transient=True, console=renderer.console) as progress:
            task = progress.add_task("Re-running earlier cells", total=None)
            session, report = workspace.resume_session(
                ref,
                replay=replay,
                listeners=[renderer],
                on_replay=lambda done, total: progress.update(task, completed=done, total=total),
                confirm=confirm,
            )
    else:
        session, report = workspace.resume_session(
            ref, replay=replay, listeners=[renderer], on_replay=lambda done, total: say(f"Re-running earlier cells: {done}/{total}")
        )
    lines = [f"Resumed session {report.session_id}: {report.rounds} earlier request{'' if report.rounds == 1 else 's'}."]
    if report.cut_off:
        lines.append(f"Request {', '.join(map(str, report.cut_off))} was cut off when the program stopped; it is marked failed.")
    if replay and report.replayed:
        failed = f", {report.replay_failures} failed" if report.replay_failures else ""
        cells = "cell" if report.replayed == 1 else "cells"
        lines.append(f"Re-ran {report.replayed} {cells} to rebuild the kernel's variables{failed}.")
    elif report.lost:
        lines.append(f"Not replayed: these variables are gone until recomputed: {', '.join(report.lost)}.")
    if report.unrestored:
        lines.append(f"Not restored (the store has no copy): {', '.join(report.unrestored)}; load them again with /load.")
    say("\n".join(lines))
    return session


def _interactive(renderer: RichConsole, commands: SlashCommands) -> int:
    config = commands.session.config  # the session's own: after a resume, with the --set values it was started with
    config.project_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    owner_only_file(config.state_dir / ".chat_history", create=True)  # every request typed: the owner's only
    line = PromptLine(config.state_dir / ".chat_history")
    renderer.say(f"taskweaver-lite session {commands.session.id} — {model_names(commands.session)}. Type /help for commands.", style="bold")
    while True:
        try:
            text = _next_request(renderer, commands, line)
            if text is None:
                return 0
            if text:
                _ask_on_terminal(renderer, commands, text)
                line.request_ended()
        except KeyboardInterrupt:
            # Ctrl-C outside the prompt and outside a request (a request just ended, a command ran): not a wish to leave.
            renderer.stop_status()
            renderer.say(INTERRUPTED, style="yellow")


def _next_request(renderer: RichConsole, commands: SlashCommands, line: PromptLine) -> str | None:
    """The next request typed at the prompt ('' when there is none to ask: a command ran, a line was refused); None to leave."""
    renderer.flush_notices()  # a quiet moment: between the last output and the next input
    text, notice = line.read("you> ")
    if notice:
        renderer.say(notice, style="yellow")
        return ""
    if text is None or not is_command(text):
        return text
    if not commands.run(text):
        return None
    return commands.take_request() or ""


def _ask_on_terminal(renderer: RichConsole, commands: SlashCommands, text: str) -> None:
    """One request on a terminal: Ctrl-C cancels it, a failure is said, the session goes on."""
    try:
        rnd = commands.session.ask(text)
    except KeyboardInterrupt:
        renderer.stop_status()
        cut = last_execution(commands.session.conversation.rounds[-1:])
        kept = " /last shows what the cell printed before it stopped." if cut is not None and cut[1].cancelled else ""
        renderer.say(f"Cancelled. The session and its variables are kept.{kept}", style="yellow")
    except TaskWeaverError as exc:
        renderer.stop_status()
        renderer.say(f"{exc}", style="bold red")
        renderer.say("The session is kept; try again, or check the settings.")
    else:
        if rnd.state == "failed":
            renderer.say(f"This request failed: {rnd.error}", style="bold red")


def _to_stderr(text: str) -> None:
    print(strip_controls(text), file=sys.stderr, flush=True)


def _piped(commands: SlashCommands) -> int:
    say = _to_stderr
    for text in _stdin_lines(say):
        if not text.strip():
            continue
        if is_command(text):  # known or not, as on a terminal: an unknown one is refused, never sent to the model
            if not commands.run(text.strip()):
                return 0
            text = commands.take_request() or ""
            if not text:
                continue
        try:
            rnd = commands.session.ask(text)
        except KeyboardInterrupt:
            say("Cancelled. The session and its variables are kept.")
        except LLMError as exc:  # the model is unreachable or refuses us: fatal when piped: a script must not hang on it
            say(f"taskweaver-lite: {exc}")
            return 1
        except TaskWeaverError as exc:  # this request failed; the next line may still work
            say(f"This request failed: {exc}")
        else:
            if rnd.state == "failed":
                say(f"This request failed: {rnd.error}")
    return 0


def _stdin_lines(say: Callable[[str], None]) -> Iterator[str]:
    """Piped stdin's lines as text; a line that does not decode is named in one line and skipped, the rest go on."""
    encoding = getattr(sys.stdin, "encoding", None) or "utf-8"
    binary = getattr(sys.stdin, "buffer", None)
    if binary is None:  # a text stream put in place of stdin (embedding): nothing to decode
        yield from (line.rstrip("\r\n") for line in sys.stdin)
        return
    for number, raw in enumerate(binary, 1):
        try:
            yield raw.decode(encoding).rstrip("\r\n")
        except UnicodeDecodeError as exc:
            say(f"stdin: line {number} is not {encoding} text (byte 0x{raw[exc.start]:02x} at column {exc.start + 1}); skipped it: pipe {encoding} text")


def is_command(line: str) -> bool:
    """Whether a line is a chat command (`/help`, `/clear`): a slash and a word first; `/data/x.csv ...` is a request naming a path."""
    first = line.strip().split(maxsplit=1)[0] if line.strip() else ""
    return first.startswith("/") and len(first) > 1 and "/" not in first[1:]


class SlashCommands(TurnCommands):
    """The `/...` commands of a chat; each prints through `say`."""

    def __init__(self, session: Session, *, say: Callable[[str], None], remember: Callable[[str], None] | None = None) -> None:
        self.session = session
        self.say = say
        self._remember = remember
        self._table: dict[str, Callable[[str], bool]] = {
            "/undo": self._undo,
            "/retry": self._retry,
            "/model": self._model,
            "/open": self._open,
            "/help": self._help,
            "/exit": lambda _: False,
            "/quit": lambda _: False,
            "/load": self._load,
            "/info": self._info,
            "/reset": self._reset,
            "/context": self._context,
            "/summary": self._summary,
            "/history": self._history,
            "/last": self._last,
            "/export": self._export,
            "/plugins": self._plugins,
            "/save": self._save,
            "/experience": self._experience,
            "/roles": self._roles,
        }

    def run(self, line: str) -> bool:
        """Run one command line; False means the chat should end."""
        name, _, rest = line.partition(" ")
        handler = self._table.get(name)
        if handler is None:
            self.say(f"Unknown command {name}. Type /help for the list.")
            return True
        try:
            return handler(rest.strip())
        except (TaskWeaverError, OSError) as exc:
            self.say(str(exc))
            return True

    def _help(self, _: str) -> bool:
        self.say(HELP)
        return True

    def _load(self, argument: str) -> bool:
        if not argument:
            self.say("Usage: /load <file>")
            return True
        target = self.session.load_file(Path(argument.strip("'\"")))
        self.say(f"Loaded {target.name} into the working folder ({target}). The Planner will know with your next request.")
        return True

    def _info(self, _: str) -> bool:
        s = self.session
        usage = s.usage()
        rounds = s.conversation.rounds
        failed = sum(r.state == "failed" for r in rounds)
        self.say(
            "\n".join(
                [
                    f"Session:  {s.id}",
                    *_model_lines(s.config, list(s.contexts().values())),
                    f"Rounds:   {len(rounds)} ({failed} failed)",
                    f"Tokens:   {usage.prompt_tokens:,} in ({usage.cached_tokens:,} cached, {usage.uncached_tokens:,} uncached), "
                    f"{usage.completion_tokens:,} out over {usage.calls} model calls",
                    *(
                        f"  {purpose} on {model or 'the given model'}: {_cached_and_not(part).replace(' (', ' in (', 1)}, "
                        f"{part.completion_tokens:,} out over {part.calls} call{'' if part.calls == 1 else 's'}"
                        for (purpose, model), part in s.usage_by_model().items()
                    ),
                    f"Folder:   {s.working_dir}",
                    *_kernel_lines(s.executor.environment()),
                ]
            )
        )
        return True

    def _reset(self, _: str) -> bool:
        old = self.session.id
        self.session = reset_session(self.session)
        self.say(f"Started over as session {self.session.id} with a fresh kernel and a copy of the working files ({old} stays stored).")
        for line in self.session.reset_report.notices() if self.session.reset_report is not None else ():
            self.say(line)
        return True

    def _plugins(self, _: str) -> bool:
        failures = getattr(self.session.executor, "plugin_failures", ())
        table = plugin_table(self.session.plugins.entries, failures)
        servers = mcp_lines(getattr(self.session.executor, "mcp_servers", ()))
        self.say("\n".join([table, "MCP servers (mcp.servers):", *servers]) if servers else table)
        return True

    def _roles(self, _: str) -> bool:
        self.say(role_table(self.session.roles.entries))
        return True

    def _save(self, _: str) -> bool:
        save_tips(self.session, self.say)
        return True

    def _experience(self, argument: str) -> bool:
        experience_command(self.session, argument, self.say)
        return True

    def _history(self, _: str) -> bool:
        entries = list(timeline(self.session.conversation.rounds, self.session.loads))
        texts = [round_transcript(e) if isinstance(e, Round) else f"({load_line(e)})" for e in entries]
        self.say("\n\n".join(texts) if texts else "No requests yet.")
        return True

    def _last(self, _: str) -> bool:
        found = last_execution(self.session.conversation.rounds)
        if found is None:
            self.say("No code has run in this session yet.")
            return True
        rnd, result = found
        text = f"The last cell that ran (request {rnd.index}), with everything it returned:\n{indent(result.code)}\n\n{result.prompt_text()}"
        full = Path(result.full_output_path) if result.full_output_path else None
        if full is not None and full.is_file():
            text += f"\n\nIts complete output ({full}):\n{full.read_text(encoding='utf-8', errors='replace').rstrip()}"
        self.say(text)
        return True

    def _export(self, argument: str) -> bool:
        parts = argument.split()
        force = "--force" in parts
        parts = [p for p in parts if p != "--force"]
        fmt = parts.pop(0) if parts and parts[0] in ("ipynb", "md") else None
        if len(parts) > 1:
            self.say(EXPORT_USAGE)
            return True
        target = Path(parts[0]) if parts else None
        written = write_export(self.session.config, self.session.id, fmt=export_format(fmt, target), target=target, force=force)
        self.say(f"Wrote {written}")
        return True

    def _context(self, _: str) -> bool:
        self.say("The last prompt sent to each role, in tokens by part, against the role's budget:")
        for context in self.session.contexts().values():
            report = context.report()
            if report is None:
                self.say(f"{context.label} ({context.strategy}): no prompt built yet")
                continue
            cost = report.cost
            lines = [f"{context.label} ({report.strategy}): {cost.total:,} of {report.budget:,} tokens ({cost.total / report.budget:.0%})"]
            lines += [f"  {part:<16}{tokens:>9,}" for part, tokens in report.parts().items()]
            if isinstance(context.tokenizer, ModelTokenizer):
                lines.append(f"  counted with {context.tokenizer.describe()}")
            notes = []
            if report.folded_through:
                notes.append(f"rounds 1-{report.folded_through} folded into the summary")
            if cost.rounds_dropped:
                notes.append(f"rounds {', '.join(map(str, cost.rounds_dropped))} left out to fit")
            if cost.examples_left_out:
                notes.append("examples left out to fit")
            if cost.variables_cut:
                notes.append("variables list shortened to fit")
            if cost.summary_cut or cost.summary_left_out:
                notes.append("summary " + ("left out" if cost.summary_left_out else "cut") + " to fit")
            if cost.messages_cut:
                notes.append(f"{cost.messages_cut} long messages cut")
            if report.fold_running:
                notes.append("a fold is running in the background")
            lines += [f"  ({'; '.join(notes)})"] if notes else []
            lines += [f"  {line}" for line in cache_lines(self.session, context.role)]
            self.say("\n".join(lines))
        return True

    def _summary(self, _: str) -> bool:
        self.say(
            "What each role's prompt carries in place of its folded rounds. It is written for the model "
            "(the next prompt includes it as it is), not a report for you; /history has every request in full."
        )
        live = self.session.live_variables()
        tokenizer = get_tokenizer(self.session.config.llm.tokenizer)
        for context in self.session.contexts().values():
            state = context.state
            if not state.folded_through:
                self.say(f"{context.label}: nothing folded yet")
                continue
            text = render_summary(state)
            if context.lists_variables:
                text += "\n\n" + render_variables(live, described=state.variables, max_tokens=SUMMARY_VARIABLES_TOKENS, tokenizer=tokenizer).text
            self.say(f"{context.label}:\n{text}")
        return True


def round_transcript(rnd: Round) -> str:
    """One round in full, for /history: request, every step, code, results and the answer."""
    lines = [f"[{rnd.index}] You: {rnd.user_query}" + ("" if rnd.state != "failed" else f"  (failed: {rnd.error})")]
    for post in rnd.posts:
        if post.send_from == "User":
            continue
        if post.code:
            lines.append(f"  {post.send_from} ran:\n" + indent(post.code))
        if post.execution is not None:
            lines.append(indent(post.execution.prompt_text(marked=False)))
        else:
            lines.append(f"  {post.send_from} -> {post.send_to}: {post.message}")
    return "\n".join(lines)


def load_line(load: FileLoaded) -> str:
    """A /load in /history."""
    return f"after request {load.after_round}: {load.describe()}" if load.after_round else load.describe()


def last_execution(rounds: list[Round]) -> tuple[Round, ExecutionResult] | None:
    """The newest cell the kernel ran, with its round."""
    for rnd in reversed(rounds):
        for post in reversed(rnd.posts):
            if post.execution is not None:
                return rnd, post.execution
    return None
