"""`%%ask` in the analyst's own kernel: a real notebook run by nbclient against the scripted model.

The analyst's cell makes `df`; `%%ask` sums a column of it into a new name; the next plain cell
prints that name; the stop button interrupts a step and the session answers the next request; a
restarted kernel's `%ask_history` lists the earlier rounds. `--insert` and confirm mode are driven
over jupyter_client to read the execute reply's `set_next_input` payload.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nbclient
import nbformat
import pytest
from helpers import make_project
from jupyter_client.manager import KernelManager
from nbclient.util import run_sync
from nbformat import NotebookNode

from taskweaver_lite.kernel.executor import close_thread_loop
from taskweaver_lite.testing.scripted_server import Reply, ScriptedServer, code_reply, planner_reply

pytestmark = pytest.mark.kernel

ANALYST_CELL = "%load_ext taskweaver_lite\nimport pandas as pd\ndf = pd.DataFrame({'region': ['north', 'south', 'east'], 'units': [12, 30, 18]})"
SUM_CODE = "total_units = int(df['units'].sum())\nprint(f'total units: {total_units}')"
SLOW_CODE = "import pathlib, time\npathlib.Path('step-started').write_text('yes')\ntime.sleep(60)\nnever_made = 1"
AFTER_CODE = "doubled = total_units * 2\nprint(doubled)"


@pytest.fixture
def folders(tmp_path: Path, server: ScriptedServer) -> tuple[Path, dict[str, str]]:
    """The notebook's folder, and the kernel's environment: the project named by TASKWEAVER_LITE_PROJECT, the notebook's path."""
    project = make_project(tmp_path, server.url)
    work = tmp_path / "analysis"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPENAI_")}
    env.update(TASKWEAVER_LITE_PROJECT=str(project), JPY_SESSION_NAME=str(work / "sales.ipynb"))
    return work, env


def outputs_text(cell: NotebookNode) -> str:
    """Everything a cell shows as text: streams, plain-text bundles, error lines."""
    parts: list[str] = []
    for output in cell.outputs:
        if output.output_type == "stream":
            parts.append(output.text)
        elif output.output_type in ("display_data", "execute_result"):
            parts.append(str(output.data.get("text/plain", "")))
        elif output.output_type == "error":
            parts.append(f"{output.ename}: {output.evalue}\n" + "\n".join(output.traceback))
    return "\n".join(parts)


def markdown_of(cell: NotebookNode) -> list[str]:
    return [str(o.data["text/markdown"]) for o in cell.outputs if o.output_type == "display_data" and "text/markdown" in o.data]


@pytest.fixture
def running(folders: tuple[Path, dict[str, str]]) -> Iterator[tuple[nbclient.NotebookClient, NotebookNode]]:
    """An nbclient client with its kernel started in the notebook's folder, for cells run one at a time."""
    work, env = folders
    notebook = nbformat.v4.new_notebook()
    client = nbclient.NotebookClient(notebook, timeout=90, resources={"metadata": {"path": str(work)}})
    with client.setup_kernel(env=env):
        yield client, notebook


def run_cell(client: nbclient.NotebookClient, notebook: NotebookNode, source: str, *, raises: bool = False) -> NotebookNode:
    cell = nbformat.v4.new_code_cell(source)
    if raises:
        cell.metadata["tags"] = ["raises-exception"]
    notebook.cells.append(cell)
    client.execute_cell(cell, len(notebook.cells) - 1)
    return cell


def interrupt_when(client: nbclient.NotebookClient, marker: Path) -> threading.Thread:
    """Press the stop button (the kernel interrupt) once the step's code has started."""

    def press() -> None:
        deadline = time.monotonic() + 60
        while not marker.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.3)  # well inside time.sleep(60)
        manager: Any = client.km  # nbclient's is an AsyncKernelManager: its interrupt on a loop of this thread's own, closed after
        asyncio.run(manager.interrupt_kernel())

    thread = threading.Thread(target=press, daemon=True)
    thread.start()
    return thread


def test_ask_uses_the_analysts_dataframe_keeps_its_result_survives_the_stop_button_and_a_restart(
    running: tuple[nbclient.NotebookClient, NotebookNode], folders: tuple[Path, dict[str, str]], server: ScriptedServer
) -> None:
    client, notebook = running
    work, _ = folders
    run_cell(client, notebook, ANALYST_CELL)

    server.enqueue("planner", planner_reply("Sum the units column of df and keep the total as total_units."))
    server.enqueue("code_generator", code_reply("total_units = int(df['unit'].sum())"), code_reply(SUM_CODE))
    server.enqueue("planner", planner_reply("The units add up to **60**; `total_units` holds it.", send_to="User"))
    asked = run_cell(client, notebook, "%%ask\nWhat do the units in df add up to? Keep the total as total_units.")
    shown = outputs_text(asked)
    assert "KeyError" in shown and not [o for o in asked.outputs if o.output_type == "error"], "a fixed attempt's error shows, as no error output"
    assert "No sandbox here" in shown, "the first request says in one line that nothing is sandboxed"
    assert "Sum the units column of df" in shown, "the step's instruction shows in the cell"
    assert SUM_CODE in shown, "the step's code shows in the cell"
    assert "total units: 60" in shown, "the code's own output shows in the cell"
    assert "The units add up to **60**; `total_units` holds it." in markdown_of(asked), "the answer is Markdown"
    step_prompt = next(r for r in server.requests if r.role == "code_generator")
    prompt = "\n".join(str(m["content"]) for m in step_prompt.messages)
    assert "df" in prompt and "pandas.DataFrame" in prompt and "units int64" in prompt, "the analyst's df is in the variables the prompt carries"

    printed = run_cell(client, notebook, "print(total_units)")
    assert outputs_text(printed).strip() == "60", "the name the step made stays for the analyst's next cell"

    server.enqueue("planner", planner_reply("Wait for a minute, then make never_made."))
    server.enqueue("code_generator", code_reply(SLOW_CODE))
    presser = interrupt_when(client, work / "step-started")
    stopped = run_cell(client, notebook, "%%ask\nTake your time with this one.", raises=True)
    presser.join(10)
    assert "KeyboardInterrupt: the request was stopped. The session goes on" in outputs_text(stopped)
    assert outputs_text(run_cell(client, notebook, "print('never_made' in dir())")).strip() == "False", "the step stopped midway"

    server.enqueue("planner", planner_reply("Double total_units as doubled."))
    server.enqueue("code_generator", code_reply(AFTER_CODE))
    server.enqueue("planner", planner_reply("Doubled, that is 120.", send_to="User"))
    again = run_cell(client, notebook, "%ask double the total")
    assert "120" in outputs_text(again) and "Doubled, that is 120." in markdown_of(again), "the session answers after the stop"

    manager: Any = client.km  # nbclient's async manager and client
    kernel_client: Any = client.kc
    run_sync(manager.restart_kernel)(now=False)
    run_sync(kernel_client.wait_for_ready)(timeout=60)
    history = run_cell(client, notebook, "%load_ext taskweaver_lite\n%ask_history")
    listed = outputs_text(history)
    assert "3 requests" in listed
    assert "1. What do the units in df add up to? Keep the total as total_units. -> The units add up to **60**" in listed
    assert "2. Take your time with this one. -> failed: Cancelled by the user." in listed
    assert "3. double the total -> Doubled, that is 120." in listed

    run_cell(client, notebook, ANALYST_CELL)  # the analyst brings df back, as after any restart
    server.enqueue("planner", planner_reply("You asked three things; the total was 60.", send_to="User"))
    resumed = run_cell(client, notebook, "%ask what did I ask so far?")
    assert "3 earlier requests" in outputs_text(resumed), "the restarted kernel's first request goes on with the stored session"
    summary_prompt = "\n".join(str(m["content"]) for m in server.requests[-1].messages)
    assert "What do the units in df add up to?" in summary_prompt, "the earlier rounds are in the Planner's prompt again"
    replayed = run_cell(client, notebook, "print('total_units' in dir())")
    assert outputs_text(replayed).strip() == "False", "variables are the notebook's business: no earlier cell is replayed into the kernel"


@pytest.fixture
def kernel(folders: tuple[Path, dict[str, str]]) -> Iterator[Any]:
    """A kernel over jupyter_client, to read the execute reply's payloads (nbclient drops them)."""
    work, env = folders
    manager = KernelManager()
    manager.start_kernel(env=env, cwd=str(work))
    client = manager.blocking_client()
    client.start_channels()
    try:
        client.wait_for_ready(timeout=60)
        yield client
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)


def execute(client: Any, code: str, *, shown: list[dict[str, Any]] | None = None) -> tuple[dict[str, Any], str]:
    """Run `code`; its execute reply's content and what it printed (its displays and results go to `shown`)."""
    printed: list[str] = []

    def hook(msg: dict[str, Any]) -> None:
        if msg["msg_type"] == "stream":
            printed.append(msg["content"]["text"])
        elif shown is not None and msg["msg_type"] in ("display_data", "execute_result"):
            shown.append({"type": msg["msg_type"], **msg["content"]})

    reply = client.execute_interactive(code, timeout=90, output_hook=hook)
    return reply["content"], "".join(printed)


def test_tables_show_as_tables_and_plots_inline_and_the_plot_is_kept(kernel: Any, server: ScriptedServer) -> None:
    execute(kernel, ANALYST_CELL)
    server.enqueue("planner", planner_reply("Plot units by region, then show df."))
    server.enqueue("code_generator", code_reply("import matplotlib.pyplot as plt\nplt.bar(df['region'], df['units'])\nplt.show()\ndf"))
    server.enqueue("planner", planner_reply("Plotted.", send_to="User"))
    shown: list[dict[str, Any]] = []
    execute(kernel, "%ask plot the units", shown=shown)
    assert any(item["type"] == "display_data" and "image/png" in item["data"] for item in shown), "the plot shows inline"
    [table] = [item for item in shown if item["type"] == "execute_result"]
    assert "<table" in table["data"]["text/html"], "the frame shows as the notebook's own HTML table"
    report = str(server.requests[-1].messages[-1]["content"])
    assert "Artifacts saved:" in report and "cell-0001-1.png" in report, "the plot is kept as an artifact and the Planner hears of it"
    assert "north" in report, "the table's text is in what the Planner reads"


def next_input(reply: dict[str, Any]) -> str:
    [payload] = [p for p in reply.get("payload", []) if p.get("source") == "set_next_input"]
    return str(payload["text"])


def test_insert_puts_the_code_below_and_confirm_mode_hands_it_over_unrun(kernel: Any, server: ScriptedServer) -> None:
    execute(kernel, ANALYST_CELL)
    server.enqueue("planner", planner_reply("Sum the units of df as total_units."))
    server.enqueue("code_generator", code_reply(SUM_CODE))
    server.enqueue("planner", planner_reply("60 units.", send_to="User"))
    reply, printed = execute(kernel, "%%ask --insert\nsum the units")
    assert "total units: 60" in printed, "with --insert the code runs too"
    assert next_input(reply) == f"# %%ask: sum the units\n{SUM_CODE}"

    server.enqueue("planner", planner_reply("Double total_units as doubled."))
    server.enqueue("code_generator", code_reply(AFTER_CODE))
    server.enqueue("planner", planner_reply("The code is in the cell below: run it to get doubled.", send_to="User"))
    reply, printed = execute(kernel, "%%ask --set execution.confirm=true\ndouble it")
    assert next_input(reply) == f"# %%ask: double it\n{AFTER_CODE}"
    assert "120" not in printed and server.remaining("code_generator") == 0, "handed over once: not run, not revised"
    _, defined = execute(kernel, "print('doubled' in dir())")
    assert defined.strip() == "False", "confirm mode's code did not run"
    told = str(server.requests[-1].messages[-1]["content"])
    assert "new cell of the user's notebook" in told, "the Planner hears where the code went"


def test_a_bad_option_and_an_unreachable_model_are_one_line_each(kernel: Any, server: ScriptedServer) -> None:
    execute(kernel, "%load_ext taskweaver_lite")
    reply, _ = execute(kernel, "%%ask --sett x=1\nhello")
    assert reply["status"] == "error" and reply["traceback"] == [
        "taskweaver-lite: unknown option '--sett': the options are --set KEY=VALUE and --insert. "
        "Usage: %%ask [--set KEY=VALUE]... [--insert], then the request on the lines below (or %ask [options] the request, on one line)"
    ]
    reply, _ = execute(kernel, "%ask --set llm.api_base=http://127.0.0.1:9/v1 --set llm.max_retries=0 hello")
    [line] = reply["traceback"]
    assert line.startswith("taskweaver-lite: ") and "127.0.0.1:9" in line, line


def test_a_step_past_its_timeout_is_stopped_and_the_stop_button_stops_a_model_call(kernel: Any, server: ScriptedServer) -> None:
    execute(kernel, "%load_ext taskweaver_lite")
    server.enqueue("planner", planner_reply("Sleep, then set slept."))
    server.enqueue("code_generator", code_reply("import time\ntime.sleep(30)\nslept = True"))
    server.enqueue("planner", planner_reply("That ran too long and was stopped.", send_to="User"))
    started = time.monotonic()
    reply, _ = execute(kernel, "%ask --set execution.timeout=1 sleep a while")
    assert reply["status"] == "ok" and time.monotonic() - started < 20, "the step was interrupted at its timeout"
    assert "The cell timed out after 1 s and was interrupted" in str(server.requests[-1].messages[-1]["content"])
    assert execute(kernel, "print('slept' in dir())")[1].strip() == "False"

    asked = len(server.requests)
    server.enqueue("planner", Reply(content=planner_reply("Too late.", send_to="User"), delay=30))

    def press() -> None:
        deadline = time.monotonic() + 30
        while len(server.requests) == asked and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.3)
        kernel.parent.interrupt_kernel()  # the stop button, while the Planner's reply is on its way
        close_thread_loop()  # the loop jupyter_client's blocking call opened for this thread

    presser = threading.Thread(target=press, daemon=True)
    presser.start()
    started = time.monotonic()
    reply, _ = execute(kernel, "%ask what is slow?")
    presser.join(10)
    assert reply["status"] == "error" and time.monotonic() - started < 20
    assert reply["traceback"][0].startswith("KeyboardInterrupt: the request was stopped. The session goes on")
    server.enqueue("planner", planner_reply("Still here.", send_to="User"))
    reply, _ = execute(kernel, "%ask are you there?")
    assert reply["status"] == "ok"
    shown: list[dict[str, Any]] = []
    execute(kernel, "%ask_history", shown=shown)
    listed = "".join(str(item["data"].get("text/plain", "")) for item in shown)
    assert "1. sleep a while -> That ran too long and was stopped." in listed
    assert "2. what is slow? -> failed: Cancelled by the user." in listed and "3. are you there? -> Still here." in listed

    shown.clear()
    execute(kernel, "%ask_reset", shown=shown)
    said = "".join(str(item["data"].get("text/plain", "")) for item in shown)
    assert "The next request starts a new session for this notebook. The earlier one, `" in said and "stays stored" in said
    shown.clear()
    execute(kernel, "%ask_history", shown=shown)
    assert "No requests yet" in str(shown[-1]["data"]["text/plain"]), "a reset notebook's history starts empty"
    server.enqueue("planner", planner_reply("Fresh start.", send_to="User"))
    assert execute(kernel, "%ask hello again")[0]["status"] == "ok"
    shown.clear()
    execute(kernel, "%ask_history", shown=shown)
    assert "1 request." in str(shown[-1]["data"]["text/plain"]), "the new session has the one request"


@pytest.mark.cli  # a fresh interpreter
def test_loading_the_extension_imports_nothing_heavy() -> None:
    probe = (
        "import sys\nfrom IPython.core.interactiveshell import InteractiveShell\n"
        "InteractiveShell.instance().run_line_magic('load_ext', 'taskweaver_lite')\n"
        "print(sorted({m.partition('.')[0] for m in sys.modules} & {'openai', 'pydantic', 'jupyter_client', 'rich', 'pandas', 'httpx'}))"
    )
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.strip()
    assert loaded == "[]", "%load_ext is instant: the agent's modules are imported by the first request"


def test_code_verification_applies_in_the_notebooks_kernel(kernel: Any, server: ScriptedServer, folders: tuple[Path, dict[str, str]]) -> None:
    work, _ = folders
    execute(kernel, ANALYST_CELL)
    server.enqueue("planner", planner_reply("Sum the units of df as total_units."))
    server.enqueue("code_generator", code_reply("import subprocess\nsubprocess.run(['touch', 'pwned'])"), code_reply(SUM_CODE))
    server.enqueue("planner", planner_reply("60 units.", send_to="User"))
    shown: list[dict[str, Any]] = []
    _, printed = execute(kernel, "%%ask --set code_interpreter.code_verification_on=true\nsum the units", shown=shown)
    notes = "".join(str(item["data"].get("text/plain", "")) for item in shown)
    assert "Not run:** it breaks the verification rules." in notes and "subprocess" in notes, "the refusal shows with its rule"
    assert not (work / "pwned").exists(), "the refused cell did not run"
    assert "total units: 60" in printed, "the revised cell ran"
