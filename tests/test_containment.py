"""Containment against model-written code: each attack that once got through, as a test.

Real kernels (in bubblewrap where installed), the real store and web server, the scripted model.
The identity cases (one project reaching another, one session starving the rest) need the program
to run as root, as on a server or a CI machine; elsewhere they are skipped with the reason.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import sqlite3
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml
from helpers import cli_env, make_project

from taskweaver_lite.cli.init import init_project
from taskweaver_lite.config.file import load_config
from taskweaver_lite.config.settings import ExecutionConfig
from taskweaver_lite.errors import ConfigError
from taskweaver_lite.kernel.executor import KernelExecutor
from taskweaver_lite.kernel.output import CellOutput
from taskweaver_lite.kernel.sandbox.bwrap import bwrap_path
from taskweaver_lite.kernel.sandbox.identity import in_range
from taskweaver_lite.plugins.catalog import discover
from taskweaver_lite.records.events import Event, PostAdded
from taskweaver_lite.safety.workfiles import copy_folder, read_below
from taskweaver_lite.session.assembly import open_session, reset_session
from taskweaver_lite.session.export import write_export
from taskweaver_lite.store.database import SessionStore
from taskweaver_lite.testing.scripted_server import Reply, ScriptedServer, code_reply, planner_reply
from taskweaver_lite.testing.web_server import WebServer

pytestmark = pytest.mark.kernel

needs_bwrap = pytest.mark.skipif(bwrap_path() is None, reason="bubblewrap (bwrap) is not installed: apt-get install bubblewrap")
as_root = pytest.mark.skipif(
    os.geteuid() != 0 or bwrap_path() is None,
    reason="kernels get uids of their own only when the program runs as root with bubblewrap (as CI does)",
)
SECRET = "s3cr3t-api-key-of-project-a"
SANDBOXED = ExecutionConfig(sandbox="bubblewrap", max_processes=40, memory_limit="1GB", timeout=60)


@pytest.fixture
def shared() -> Iterator[Path]:
    """A folder of projects like /srv/projects: passable by anyone, and outside /tmp (the sandbox's /tmp is private)."""
    folder = Path(tempfile.mkdtemp(dir="/var/tmp", prefix="twl-shared-"))
    folder.chmod(0o755)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def scripted() -> Iterator[ScriptedServer]:
    with ScriptedServer() as server:
        yield server


def _project(root: Path, url: str, **sections: dict[str, object]) -> Path:
    project = make_project(root, url, **sections)
    (project / "taskweaver_config.yaml").chmod(0o600)
    return project


def _ran(executor: KernelExecutor, code: str) -> str:
    result = executor.run(code)
    assert result.success, f"{code!r} failed: {result.error}"
    return result.stdout.strip()


# 1. Cross-project takeover -------------------------------------------------------------------


@as_root
def test_code_in_one_project_cannot_read_anothers_config_or_store_nor_connect_to_its_kernel(shared: Path) -> None:
    a, b = init_project(shared / "a"), init_project(shared / "b")
    (a / "taskweaver_config.yaml").write_text(f"llm:\n  api_key: {SECRET}\n")
    SessionStore(a / "sessions.db").close()
    (shared / "public.txt").write_text("anyone may read this")
    with KernelExecutor(a / "sessions" / "s-a", config=SANDBOXED, hidden=(a,)) as victim:
        victim.wait_ready()
        sockets = [str(p) for p in (a / "sessions" / "s-a" / "kernel").glob("kernel-*")]
        assert sockets, "the victim's kernel should listen on IPC sockets in its session folder"
        targets = {"config": str(a / "taskweaver_config.yaml"), "store": str(a / "sessions.db"), "public": str(shared / "public.txt")}
        probe = (
            "import json, socket\nseen = {}\n"
            f"for name, path in {targets!r}.items():\n"
            "    try:\n        seen[name] = open(path).read()\n    except OSError as exc:\n        seen[name] = type(exc).__name__\n"
            f"for path in {sockets!r}:\n"
            "    s = socket.socket(socket.AF_UNIX)\n"
            "    try:\n        s.connect(path)\n        seen[path] = 'connected'\n    except OSError as exc:\n        seen[path] = type(exc).__name__\n"
            "    s.close()\n"
            "print(json.dumps(seen))"
        )
        with KernelExecutor(b / "sessions" / "s-b", config=SANDBOXED, hidden=(b,)) as attacker:
            seen = json.loads(_ran(attacker, probe))
            uids = {victim.sandbox.run_as, attacker.sandbox.run_as} if victim.sandbox and attacker.sandbox else set()
    assert seen["public"] == "anyone may read this", "the probe must be able to read what anyone may"
    assert SECRET not in json.dumps(seen), "project B's code read project A's config"
    assert seen["store"] in ("PermissionError", "FileNotFoundError"), f"project B's code read A's store: {seen['store']!r}"
    assert not [path for path in sockets if seen[path] == "connected"], "project B's code connected to A's kernel"
    assert len(uids) == 2 and all(uid is not None and in_range(uid) for uid in uids), f"each session's kernel needs a uid of its own: {uids}"


def test_the_files_the_program_writes_are_owner_only(tmp_path: Path, scripted: ScriptedServer) -> None:
    project = init_project(tmp_path / "fresh")
    assert stat.S_IMODE(project.stat().st_mode) == 0o700
    assert stat.S_IMODE((project / "taskweaver_config.yaml").stat().st_mode) == 0o600
    used = make_project(tmp_path, scripted.url)
    scripted.enqueue("planner", planner_reply("Done.", send_to="User"))
    with open_session(load_config(used)) as session:
        session.ask("hello")
        store = load_config(used).store_path
        private = [store, Path(f"{store}-wal"), Path(f"{store}-shm"), *(session.executor._socket_dir.glob("*.json"))]  # type: ignore[attr-defined]
        modes = {str(path): stat.S_IMODE(path.stat().st_mode) for path in private if path.exists()}
        folders = {str(p): stat.S_IMODE(p.stat().st_mode) for p in (used / "sessions", used / "sessions" / session.id, session.working_dir)}
    assert len(modes) >= 3, f"expected the store, its -wal and the connection file: {modes}"
    assert all(mode == 0o600 for mode in modes.values()), f"readable by others: {modes}"
    assert all(mode == 0o700 for mode in folders.values()), f"session folders open to others: {folders}"


# 7. One session starves the rest ---------------------------------------------------------------


@as_root
def test_one_sessions_processes_do_not_starve_another_sessions_kernel(shared: Path) -> None:
    # The hog keeps every process slot its cap allows taken: whatever frees up is taken again.
    hog = (
        "import threading, time\n"
        "def fill():\n    while True:\n        try:\n            threading.Thread(target=time.sleep, args=(300,), daemon=True).start()\n"
        "        except RuntimeError:\n            time.sleep(0.01)\n"
        "threading.Thread(target=fill, daemon=True).start()\ntime.sleep(2)\nprint(threading.active_count())"
    )
    # The bystander starts first: under a shared uid, its cap would be the lower one, and the hog would use it up.
    with KernelExecutor(shared / "p2" / "sessions" / "s2", config=SANDBOXED, hidden=(shared / "p2",)) as bystander:
        bystander.wait_ready()
        with KernelExecutor(shared / "p1" / "sessions" / "s1", config=SANDBOXED, hidden=(shared / "p1",)) as hogger:
            held = int(_ran(hogger, hog))
            assert held <= SANDBOXED.max_processes, "the hog's own cap should have stopped it"
            spawn = "import subprocess, threading\nt = threading.Thread(target=print)\nt.start()\nt.join()\nprint(subprocess.run(['true']).returncode)"
            after = bystander.run(spawn)
    assert after.success and after.stdout.strip().endswith("0"), f"another session's kernel was starved: {after.error}"


# 2. /load and upload through a planted link --------------------------------------------------


@pytest.fixture
def executor(tmp_path: Path) -> Iterator[KernelExecutor]:
    with KernelExecutor(tmp_path / "project" / "sessions" / "s1", config=ExecutionConfig(timeout=60), hidden=(tmp_path / "project",)) as running:
        running.wait_ready()
        yield running


def test_load_replaces_a_link_the_kernel_planted_instead_of_writing_through_it(executor: KernelExecutor, tmp_path: Path) -> None:
    victim = tmp_path / "notes.txt"
    victim.write_text("my own notes")
    _ran(executor, f"import os\nos.symlink({str(victim)!r}, 'data.csv')")
    source = tmp_path / "upload" / "data.csv"
    source.parent.mkdir()
    source.write_text("a,b\n1,2\n")
    assert executor.upload(source) == "data.csv"
    assert victim.read_text() == "my own notes", "the upload wrote through the kernel's link"
    landed = executor.working_dir / "data.csv"
    assert not landed.is_symlink() and landed.read_text() == "a,b\n1,2\n"


def test_the_upload_route_replaces_a_planted_link_too(tmp_path: Path, scripted: ScriptedServer) -> None:
    victim = tmp_path / "notes.txt"
    victim.write_text("my own notes")
    project = make_project(tmp_path, scripted.url)
    scripted.enqueue("planner", planner_reply("Plant it."), planner_reply("Done.", send_to="User"))
    scripted.enqueue("code_generator", code_reply(f"import os\nos.symlink({str(victim)!r}, 'x.csv')\nprint('planted')"))
    with WebServer(load_config(project)) as web, httpx.Client(base_url=web.url, timeout=60) as client:
        session_id = client.post("/api/sessions", json={}).json()["id"]
        with client.stream("POST", f"/api/sessions/{session_id}/messages", json={"text": "plant"}) as response:
            list(response.iter_lines())
        reply = client.post(f"/api/sessions/{session_id}/files", files={"file": ("x.csv", b"a\n1\n")})
    assert reply.status_code == 200, reply.text
    assert victim.read_text() == "my own notes", "POST /files wrote through the kernel's link"


# 3. /reset follows links -----------------------------------------------------------------------


def test_reset_copies_no_link_and_reports_them(tmp_path: Path, scripted: ScriptedServer) -> None:
    home_file = tmp_path / "home-notes.txt"
    home_file.write_text("private home file")
    project = _project(tmp_path, scripted.url)
    config = load_config(project)
    plant = (
        "import os\n"
        f"os.symlink({str(project / 'taskweaver_config.yaml')!r}, 'config.yaml')\n"
        f"os.symlink({str(config.store_path)!r}, 'store.db')\n"
        f"os.symlink({str(home_file)!r}, 'notes.txt')\n"
        "os.mkdir('loop')\nos.symlink('..', 'loop/up')\nos.symlink('.', 'loop/here')\n"
        "open('kept.csv', 'w').write('a\\n1\\n')\nos.mkdir('sub')\nopen('sub/inner.txt', 'w').write('inner')\nos.mkfifo('pipe')\n"
        "print('planted')"
    )
    with open_session(config) as session:
        assert session.executor.run(plant).success
        fresh = reset_session(session)
    with fresh:
        files = {str(p.relative_to(fresh.working_dir)): p for p in fresh.working_dir.rglob("*")}
        report = fresh.reset_report
        assert report is not None
        assert not [name for name, path in files.items() if path.is_symlink()], "a link was copied"
        texts = [path.read_bytes() for path in files.values() if path.is_file() and not path.is_symlink()]
    assert sorted(files) == ["kept.csv", "loop", "sub", "sub/inner.txt"], f"copied: {sorted(files)}"
    assert not any(b"api_key" in text or b"private home file" in text or b"SQLite" in text for text in texts)
    assert sorted(report.links) == ["config.yaml", "loop/here", "loop/up", "notes.txt", "store.db"]
    assert any("pipe" in line for line in report.skipped), report.skipped
    assert any("symbolic links" in line for line in report.notices())


def test_a_folder_copy_is_bounded_by_count_and_size(tmp_path: Path) -> None:
    source, target = tmp_path / "source", tmp_path / "target"
    source.mkdir()
    target.mkdir()
    for n in range(30):
        (source / f"f{n:02d}.txt").write_text("x" * 100)
    counted = copy_folder(source, target, max_entries=10)
    assert counted.copied == 10 and counted.skipped and "more than" in counted.skipped[0]
    again = tmp_path / "again"
    again.mkdir()
    sized = copy_folder(source, again, max_bytes=450)
    assert sized.copied == 4 and sized.copied_bytes == 400 and len(sized.skipped) == 26


# 4. Exports embed what links point at; serving checks one file and opens another -------------------


PLOT = "import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.show()\nprint('plotted')"


def test_an_export_does_not_embed_what_a_swapped_artifact_links_to(tmp_path: Path, scripted: ScriptedServer) -> None:
    project = _project(tmp_path, scripted.url)
    scripted.enqueue("planner", planner_reply("Plot."), planner_reply("Plotted.", send_to="User"))
    scripted.enqueue("code_generator", code_reply(PLOT))
    config = load_config(project)
    with open_session(config) as session:
        rnd = session.ask("plot it")
        artifact = Path(next(post.execution for post in rnd.posts if post.execution is not None).artifacts[0])
        session_id = session.id
    artifact.unlink()
    artifact.symlink_to(project / "taskweaver_config.yaml")
    written = write_export(config, session_id, fmt="ipynb", target=tmp_path / "out.ipynb")
    notebook = written.read_text()
    secret = (project / "taskweaver_config.yaml").read_bytes()
    assert base64.b64encode(secret).decode() not in notebook and "test-key" not in notebook, "the export embedded the config"
    assert "not embedded" in notebook


def test_serving_an_artifact_never_returns_what_a_racing_link_points_at(tmp_path: Path, scripted: ScriptedServer) -> None:
    project = _project(tmp_path, scripted.url)
    config_path = project / "taskweaver_config.yaml"
    swap = (
        "import os, threading\nopen('plot.png', 'wb').write(b'\\x89PNG fake image')\n"
        "def swap():\n"
        "    while True:\n"
        f"        try:\n            os.remove('plot.png')\n            os.symlink({str(config_path)!r}, 'plot.png')\n"
        "            os.remove('plot.png')\n            open('plot.png', 'wb').write(b'\\x89PNG fake image')\n"
        "        except OSError:\n            pass\n"
        "threading.Thread(target=swap, daemon=True).start()\nprint('swapping')"
    )
    scripted.enqueue("planner", planner_reply("Swap."), planner_reply("Swapping.", send_to="User"))
    scripted.enqueue("code_generator", code_reply(swap))
    leaked = served = 0
    with WebServer(load_config(project)) as web, httpx.Client(base_url=web.url, timeout=60) as client:
        session_id = client.post("/api/sessions", json={}).json()["id"]
        with client.stream("POST", f"/api/sessions/{session_id}/messages", json={"text": "swap"}) as response:
            list(response.iter_lines())
        for _ in range(400):
            reply = client.get(f"/api/sessions/{session_id}/artifacts/plot.png")
            served += reply.status_code == 200
            leaked += b"api_key" in reply.content or b"test-key" in reply.content
    assert leaked == 0, f"{leaked} of 400 fetches returned the config"
    assert served > 0, "the real file must still be served between swaps"


# 6. Answers shown before they are stored -------------------------------------------------------


def test_an_answer_is_in_the_store_before_any_listener_sees_it(tmp_path: Path, scripted: ScriptedServer) -> None:
    project = make_project(tmp_path, scripted.url)
    config = load_config(project)
    scripted.enqueue("planner", planner_reply("The answer is 42.", send_to="User"))
    stored_when_shown: list[bool] = []

    def screen(event: Event) -> None:
        if isinstance(event, PostAdded) and event.post.is_answer:
            reader = SessionStore(config.store_path, read_only=True)
            try:
                stored_when_shown.append(any(r.answer == "The answer is 42." for r in reader.load(event_session).rounds))
            finally:
                reader.close()

    with open_session(config) as session:
        event_session = session.id
        session.add_listener(screen, first=True)
        session.ask("what is it?")
    assert stored_when_shown == [True], "the answer was shown before it was stored"


def test_while_another_writer_holds_the_store_the_page_gets_no_answer_it_has_not_stored(tmp_path: Path, scripted: ScriptedServer) -> None:
    project = make_project(tmp_path, scripted.url)
    config = load_config(project)
    gate = threading.Event()
    scripted.enqueue("planner", Reply(content=planner_reply("Stored first.", send_to="User"), gate=gate))
    arrived: list[str] = []
    answered = threading.Event()

    def read(client: httpx.Client, session_id: str) -> None:
        with client.stream("POST", f"/api/sessions/{session_id}/messages", json={"text": "go"}) as response:
            for line in response.iter_lines():
                if line.startswith("data: "):
                    arrived.append(json.loads(line[6:])["type"])
                    if arrived[-1] == "answer":
                        answered.set()

    with WebServer(config) as web, httpx.Client(base_url=web.url, timeout=60) as client:
        session_id = client.post("/api/sessions", json={}).json()["id"]
        reader = threading.Thread(target=read, args=(client, session_id), daemon=True)
        reader.start()
        wait_for_request(scripted)  # the request's first events are stored; the model's reply waits at the gate
        blocker = sqlite3.connect(config.store_path, timeout=30)
        blocker.execute("BEGIN IMMEDIATE")  # another writer holds the store's lock
        gate.set()
        shown_while_locked = answered.wait(3)
        blocker.rollback()
        blocker.close()
        reader.join(60)
    assert not shown_while_locked, "the page got an answer the store could not hold yet"
    assert "answer" in arrived, f"the answer must come once the store is free: {arrived}"
    stored = SessionStore(config.store_path, read_only=True)
    try:
        assert [r.answer for r in stored.load(session_id).rounds] == ["Stored first."]
    finally:
        stored.close()


def wait_for_request(scripted: ScriptedServer, *, within: float = 30.0) -> None:
    """Wait until the model server has received a request; fail, saying so, after `within` seconds."""
    deadline = time.monotonic() + within
    while not scripted.requests:
        assert time.monotonic() < deadline, f"no request reached the model within {within:.0f} s: the turn never started"
        time.sleep(0.05)


def test_the_chat_shows_an_answer_only_once_stored_so_a_kill_loses_no_shown_answer(tmp_path: Path, scripted: ScriptedServer) -> None:
    project = make_project(tmp_path, scripted.url)
    store_path = load_config(project).store_path
    gate = threading.Event()
    scripted.enqueue("planner", Reply(content=planner_reply("Answer number 0.", send_to="User"), gate=gate))
    shown: list[str] = []
    command = [sys.executable, "-m", "taskweaver_lite", "chat", "-p", str(project)]
    with subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=cli_env()) as proc:
        assert proc.stdin is not None and proc.stdout is not None
        out = proc.stdout
        proc.stdin.write(b"question 0\n")
        proc.stdin.flush()
        reader = threading.Thread(target=lambda: shown.append(out.readline().decode()), daemon=True)
        reader.start()
        wait_for_request(scripted)  # the request is stored; the model's reply waits at the gate
        blocker = sqlite3.connect(store_path, timeout=30)
        blocker.execute("BEGIN IMMEDIATE")  # another writer holds the store's lock
        gate.set()
        reader.join(3)
        shown_while_locked = "".join(shown)
        blocker.rollback()  # the store is free: the answer may be stored, then shown
        blocker.close()
        reader.join(30)
        proc.kill()  # SIGKILL, with whatever is on the screen by now
        proc.wait()
    printed = "".join(shown).strip()
    assert not shown_while_locked, f"the chat printed {shown_while_locked!r} while the store could not hold it"
    assert printed == "Answer number 0.", f"the answer was not printed within 30 s of the store being free: {printed!r}"
    stored = SessionStore(store_path, read_only=True)
    try:
        answers = [r.answer for entry in stored.list_sessions() for r in stored.load(entry.id).rounds]
    finally:
        stored.close()
    assert printed in answers, f"the chat printed {printed!r}, which the store never got"


# 8. Odd display data -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "said"),
    [
        ({"image/png": "not base64 at all!!", "text/plain": "<Figure>"}, "not valid base64"),
        ({"image/png": 12345, "text/plain": "<Figure>"}, "int where base64 text belongs"),
        ({"image/png": base64.b64encode(b"hello, not a png").decode()}, "not a PNG image"),
        ({"image/svg+xml": 3.5}, "float where text belongs"),
        ({"text/plain": 7}, None),
    ],
)
def test_odd_display_data_becomes_one_line_and_the_cell_goes_on(tmp_path: Path, data: dict[str, object], said: str | None) -> None:
    output = CellOutput(max_tokens=500, transcript_path=tmp_path / "cell.txt", artifacts_dir=tmp_path, stem="cell-0001")
    output.add("display_data", {"data": data})
    output.add("display_data", {"data": ["not", "a", "mapping"]})
    output.add("stream", {"name": "stdout", "text": "still here"})
    result = output.finish("display(x)")
    assert "still here" in result.stdout
    assert any("could not be read" in notice and "mapping" in notice for notice in result.notices)
    if said is not None:
        assert any(said in notice for notice in result.notices), result.notices
        assert not result.artifacts


def test_a_repr_png_returning_text_does_not_end_the_session(executor: KernelExecutor) -> None:
    code = "class Odd:\n    def _repr_png_(self):\n        return 'not an image'\ndisplay(Odd())\nprint('after')"
    result = executor.run(code)
    assert "after" in result.stdout and not result.artifacts
    assert any("image/png" in notice for notice in result.notices), result.notices
    assert _ran(executor, "print(1 + 1)") == "2", "the kernel must go on"


def test_a_replaced_variable_snapshot_does_not_break_the_session(executor: KernelExecutor) -> None:
    _ran(executor, "import sys\nsys.modules['_taskweaver_snapshot'].snapshot = lambda *a, **k: [[1, 2], 'x', None]\ny = 5")
    assert executor.run("z = 6").success


# 9. Bad input ------------------------------------------------------------------------------------


def test_a_non_utf8_line_on_stdin_is_named_and_skipped(tmp_path: Path, scripted: ScriptedServer) -> None:
    project = make_project(tmp_path, scripted.url)
    scripted.enqueue("planner", planner_reply("Fine.", send_to="User"))
    done = subprocess.run(
        [sys.executable, "-m", "taskweaver_lite", "chat", "-p", str(project)],
        input=b"\xff\xfe caf\xe9\nhello\n",
        capture_output=True,
        timeout=120,
        env=cli_env(),
    )
    err = done.stderr.decode()
    assert done.returncode == 0 and "Traceback" not in err, err
    assert "stdin: line 1 is not utf-8 text" in err.lower()
    assert done.stdout.decode().strip() == "Fine.", "the good line must still be answered"


def _bomb_level(i: int) -> str:
    """`c: &c [*b, *b, ...]`: nine references to the level before; eight levels expand to 9**9 values."""
    name, previous = chr(98 + i), chr(97 + i)
    return f"{name}: &{name} [{', '.join([f'*{previous}'] * 9)}]\n"


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("llm: " + "[" * 10_000 + "]" * 10_000 + "\n", "nested more than"),
        ("a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(_bomb_level(i) for i in range(8)), "expand"),
        ("llm:\n  model: x\n" + "#" * 5_000_000 + "\n", "more than"),
    ],
    ids=["deep", "alias bomb", "huge"],
)
def test_pathological_yaml_gets_one_line_naming_the_file(tmp_path: Path, text: str, said: str) -> None:
    (tmp_path / "taskweaver_config.yaml").write_text(text)
    with pytest.raises(ConfigError) as caught:
        load_config(tmp_path)
    message = str(caught.value)
    assert message.startswith(str(tmp_path / "taskweaver_config.yaml")) and said in message and "\n" not in message


def test_a_pathological_plugin_file_is_left_out_with_one_line(tmp_path: Path) -> None:
    (tmp_path / "plugins").mkdir()
    (tmp_path / "plugins" / "deep.yaml").write_text("name: deep\ndescription: " + "[" * 10_000 + "]" * 10_000 + "\n")
    (tmp_path / "plugins" / "deep.py").write_text("x = 1\n")
    entries = discover(tmp_path).entries
    assert [entry.state for entry in entries] == ["broken"] and "nested more than" in entries[0].error, entries


def test_an_ordinary_config_with_an_alias_still_loads(tmp_path: Path) -> None:
    (tmp_path / "taskweaver_config.yaml").write_text(yaml.safe_dump({"llm": {"model": "m"}}) + "planner: {llm: &l {model: p}}\ncode_generator: {llm: *l}\n")
    assert load_config(tmp_path).llm_for("code_generator").model == "p"


def test_reading_a_planted_pipe_is_refused_rather_than_hanging(executor: KernelExecutor) -> None:
    _ran(executor, "import os\nos.mkfifo('plot.png')")
    outcome: list[BaseException] = []

    def read() -> None:
        try:
            read_below(executor.working_dir, "plot.png")
        except OSError as exc:
            outcome.append(exc)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(30)
    assert not reader.is_alive(), "opening a pipe the kernel planted blocked the server"
    assert outcome and "not a regular file" in str(outcome[0])
