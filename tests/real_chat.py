"""A chat with a real model on the bundled sample data, measured: repair turns, requests failed on their
format, cells run. The `real` tier (tests/test_real_chat.py) and bench/structured_bench.py both run it.

The project is the bundled one (`project/`, its plugins and `sample_data/sales.csv`), pointed at a
llama-server, with `llm.structured` as asked. Replies are capped (`llm.reply_reserve`) and a request
may delegate a few steps only, so that three requests on two shared cores take minutes, not an hour.
The model's sampling is the server's: the test tier seeds it (`--seed`), so that its chat is the same
on every run on one machine; the bench does not, and measures how the chat varies.
"""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from taskweaver_lite.config.file import load_config
from taskweaver_lite.config.settings import Config
from taskweaver_lite.records.conversation import Round
from taskweaver_lite.records.events import Event, Working
from taskweaver_lite.session.assembly import open_session
from taskweaver_lite.testing.llama_server import LlamaServer

REPO = Path(__file__).resolve().parent.parent
SAMPLE = "sales.csv"
REQUESTS = (
    "Load sales.csv and tell me the total revenue.",
    "How many rows does sales.csv have?",
    "Which region has the highest profit?",
)
FORMAT_FAILURE = "kept answering in a broken format"  # a round failed because its replies could not be read
CUT_OFF = "cut off at the model's output limit"  # the last problem of a request whose replies ran past `max_tokens`
REPLY_TOKENS = 256  # the most a reply may take: a Planner reply needs about 120, a short cell about 150
HOPS = 3  # steps the Planner may delegate per request


@dataclass
class ChatOutcome:
    """What a chat of requests came to: per request, and in all."""

    session_id: str
    config: Config
    rounds: list[Round] = field(default_factory=list)
    repair_turns: int = 0
    seconds: float = 0.0

    @property
    def format_failures(self) -> list[Round]:
        """Requests that failed because the model kept breaking the reply format (not because its replies ran past the output limit)."""
        return [r for r in self.format_and_cut_off if CUT_OFF not in (r.error or "")]

    @property
    def cut_off_failures(self) -> list[Round]:
        """Requests whose repair turns ran out on replies cut off at the output limit: the schema held, the length did not."""
        return [r for r in self.format_and_cut_off if CUT_OFF in (r.error or "")]

    @property
    def format_and_cut_off(self) -> list[Round]:
        """Requests that failed with the repair turns used up, whatever the last problem was."""
        return [r for r in self.rounds if r.state == "failed" and FORMAT_FAILURE in (r.error or "")]

    @property
    def other_failures(self) -> list[Round]:
        """Requests that failed for another reason (a model call, the hop limit...)."""
        return [r for r in self.rounds if r.state == "failed" and FORMAT_FAILURE not in (r.error or "")]

    @property
    def cells(self) -> int:
        """Cells that reached the kernel (ran, whatever they printed or raised)."""
        return sum(1 for r in self.rounds for post in r.posts if post.code is not None and post.execution is not None)


def sample_project(root: Path, server: LlamaServer, *, structured: str, planner_examples: bool = True, settings: dict[str, Any] | None = None) -> Path:
    """The bundled project under `root`, its model the one `server` serves; `planner_examples=False` leaves out the Planner's few-shot transcript."""
    project = root / "project"
    shutil.copytree(REPO / "project", project, ignore=shutil.ignore_patterns("sessions", "*.db*", ".chat_history"))
    if not planner_examples:
        shutil.rmtree(project / "examples" / "planner")
    config: dict[str, Any] = {
        "llm": {
            "api_base": server.api_base,
            "model": server.model.stem,
            "context_window": server.slot_context,
            "reply_reserve": REPLY_TOKENS,
            "structured": structured,
            "timeout": 600,
        },
        "session": {"max_internal_hops": HOPS},
        "code_interpreter": {"max_retry_count": 1},
        "execution": {"timeout": 60},
    }
    for section, values in (settings or {}).items():
        config.setdefault(section, {}).update(values)
    (project / "taskweaver_config.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
    return project


def run_chat(project: Path, requests: tuple[str, ...] = REQUESTS) -> ChatOutcome:
    """The sample data loaded, then `requests` asked in one session; what came of each."""
    config = load_config(project)
    started = time.perf_counter()
    repairs: list[str] = []

    def count_repairs(event: Event) -> None:
        if isinstance(event, Working) and event.activity == "repairing":
            repairs.append(event.detail)

    with open_session(config) as session:
        outcome = ChatOutcome(session.id, config)
        session.add_listener(count_repairs)
        session.load_file(project / "sample_data" / SAMPLE)
        for text in requests:
            outcome.rounds.append(session.ask(text))
    outcome.repair_turns = len(repairs)
    outcome.seconds = time.perf_counter() - started
    return outcome
