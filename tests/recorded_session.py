"""A real two-round session (scripted server, real kernel, background folds) recorded into its store.

Round 1 writes numbers.csv and prints; round 2 fails once (NameError), is revised, reads the file
back and draws a plot (an image artifact). Both roles fold round 1 in the background.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from helpers import make_project

from taskweaver_lite.config.file import load_config
from taskweaver_lite.records.conversation import Round
from taskweaver_lite.records.model_calls import Usage
from taskweaver_lite.session.assembly import open_session
from taskweaver_lite.testing.scripted_server import ScriptedServer, code_reply, planner_reply, summary_reply

FIRST_REQUEST = "Make a small table of the numbers 1 to 3 and save it as numbers.csv"
SECOND_REQUEST = "Plot the saved numbers"
FIRST_ANSWER = "Done: numbers.csv holds 3 rows."
SECOND_ANSWER = "Here is the plot of the numbers."
WRITE_CODE = "import pandas as pd\ndf = pd.DataFrame({'x': [1, 2, 3]})\ndf.to_csv('numbers.csv', index=False)\nprint('rows:', len(df))"
BROKEN_CODE = "print(dff)"
PLOT_CODE = "import matplotlib.pyplot as plt\ndf = pd.read_csv('numbers.csv')\nplt.plot(df['x'])\nplt.show()\ndf"


@dataclass(frozen=True)
class RecordedSession:
    """What the live session held when it closed, to compare the store against."""

    store_path: Path
    session_id: str
    working_dir: Path
    rounds: list[dict[str, Any]]  # Round.to_dict() of each round
    usage: Usage
    states: dict[str, dict[str, Any]]  # role -> CompressionState.to_dict()


def record_session(root: Path) -> RecordedSession:
    """Run the session against a scripted server with a StoreRecorder attached; return what it held."""
    with ScriptedServer() as server:
        project = make_project(root, server.url, round_compressor={"rounds_to_compress": 1, "rounds_to_retain": 1})
        config = load_config(project)
        saved = summary_reply("They saved 1-3 to numbers.csv.", variables=[{"name": "df", "type": "DataFrame", "description": "x = 1..3"}])
        server.set_default("compression", saved)
        server.enqueue(
            "planner",
            planner_reply("Save the numbers 1-3 to numbers.csv"),
            planner_reply(FIRST_ANSWER, send_to="User"),
            planner_reply("Plot numbers.csv"),
            planner_reply(SECOND_ANSWER, send_to="User"),
        )
        server.enqueue("code_generator", code_reply(WRITE_CODE), code_reply(BROKEN_CODE), code_reply(PLOT_CODE))
        # The session records itself (Session.open attaches a StoreRecorder to the project's store).
        with open_session(config) as session:
            contexts = {c.role: c for c in session.contexts().values()}
            rounds: list[Round] = [session.ask(FIRST_REQUEST), session.ask(SECOND_REQUEST)]
            for context in contexts.values():
                assert context.wait_idle(20), "the background fold did not finish"
            return RecordedSession(
                store_path=config.store_path,
                session_id=session.id,
                working_dir=session.working_dir,
                rounds=[r.to_dict() for r in rounds],
                usage=session.usage(),
                states={role: c.state.to_dict() for role, c in contexts.items()},
            )
