"""`%%ask` in a notebook's kernel against `Session.ask` for the same warm turn, side by side in one kernel.

One ipykernel (started with jupyter_client, as JupyterLab starts it) holds both: the notebook's own
session, asked with `%%ask` cells, and a `Session` opened from the same project in that kernel, asked
with `session.ask(...)` cells (its code runs in its own kernel, as the library's always does). Every
turn is the same: the Planner hands a step to the CodeInterpreter, the code `x = 1` runs, the Planner
answers; the scripted model answers at once. The time of a turn is the cell's, as the notebook sees
it: from the execute request to the reply, the cell's display messages included. The two kinds of
cell alternate, after warm-up turns of each; the medians are compared.

    python bench/notebook_bench.py [--turns 40] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml
from jupyter_client.manager import KernelManager

from taskweaver_lite.testing.scripted_server import ScriptedServer, code_reply, last_user_text, planner_reply, summary_reply

WARM_UP = 5


def planner(messages: list[dict[str, Any]]) -> str:
    """Hand the step over, or answer once the CodeInterpreter has reported."""
    if last_user_text(messages).startswith("CodeInterpreter:"):
        return planner_reply("x is 1.", send_to="User")
    return planner_reply("Set x to 1.")


def execute(client: Any, code: str) -> float:
    """Run one cell; its wall time as the notebook sees it (request to reply). A failing cell stops the bench."""
    started = time.perf_counter()
    reply = client.execute_interactive(code, timeout=120, output_hook=lambda msg: None)
    elapsed = time.perf_counter() - started
    if reply["content"]["status"] != "ok":
        sys.exit(f"the cell failed: {code!r}: {reply['content'].get('traceback')}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=40, help="turns of each kind per round")
    parser.add_argument("--rounds", type=int, default=3, help="rounds, each with its own medians")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, ScriptedServer() as server:
        server.set_default("planner", planner)
        server.set_default("code_generator", code_reply("x = 1"))
        server.set_default("compression", summary_reply("Earlier turns set x to 1.", []))
        project, work = Path(tmp) / "project", Path(tmp) / "work"
        project.mkdir()
        work.mkdir()
        settings = {"llm": {"api_base": server.url, "api_key": "bench", "model": "scripted", "stream": False}}
        (project / "taskweaver_config.yaml").write_text(yaml.safe_dump(settings), encoding="utf-8")
        env = {k: v for k, v in os.environ.items() if not k.startswith("OPENAI_")}
        env.update(TASKWEAVER_LITE_PROJECT=str(project), JPY_SESSION_NAME=str(work / "bench.ipynb"))
        manager = KernelManager()
        manager.start_kernel(env=env, cwd=str(work))
        client = manager.blocking_client()
        client.start_channels()
        try:
            client.wait_for_ready(timeout=60)
            execute(client, f"%load_ext taskweaver_lite\nfrom taskweaver_lite import Workspace\nworkspace = Workspace.load({str(project)!r})\n"
                    "session = workspace.new_session()")  # fmt: skip
            cells = {"%%ask": "%%ask\nset x", "Session.ask": "session.ask('set x');"}
            for code in cells.values():
                for _ in range(WARM_UP):
                    execute(client, code)
            print(f"{args.rounds} rounds of {args.turns} turns of each kind, alternating; median per round")
            print(f"{'round':>5}  {'%%ask':>10}  {'Session.ask':>12}  {'ratio':>6}")
            ratios = []
            for number in range(1, args.rounds + 1):
                times: dict[str, list[float]] = {name: [] for name in cells}
                for _ in range(args.turns):
                    for name, code in cells.items():
                        times[name].append(execute(client, code))
                ask, library = (statistics.median(times[name]) * 1000 for name in cells)
                ratios.append(ask / library)
                print(f"{number:>5}  {ask:>8.1f} ms  {library:>9.1f} ms  {ask / library:>5.2f}x")
            print(f"%%ask / Session.ask: median {statistics.median(ratios):.2f}x (range {min(ratios):.2f}-{max(ratios):.2f}x; target at most 1.10x)")
            execute(client, "session.close(); workspace.close()")
        finally:
            client.stop_channels()
            manager.shutdown_kernel(now=True)


if __name__ == "__main__":
    main()
