"""The demo's scripted model behind the real chat and page: `demo --chat` and `serve --demo`.

`DemoModel` answers whatever is asked, offline: a request that matches one of the demo's requests
(`demo.STEPS`, by its words) gets that request's steps and code, run in the real kernel, and an
answer built from what the code printed; anything else gets the list of requests it knows. It
reads where the turn stands from the messages it is sent, so it needs no queue. A request's number
never reaches it: the demo lists its requests in `session.suggested_requests`, and the session
asks the request a number names.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import json
import re
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from taskweaver_lite.cli.demo import STEPS, Step, _summarize, bundled_project
from taskweaver_lite.config.file import load_config
from taskweaver_lite.config.settings import Config
from taskweaver_lite.errors import TaskWeaverError
from taskweaver_lite.session.session import numbered
from taskweaver_lite.store.database import stored_sessions
from taskweaver_lite.testing.scripted_server import ScriptedServer, code_reply, planner_reply, text_reply

MATCH_RATIO = 0.6  # how close a request must read to a scripted one (difflib's ratio over lowercased words)
REPORT = "CodeInterpreter:"
EXECUTION = "Execution result"


def _text(message: dict[str, Any]) -> str:
    content = message.get("content")
    return content if isinstance(content, str) else ""


def _users(messages: Sequence[dict[str, Any]]) -> list[str]:
    return [_text(m) for m in messages if m.get("role") == "user"]


def _words(text: str) -> str:
    return " ".join(re.findall(r"[a-z0-9]+", text.lower()))


def match_step(text: str) -> Step | None:
    """The scripted request `text` asks for (words close to it), or None."""
    for asked in (part.strip() for part in text.split("\n\n")):  # notes about files come before or after the request
        scores = [(difflib.SequenceMatcher(None, _words(asked), _words(step.request)).ratio(), step) for step in STEPS]
        best, step = max(scores, key=lambda pair: pair[0])
        if best >= MATCH_RATIO:
            return step
    return None


def known_requests() -> str:
    """The numbered list of requests the demo model can answer."""
    return numbered([step.request for step in STEPS])


class DemoModel:
    """Answers the Planner and the CodeGenerator from the demo's script, whatever the user asks."""

    def __init__(self) -> None:
        self.findings: list[str] = []

    def install(self, server: ScriptedServer) -> None:
        """Answer every role on `server` from now on."""
        server.set_default("planner", self.planner)
        server.set_default("code_generator", self.code_generator)
        server.set_default("compression", _summarize)
        server.set_default("other", self.distiller)  # the demo enables no other model role: `/save` and the page's Save button

    def distiller(self, messages: list[dict[str, Any]]) -> str:
        """`/save`'s tips, read off the session's record: each error a revision got past, and what was asked."""
        record = "\n".join(_users(messages))
        errors = dict.fromkeys(re.findall(r"\b(\w+Error): ([^\n]{1,80})", record))
        tips = [
            {"kind": "error_resolution", "text": f"A cell failed with {name}: {value.strip()}; the revision that worked used the names the data really has."}
            for name, value in errors
        ]
        said = re.findall(r"^User to \w+: (.*?)(?=^\w+ (?:to \w+:|ran:)|\Z)", record, re.S | re.M)  # the user's messages
        asked = list(dict.fromkeys(step.request for step in map(match_step, said) if step is not None))
        if asked:
            tips.append({"kind": "preference", "text": f"The user analyses sales.csv (asked: {'; '.join(asked)}); answer with the key number in bold."})
        return json.dumps({"tips": tips})

    def planner(self, messages: list[dict[str, Any]]) -> str:
        """The Planner's next reply: the step's next instruction, or its answer."""
        users = _users(messages)
        asks = [i for i, text in enumerate(users) if not text.startswith(REPORT)]
        request = users[asks[-1]] if asks else ""
        reports = users[asks[-1] + 1 :] if asks else []
        step = match_step(request)
        if step is None:
            return planner_reply(
                f"I am the demo's scripted model: I can answer these requests (type one, or its number):\n\n{known_requests()}",
                send_to="User",
            )
        if len(reports) < len(step.hops):
            instruction = step.hops[len(reports)][0]
            return planner_reply(instruction, plan=step.plan, current_plan_step=step.plan.splitlines()[0])
        return planner_reply(self._answer(step, reports), send_to="User", plan=step.plan, current_plan_step=step.plan.splitlines()[-1])

    def _answer(self, step: Step, reports: list[str]) -> str:
        if not step.hops:
            return "\n".join(f"- {finding}" for finding in self.findings[-3:]) or "- No findings yet: ask one of the other requests first."
        text = step.answer("\n".join(reports))
        self.findings.append(text.split("\n")[0])
        return text

    def code_generator(self, messages: list[dict[str, Any]]) -> str:
        """The code for the Planner's instruction (the script's working version of it)."""
        users = _users(messages)
        if users and users[-1].startswith(EXECUTION):
            return text_reply("The demo's scripted model has no other code for this step.")
        instruction = users[-1] if users else ""
        for step in STEPS:
            for wanted, attempts in step.hops:
                if wanted in instruction:
                    return code_reply(_with_sales(attempts[-1]), thought="Use the sales DataFrame from the kernel.")
        return text_reply("The demo's scripted model has no code for this instruction.")


# The requests can be asked in any order: code that uses `sales` loads it first if no earlier request did.
LOAD_SALES = 'import pandas as pd\nif "sales" not in globals():\n    sales = pd.read_csv("sales.csv", parse_dates=["date"])\n'


def _with_sales(code: str) -> str:
    uses = re.search(r"\bsales\b", code) is not None and not code.lstrip().startswith("import pandas as pd\nsales =")
    return LOAD_SALES + code if uses else code


@contextlib.contextmanager
def demo_config(project: str | None, *, overrides: Sequence[str] = ()) -> Iterator[Config]:
    """A demo project (a new temporary folder, or `project`) whose model is `DemoModel` on a scripted server."""
    if project and Path(project).exists() and any(Path(project).iterdir()) and not (Path(project) / "taskweaver_config.yaml").is_file():
        raise TaskWeaverError(f"{project} holds files but no project; name a new or empty folder, or a project made by `demo` or `init`")
    target = Path(project) if project else Path(tempfile.mkdtemp(prefix="taskweaver-demo-"))
    try:
        if not (target / "taskweaver_config.yaml").is_file():
            shutil.copytree(bundled_project(), target, dirs_exist_ok=True, ignore=shutil.ignore_patterns("sessions", "*.db*", ".chat_history"))
        with ScriptedServer(model="scripted-demo") as server:
            DemoModel().install(server)
            # The session takes a request's number for its words, so the round and its title hold them.
            requests = "session.suggested_requests=" + json.dumps([step.request for step in STEPS])
            settings = [f"llm.api_base={server.url}", "llm.api_key=demo-key", "llm.model=scripted-demo", requests, *overrides]
            yield load_config(target, settings)
    except BaseException:
        # A folder we made for a demo that failed (a port in use, a bad --set), or one stopped (Ctrl-C, SIGTERM) before
        # anything was stored: nothing in it is worth keeping. One that holds sessions stays: `kept_line` says where.
        if not project and not demo_sessions(target):
            shutil.rmtree(target, ignore_errors=True)
        raise


def demo_sessions(folder: Path) -> int:
    """How many sessions a demo project folder holds."""
    store = folder / "sessions.db"
    return len(stored_sessions(store)) if store.is_file() else 0


def kept_line(folder: Path, *, command: str) -> str | None:
    """The line a demo says on its way out when its folder holds sessions: where they are, and the command that goes on with them."""
    count = demo_sessions(folder)
    if not count:
        return None
    return (
        f"The demo's {count} session{'' if count == 1 else 's'} stay in {folder}: `{command} -p {folder}` goes on with them (delete the folder to drop them)."
    )


def sample_data(config: Config) -> Path:
    """The demo's data file, loaded into each new session."""
    return config.project_dir / "sample_data" / "sales.csv"


def run_demo_chat(args: argparse.Namespace) -> int:
    """`demo --chat`: the real chat on the demo's scripted model, with sales.csv loaded."""
    from taskweaver_lite.cli.chat import chat_with

    with demo_config(args.project) as config:
        print(f"Demo project: {config.project_dir}. The scripted model answers the requests listed below.\n", flush=True)
        # The scripted model starts again with each run, so a stored demo session goes on in a later one.
        return chat_with(config, project=config.project_dir, resume=args.resume, preload=[sample_data(config)], command="taskweaver-lite demo --chat")
