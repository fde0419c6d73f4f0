"""The `taskweaver-lite` command: parse arguments, run a command, turn errors into messages.

Heavy modules (the kernel client, the openai SDK, rich) are imported inside the commands that use
them, so `taskweaver-lite --help` answers at once.
"""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass

DEFAULT_PORT = 8765  # not 8000: vLLM's default, where a local model may already listen


Commands = argparse._SubParsersAction  # the sub-command parsers a command adds its own to


@dataclass(frozen=True)
class Command:
    """One sub-command, registered one way: `add` gives it its parser (help and options), `run` runs it.

    `run` imports what the command needs when it is chosen, so `taskweaver-lite --help` answers at once.
    """

    name: str
    add: Callable[[Commands[argparse.ArgumentParser]], object]
    run: Callable[[argparse.Namespace], int]


def _lazy(module: str, name: str) -> Callable[[argparse.Namespace], int]:
    """The function `module.name` (taking the parsed arguments), imported when the command runs."""

    def run(args: argparse.Namespace) -> int:
        runner: Callable[[argparse.Namespace], int] = getattr(importlib.import_module(module), name)
        return runner(args)

    return run


def _listing(name: str, about: str, *, shape: str, in_project: bool = True) -> Callable[[Commands[argparse.ArgumentParser]], argparse.ArgumentParser]:
    """How a command that lists something is added: `--json` prints one JSON `shape`; most read a project."""

    def add(commands: Commands[argparse.ArgumentParser]) -> argparse.ArgumentParser:
        listing = commands.add_parser(name, help=about)
        if in_project:
            _project_option(listing)
        listing.add_argument("--json", action="store_true", help=f"one JSON {shape} on stdout")
        return listing

    return add


def _project_listing(module: str, name: str) -> Callable[[argparse.Namespace], int]:
    """A listing of a project's parts: `module.name(project_dir, as_json=...)`, imported when it runs."""

    def run(args: argparse.Namespace) -> int:
        from taskweaver_lite.cli.project import project_dir

        listing: Callable[..., int] = getattr(importlib.import_module(module), name)
        return listing(project_dir(args), as_json=args.json)

    return run


def _add_chat_parser(commands: Commands[argparse.ArgumentParser]) -> None:
    chat = commands.add_parser("chat", help="start (or resume) an interactive session; reads lines from stdin when piped")
    _project_option(chat)
    _overrides_option(chat)
    chat.add_argument("--resume", metavar="ID", help="continue a stored session ('last' for the newest)")
    chat.add_argument("--no-replay", action="store_true", help="with --resume: do not re-run earlier cells to rebuild the kernel's variables")
    chat.add_argument("--confirm", action="store_true", help="show each cell before it runs: run, edit or skip it (a terminal only)")


def _add_init_parser(commands: Commands[argparse.ArgumentParser]) -> None:
    init = commands.add_parser("init", help="create a project folder: commented config, few-shot examples, plugins/, sample data")
    init.add_argument("directory", nargs="?", default="project", metavar="PROJECT_DIR", help="the folder to create (default: ./project)")


def _run_init(args: argparse.Namespace) -> int:
    from taskweaver_lite.cli.init import run_init

    return run_init(args.directory)


def _add_demo_parser(commands: Commands[argparse.ArgumentParser]) -> None:
    demo = commands.add_parser("demo", help="a complete analysis of bundled data with a scripted model (no network, no key)")
    demo.add_argument("-p", "--project", dest="project", default=None, help="where to write the demo project (default: a new temporary folder)")
    demo.add_argument("--plain", action="store_true", help="plain text output, as when piped")
    demo.add_argument("--chat", action="store_true", help="the real chat on the demo's scripted model: type the demo's requests yourself")
    demo.add_argument("--resume", metavar="ID", help="with --chat and -p: continue a stored demo session ('last' for the newest)")


def _run_demo(args: argparse.Namespace) -> int:
    if args.chat:
        from taskweaver_lite.cli.demo_model import run_demo_chat

        return run_demo_chat(args)
    from taskweaver_lite.cli.demo import run_demo

    return run_demo(project=args.project, plain=args.plain or not sys.stdout.isatty())


def _add_sessions_parser(commands: Commands[argparse.ArgumentParser]) -> None:
    sessions = _listing("sessions", "list stored sessions, newest first", shape="array")(commands)
    sessions.add_argument("--delete", metavar="ID", help="delete a stored session for good, with its files, its kernel and the tips saved from it")


def _run_models(args: argparse.Namespace) -> int:
    from taskweaver_lite.cli.models import list_models

    return list_models(as_json=args.json)


def _add_serve_parser(commands: Commands[argparse.ArgumentParser]) -> None:
    """The `serve` command and its options."""
    serve = commands.add_parser("serve", help="a local web page and HTTP API: many sessions, plots and tables in the browser")
    _project_option(serve)
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1; any other needs a token)")
    serve.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port to listen on (default {DEFAULT_PORT}; vLLM takes 8000)")
    serve.add_argument("--token", default=None, help="the token every request must carry (default: env TASKWEAVER_LITE_TOKEN)")
    serve.add_argument("--log", nargs="?", const="-", default=None, metavar="FILE", help="an access log, one line per request (to FILE, or stderr)")
    serve.add_argument("--demo", action="store_true", help="serve a demo project on the scripted model: no network, no key")
    _overrides_option(serve)


def _add_mcp_parser(commands: Commands[argparse.ArgumentParser]) -> None:
    mcp = commands.add_parser("mcp", help="serve this agent to MCP hosts (Claude Desktop, VS Code) on stdin and stdout: its tool `ask` runs a chat turn")
    _project_option(mcp)
    _overrides_option(mcp)


def _add_acp_parser(commands: Commands[argparse.ArgumentParser]) -> None:
    acp = commands.add_parser("acp", help="serve this agent to editors (Zed, JetBrains, JupyterLab) over the Agent Client Protocol on stdin and stdout")
    _project_option(acp)
    _overrides_option(acp)


def _add_export_parser(commands: Commands[argparse.ArgumentParser]) -> None:
    export = commands.add_parser("export", help="write a stored session as a notebook or Markdown")
    export.add_argument("session_id", metavar="ID", help="session id ('last' for the newest)")
    _project_option(export)
    export.add_argument("--format", choices=("ipynb", "md"), help="default: from the output file's name (.md or .ipynb), else ipynb")
    export.add_argument("-o", "--output", metavar="FILE", help="output file (default: <ID>.<format> in the current folder)")
    export.add_argument("--force", action="store_true", help="overwrite the output file if it exists")


def _add_config_parser(commands: Commands[argparse.ArgumentParser]) -> None:
    """The `config` command and its options."""
    parser = commands.add_parser("config", help="show every effective setting and where its value came from (default, file, env VAR, --set)")
    parser.add_argument("--show", action="store_true", help="show the settings (what `config` does; the flag may be left out)")
    parser.add_argument("-p", "--project", dest="project", default=None, metavar="PROJECT_DIR", help="project folder (default: ./project)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE", help="override a config key, as chat does")
    parser.add_argument("--json", action="store_true", help="one JSON array on stdout of {key, value, source}")


def _overrides_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE", help="override a config key (value parsed as YAML); repeatable"
    )


def _project_option(parser: argparse.ArgumentParser) -> None:
    # None, not "project": an error about a missing folder should only suggest -p when it was not passed.
    parser.add_argument("-p", "--project", dest="project", default=None, metavar="PROJECT_DIR", help="project folder (default: ./project)")


def commands() -> tuple[Command, ...]:
    """Every sub-command, in the order `--help` lists them (the modules that add their own parser are light to import)."""
    from taskweaver_lite.cli.audit import add_audit_parser
    from taskweaver_lite.cli.eval import add_eval_parser
    from taskweaver_lite.cli.gateway import add_gateway_parser
    from taskweaver_lite.cli.users import add_users_parser

    plugins = "list the project's plugins (and installed ones) with their state or error"
    docs = "list the documents the document_retriever searches (PROJECT_DIR/docs/), and why any is skipped"
    roles = "list the roles (built in, the project's, installed ones) with their state or error"
    models = "the local model servers reachable (Ollama, LM Studio, llama.cpp, vLLM) and their models"
    return (
        Command("chat", _add_chat_parser, _lazy("taskweaver_lite.cli.chat", "run_chat")),
        Command("init", _add_init_parser, _run_init),
        Command("demo", _add_demo_parser, _run_demo),
        Command("sessions", _add_sessions_parser, _lazy("taskweaver_lite.cli.sessions", "list_sessions")),
        Command("models", _listing("models", models, shape="array", in_project=False), _run_models),
        Command("plugins", _listing("plugins", plugins, shape="array"), _project_listing("taskweaver_lite.cli.plugins", "run_plugins")),
        Command("docs", _listing("docs", docs, shape="object"), _project_listing("taskweaver_lite.cli.docs", "run_docs")),
        Command("roles", _listing("roles", roles, shape="array"), _project_listing("taskweaver_lite.cli.roles", "run_roles")),
        Command("serve", _add_serve_parser, _lazy("taskweaver_lite.cli.serve", "run_serve")),
        Command("mcp", _add_mcp_parser, _lazy("taskweaver_lite.cli.mcp", "run_mcp")),
        Command("acp", _add_acp_parser, _lazy("taskweaver_lite.cli.acp", "run_acp")),
        Command("users", add_users_parser, _lazy("taskweaver_lite.cli.users", "run_users")),
        Command("audit", add_audit_parser, _lazy("taskweaver_lite.cli.audit", "run_audit")),
        Command("gateway", add_gateway_parser, _lazy("taskweaver_lite.cli.gateway", "run_gateway")),
        Command("eval", add_eval_parser, _lazy("taskweaver_lite.cli.eval", "run_eval_command")),
        Command("config", _add_config_parser, _lazy("taskweaver_lite.cli.config", "run_config")),
        Command("export", _add_export_parser, _lazy("taskweaver_lite.cli.sessions", "export_session")),
    )


class _Version(argparse.Action):
    """`--version`: the installed package's version, read only when asked (importlib.metadata is slow to import)."""

    def __init__(self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS, **kwargs: object) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, help=str(kwargs.get("help", "")))

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: object, option_string: str | None = None) -> None:
        from taskweaver_lite import __version__

        print(f"taskweaver-lite {__version__}")
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    """The argument parser for every sub-command."""
    parser = argparse.ArgumentParser(
        prog="taskweaver-lite",
        description="A code-interpreter agent for data analysis: ask in plain language, it plans, writes and runs Python.",
    )
    parser.add_argument("--version", action=_Version, help="show the program's version number and exit")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for command in commands():
        command.add(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    if args.command == "demo" and args.resume and not (args.chat and args.project):
        parser.error("--resume continues a demo chat stored in its folder: add --chat and -p DIR (the folder the demo named)")
    if args.command == "chat" and args.no_replay and not args.resume:
        parser.error("--no-replay only applies to a resumed session: add --resume ID (or --resume last)")
    # SIGTERM, and SIGHUP (the terminal closed), become SystemExit so that sessions save and kernels
    # stop on the way out.
    for signum in (signal.SIGTERM, getattr(signal, "SIGHUP", None)):
        if signum is not None:
            signal.signal(signum, lambda signum, frame: sys.exit(128 + signum))
    # Commands that write notebooks (nbformat) or run the gateway (jupyter_server's events) load jsonschema,
    # which would compile the grammars of an IRI checker no schema of ours uses: 1 s of CPU (see
    # kernel/gateway/launch.py's kernel_gateway_app). This process is ours: no one else's code misses them.
    sys.modules.setdefault("rfc3987_syntax", None)  # type: ignore[arg-type]  # None: its import raises ImportError, which jsonschema allows for
    # The model client's HTTP layer (httpcore) imports trio wherever it is installed (selenium brings it), only to
    # tell which async library runs it; every loop here is asyncio's: 0.13 s of CPU per command that asks a model.
    sys.modules.setdefault("trio", None)  # type: ignore[arg-type]
    from taskweaver_lite.errors import TaskWeaverError
    from taskweaver_lite.safety.terminal import strip_controls

    try:
        return next(command for command in commands() if command.name == args.command).run(args)
    except TaskWeaverError as exc:
        print(f"taskweaver-lite: {strip_controls(str(exc))}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        # The reader of our stdout went away (`taskweaver-lite sessions | head`): nothing left to say.
        # Point stdout at /dev/null so the interpreter's final flush does not fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except OSError as exc:
        print(f"taskweaver-lite: {strip_controls(str(exc))}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("taskweaver-lite: interrupted", file=sys.stderr)
        return 130
