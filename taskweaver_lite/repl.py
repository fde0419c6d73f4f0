"""The chat loop behind `taskweaver-lite chat`: the interactive prompt, piped input, slash commands.

On a terminal: a prompt with history and multi-line paste; Ctrl-C during a step cancels the step,
Ctrl-C or Ctrl-D at an empty prompt exits. With piped stdin: each non-empty line is one request,
answers go to stdout and everything else to stderr.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Callable

from taskweaver_lite.config import Config, load_config
from taskweaver_lite.console import PlainConsole, RichConsole
from taskweaver_lite.errors import LLMError, TaskWeaverError
from taskweaver_lite.session import Session
from taskweaver_lite.summary import render_summary

HELP = """Commands:
  /help            this list
  /load <file>     copy a data file into the working folder and tell the Planner
  /info            session id, model, rounds, tokens used so far
  /context         tokens per prompt part for each role, against the budget
  /summary         both roles' summaries and the variables they track
  /reset           forget the conversation and restart the kernel (files stay)
  /exit            leave (Ctrl-D or Ctrl-C at an empty prompt too)
Ctrl-C while a request runs cancels it and keeps the session."""


def run_chat(args: argparse.Namespace) -> int:
    """`taskweaver-lite chat`: interactive on a terminal, line by line when piped."""
    config = load_config(args.project, args.overrides)
    interactive = sys.stdin.isatty() and sys.stdout.isatty()
    renderer: RichConsole | PlainConsole = RichConsole() if interactive else PlainConsole()
    session = Session.open(config, listeners=[renderer])
    say: Callable[[str], None]
    if isinstance(renderer, RichConsole):
        say = renderer.console.print
    else:
        say = lambda text: print(text, file=sys.stderr, flush=True)  # noqa: E731
    commands = SlashCommands(session, say=say)
    try:
        if isinstance(renderer, RichConsole):
            return _interactive(session, renderer, commands, config)
        return _piped(session, commands)
    finally:
        session.close()


def _interactive(session: Session, renderer: RichConsole, commands: SlashCommands, config: Config) -> int:
    from prompt_toolkit import PromptSession
    from prompt_toolkit.history import FileHistory
    from prompt_toolkit.key_binding import KeyBindings

    bindings = KeyBindings()

    @bindings.add("c-c")
    def _(event) -> None:  # type: ignore[no-untyped-def]
        # Ctrl-C clears a half-typed line; at an empty prompt it leaves.
        if event.current_buffer.text:
            event.current_buffer.reset()
        else:
            event.app.exit(exception=EOFError())

    config.project_dir.mkdir(parents=True, exist_ok=True)
    prompt = PromptSession(history=FileHistory(str(config.project_dir / ".chat_history")), key_bindings=bindings)
    renderer.console.print(f"[bold]taskweaver-lite[/bold] session {session.id} — model {config.llm.model}. Type /help for commands.")
    while True:
        try:
            text = prompt.prompt("you> ").strip()
        except (EOFError, KeyboardInterrupt):
            return 0
        if not text:
            continue
        if text.startswith("/"):
            if not commands.run(text):
                return 0
            continue
        try:
            session.ask(text)
        except KeyboardInterrupt:
            renderer.stop_status()
            renderer.console.print("[yellow]Cancelled. The session and its variables are kept.[/yellow]")
        except LLMError as exc:
            renderer.stop_status()
            renderer.console.print(f"[bold red]{exc}[/bold red]\nThe session is kept; try again or check the llm settings.")


def _piped(session: Session, commands: SlashCommands) -> int:
    for line in sys.stdin:
        text = line.strip()
        if not text:
            continue
        if text.startswith("/") and commands.known(text):
            if not commands.run(text):
                return 0
            continue
        try:
            session.ask(text)
        except KeyboardInterrupt:
            print("Cancelled. The session and its variables are kept.", file=sys.stderr, flush=True)
        except LLMError as exc:
            print(f"taskweaver-lite: {exc}", file=sys.stderr, flush=True)
            return 1
    return 0


class SlashCommands:
    """The `/...` commands of a chat; each prints through `say`."""

    def __init__(self, session: Session, *, say: Callable[[str], None]) -> None:
        self.session = session
        self.say = say
        self._table: dict[str, Callable[[str], bool]] = {
            "/help": self._help,
            "/exit": lambda _: False,
            "/quit": lambda _: False,
            "/load": self._load,
            "/info": self._info,
            "/reset": self._reset,
            "/context": self._context,
            "/summary": self._summary,
        }

    def known(self, line: str) -> bool:
        """Whether the line starts with a command this chat knows."""
        return line.split(maxsplit=1)[0] in self._table

    def run(self, line: str) -> bool:
        """Run one command line; False means the chat should end."""
        name, _, rest = line.partition(" ")
        handler = self._table.get(name)
        if handler is None:
            self.say(f"Unknown command {name}. Type /help for the list.")
            return True
        try:
            return handler(rest.strip())
        except TaskWeaverError as exc:
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
                    f"Model:    {s.config.llm.model} (context window {s.config.llm.context_window:,} tokens)",
                    f"Rounds:   {len(rounds)} ({failed} failed)",
                    f"Tokens:   {usage.prompt_tokens:,} in, {usage.completion_tokens:,} out over {usage.calls} model calls",
                    f"Folder:   {s.working_dir}",
                ]
            )
        )
        return True

    def _reset(self, _: str) -> bool:
        self.session.reset()
        self.say("The conversation is cleared and the kernel restarted; files in the working folder stay.")
        return True

    def _context(self, _: str) -> bool:
        for role, context in self.session.contexts().items():
            report = context.report()
            if report is None:
                self.say(f"{role} ({context.strategy}): no prompt built yet")
                continue
            lines = [f"{role} ({report.strategy}): {report.total:,} of {report.budget:,} tokens ({report.total / report.budget:.0%})"]
            lines += [f"  {part:<16}{tokens:>9,}" for part, tokens in report.parts().items()]
            notes = []
            if report.folded_through:
                notes.append(f"rounds 1-{report.folded_through} folded into the summary")
            if report.rounds_dropped:
                notes.append(f"rounds {', '.join(map(str, report.rounds_dropped))} left out to fit")
            if report.examples_left_out:
                notes.append("examples left out to fit")
            if report.messages_cut:
                notes.append(f"{report.messages_cut} long messages cut")
            if report.fold_running:
                notes.append("a fold is running in the background")
            lines += [f"  ({'; '.join(notes)})"] if notes else []
            self.say("\n".join(lines))
        return True

    def _summary(self, _: str) -> bool:
        live = self.session.live_variables()
        for role, context in self.session.contexts().items():
            state = context.state
            if not state.folded_through:
                self.say(f"{role}: nothing folded yet")
                continue
            self.say(f"{role}:\n{render_summary(state, live=live if role == 'CodeGenerator' else None)}")
        return True
