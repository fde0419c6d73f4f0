"""Containment, third ring: what a cell of bob's can still try once it is in its sandbox, on `taskweaver-lite gateway` and with local kernels.

Each attack here broke an earlier version: reopening a descriptor the kernel inherited to read the
gateway's log, renaming the kernel's process so the disk limit could not find it, filling the disk
with empty files. Each runs from bob's cell on a real gateway started by the command, and on a
local sandboxed kernel, and must find nothing.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import requests
import yaml
from helpers import make_project
from mcp.shared.exceptions import MCPError
from test_gateway_sandbox import Cells, gateway_project

from taskweaver_lite.config.file import load_config
from taskweaver_lite.config.settings import ExecutionConfig, KernelGatewayConfig
from taskweaver_lite.kernel.executor import KernelExecutor
from taskweaver_lite.kernel.gateway.remote import GatewayExecutor
from taskweaver_lite.kernel.sandbox import cgroup
from taskweaver_lite.kernel.sandbox.bwrap import bwrap_path
from taskweaver_lite.mcp.resources import read_resource, resource_uri
from taskweaver_lite.testing.kernel_gateway import Gateway, free_port, sandbox_gateway
from taskweaver_lite.testing.web_server import WebServer

pytestmark = [pytest.mark.kernel, pytest.mark.skipif(bwrap_path() is None, reason="bubblewrap is not installed")]

DISK_LIMIT = 50 * 1024**2
DISK_FILES = 10_000

# Every descriptor the kernel holds: what it points to, its identity, and the first bytes reopening it gives.
FDS = """
import json, os, stat
LIMIT = {limit}
found = []
for name in sorted(os.listdir('/proc/self/fd'), key=int):
    path = f'/proc/self/fd/{{name}}'
    try:
        target, info = os.readlink(path), os.stat(path)
    except OSError:
        continue
    data = b''
    if stat.S_ISREG(info.st_mode) or stat.S_ISFIFO(info.st_mode) or stat.S_ISCHR(info.st_mode):
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
            try:
                data = os.pread(fd, 1 << 20, 0) if stat.S_ISREG(info.st_mode) else os.read(fd, 1 << 16)
            finally:
                os.close(fd)
        except OSError:
            pass
    found.append([int(name), target, info.st_dev, info.st_ino, info.st_mode, info.st_rdev, data[:LIMIT].decode(errors='replace')])
# The lifeline (the reading end of a pipe whose writing end only the program that started the kernel
# holds) is the one descriptor of the program's a kernel keeps: which one, and whether it reopens for writing.
lifeline = getattr(__import__('sys').modules.get('_taskweaver_lifeline'), 'watched', None)
try:
    os.close(os.open(f'/proc/self/fd/{{lifeline}}', os.O_WRONLY | os.O_NONBLOCK))
    writable = lifeline is not None
except OSError:
    writable = False
open('fds.json', 'w').write(json.dumps(found))
open('lifeline.json', 'w').write(json.dumps({{'fd': lifeline, 'writable': writable}}))
print(len(found))
"""


def _identities(pid: int) -> set[tuple[int, int]]:
    """(device, inode) of every descriptor `pid` holds, /dev/null aside (anyone may hold that)."""
    null = os.stat("/dev/null").st_rdev
    found = set()
    for entry in Path(f"/proc/{pid}/fd").iterdir():
        try:
            info = entry.stat()
        except OSError:
            continue
        if (stat.S_ISCHR(info.st_mode) and info.st_rdev == null) or os.readlink(entry).startswith("anon_inode:"):
            continue  # every eventfd and epoll shares one anonymous inode
        found.add((info.st_dev, info.st_ino))
    return found


def _shared(kernel_fds: list[list[object]], holder: int, *, own: tuple[Path, ...] = (), lifeline: object = None) -> list[list[object]]:
    """The kernel's descriptors that are also `holder`'s (the gateway, this program), but for files of the kernel's own and its lifeline."""
    theirs = _identities(holder)
    null = os.stat("/dev/null").st_rdev
    mine = {(os.stat(path).st_dev, os.stat(path).st_ino) for path in own if path.exists()}
    shared = []
    for fd, target, dev, ino, mode, rdev, _ in kernel_fds:
        assert isinstance(mode, int) and isinstance(dev, int) and isinstance(ino, int)
        if (stat.S_ISCHR(mode) and rdev == null) or str(target).startswith("anon_inode:"):
            continue
        if fd == lifeline and stat.S_ISFIFO(mode):
            continue
        if (dev, ino) in theirs and (dev, ino) not in mine:
            shared.append([fd, target])
    return shared


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    project = gateway_project(tmp_path_factory.mktemp("contain") / "project")
    config = yaml.safe_load((project / "taskweaver_config.yaml").read_text(encoding="utf-8"))
    config["execution"]["disk_limit_files"] = DISK_FILES
    (project / "taskweaver_config.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
    with sandbox_gateway(project) as running:
        yield running


@pytest.fixture(scope="module")
def alice(gateway: Gateway) -> Iterator[Cells]:
    cells = Cells(gateway, session="alice-s", owner="alice")
    cells.run("import sys\nprint('alice-stderr-line', file=sys.stderr)")
    yield cells
    cells.close()


@pytest.fixture(scope="module")
def bob(gateway: Gateway, alice: Cells) -> Iterator[Cells]:
    cells = Cells(gateway, session="bob-s", owner="bob")
    yield cells
    cells.close()


@pytest.fixture
def local(tmp_path: Path) -> Iterator[KernelExecutor]:
    config = ExecutionConfig.model_validate({"sandbox": "bubblewrap", "disk_limit": DISK_LIMIT, "disk_limit_files": DISK_FILES, "timeout": 120})
    executor = KernelExecutor(tmp_path / "bob-local", config=config)
    yield executor
    executor.shutdown()


def test_a_gateway_kernel_holds_no_descriptor_of_the_gateways(gateway: Gateway, alice: Cells, bob: Cells) -> None:
    bob.run(FDS.format(limit=1 << 20))
    kernel_fds = json.loads((gateway.root / "taskweaver_sessions" / "bob-s" / "fds.json").read_text(encoding="utf-8"))
    lifeline = json.loads((gateway.root / "taskweaver_sessions" / "bob-s" / "lifeline.json").read_text(encoding="utf-8"))
    shared = _shared(kernel_fds, gateway.pid, own=(gateway.root / "logs" / "bob-s.log",), lifeline=lifeline["fd"])
    assert shared == [], "reopened through /proc/self/fd, these are the gateway's own files"
    # Every kernel of the gateway holds the same lifeline: written to, it would be a channel between them.
    assert lifeline["fd"] is not None and not lifeline["writable"], "bob's kernel reopened its lifeline for writing"
    seen = "\n".join(str(entry[6]) for entry in kernel_fds)
    assert alice.kernel_id not in seen and "alice-stderr-line" not in seen, "the gateway's log, read from bob's cell"
    assert {entry[0] for entry in kernel_fds} >= {0, 1, 2}
    stdin = next(entry for entry in kernel_fds if entry[0] == 0)
    assert stdin[1] == "/dev/null", "stdin is /dev/null"


def test_a_gateway_kernels_stderr_goes_to_its_own_log(gateway: Gateway, bob: Cells) -> None:
    bob.run("import os\nos.write(2, b'bob-wrote-this-on-stderr\\n')")
    log = gateway.root / "logs" / "bob-s.log"
    deadline = time.monotonic() + 10
    while b"bob-wrote-this-on-stderr" not in (log.read_bytes() if log.exists() else b""):
        assert time.monotonic() < deadline, f"{log} never got the kernel's stderr"
        time.sleep(0.1)
    assert b"bob-wrote-this-on-stderr" not in (gateway.root / "gateway.log").read_bytes(), "nothing of a kernel's in the gateway's own log"
    assert stat.S_IMODE(log.stat().st_mode) == 0o600


def test_a_local_kernel_holds_no_descriptor_of_this_programs(local: KernelExecutor) -> None:
    result = local.run(FDS.format(limit=0))
    assert result.success, result.error
    kernel_fds = json.loads((local.cwd / "fds.json").read_text(encoding="utf-8"))
    lifeline = json.loads((local.cwd / "lifeline.json").read_text(encoding="utf-8"))
    assert lifeline["fd"] is not None, "the kernel watches its lifeline"
    assert _shared(kernel_fds, os.getpid(), own=(local.session_dir / "kernel.log",), lifeline=lifeline["fd"]) == []
    stdin = next(entry for entry in kernel_fds if entry[0] == 0)
    assert stdin[1] == "/dev/null", "stdin is /dev/null"


def test_a_gateway_without_a_token_on_loopback_says_so_and_lists_no_kernel(tmp_path: Path) -> None:
    project = gateway_project(tmp_path / "project")
    port = free_port()
    env = {name: value for name, value in os.environ.items() if name != "KG_AUTH_TOKEN"}
    env["KG_LIST_KERNELS"] = "True"  # the gateway's own default must not bring listing back
    log = tmp_path / "gateway.log"
    with log.open("wb") as out:
        command = [sys.executable, "-m", "taskweaver_lite", "gateway", "-p", str(project), "--port", str(port)]
        process = subprocess.Popen(command, stdout=out, stderr=out, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert process.poll() is None and time.monotonic() < deadline, log.read_text(encoding="utf-8")
            try:
                if requests.get(f"{url}/api", timeout=1).ok:
                    break
            except requests.RequestException:
                time.sleep(0.2)
        started = requests.post(f"{url}/api/kernels", json={"env": {"KERNEL_TASKWEAVER_SESSION": "alice-s", "KERNEL_USERNAME": "alice"}}, timeout=60)
        started.raise_for_status()
        kernel_id = started.json()["id"]
        for route in ("/api/kernels", "/api/sessions"):
            listing = requests.get(url + route, timeout=30)
            assert listing.status_code == 403 and kernel_id not in listing.text, f"{route}: {listing.status_code} {listing.text[:300]}"
        requests.delete(f"{url}/api/kernels/{kernel_id}", timeout=60)
    finally:
        process.terminate()
        process.wait(30)
    said = [line for line in log.read_text(encoding="utf-8").splitlines() if "KG_AUTH_TOKEN" in line]
    assert len(said) == 1 and "every account on this machine" in said[0], said


# The kernel takes bubblewrap's name, then leaves a child of the same name writing 10 MB files, 40 of them, five a second.
WRITER = (
    "import time\nopen('/proc/self/comm', 'w').write('bwrap')\n"
    "for i in range(40):\n    open(f'fill{i}.bin', 'wb').write(bytes(10485760))\n    time.sleep(0.2)\n"
)
RENAMED_WRITER = (
    "import subprocess, sys\n"
    "open('/proc/self/comm', 'w').write('bwrap')\n"
    f"writer = subprocess.Popen([sys.executable, '-c', {WRITER!r}])\n"
    "print(open('/proc/self/comm').read().strip())\n"
)


def _on_disk(folder: Path) -> int:
    return sum(path.stat().st_size for path in folder.rglob("fill*.bin") if path.is_file())


def _after_the_writer(folder: Path) -> int:
    """What the writer left once it has ended: stopped by the disk limit, or on its own (40 files, 8 s) where the limit missed it."""
    deadline = time.monotonic() + 60
    while _writer_runs():
        assert time.monotonic() < deadline, "the writer still runs a minute after it began"
        time.sleep(0.1)
    return _on_disk(folder)


def _writer_runs() -> bool:
    """Whether a process runs WRITER (its command line says so, whatever it calls itself; an ended one left unreaped has none)."""
    import psutil

    return any(WRITER in (process.info["cmdline"] or ()) for process in psutil.process_iter(["cmdline"]))


def test_renaming_the_kernel_does_not_hide_it_from_the_disk_limit_on_the_gateway(gateway: Gateway) -> None:
    cells = Cells(gateway, session="bob-disk", owner="bob")
    try:
        assert cells.run(RENAMED_WRITER).strip() == "bwrap"
        kept = _after_the_writer(gateway.root / "taskweaver_sessions" / "bob-disk")
    finally:
        cells.close()
    assert kept < 3 * DISK_LIMIT, f"{kept / 1024**2:.0f} MB kept under a {DISK_LIMIT // 1024**2} MB limit"


def test_renaming_the_kernel_does_not_hide_it_from_the_disk_limit_on_this_machine(local: KernelExecutor) -> None:
    result = local.run(RENAMED_WRITER)
    assert result.stdout.strip() == "bwrap", result
    kept = _after_the_writer(local.cwd)
    assert kept < 3 * DISK_LIMIT, f"{kept / 1024**2:.0f} MB kept under a {DISK_LIMIT // 1024**2} MB limit"
    assert "still here" in local.run("print('still here')").stdout, "and the session goes on"


def test_an_mcp_resource_read_never_returns_what_a_racing_link_points_at(tmp_path: Path) -> None:
    secret = tmp_path / "taskweaver_config.yaml"
    secret.write_text("llm:\n  api_key: sk-never-shown\n", encoding="utf-8")
    session = tmp_path / "sessions" / "bob-s"
    executor = KernelExecutor(session, config=ExecutionConfig(sandbox="none", timeout=120))
    # Swapped by renames, so that the name always exists: a file one moment, a link to the config the next.
    swap = (
        "import os, threading\nopen('data.txt', 'w').write('plain data')\n"
        "def swap():\n"
        "    while True:\n"
        f"        try:\n            os.symlink({str(secret)!r}, '.l')\n            os.rename('.l', 'data.txt')\n"
        "            open('.f', 'w').write('plain data')\n            os.rename('.f', 'data.txt')\n"
        "        except OSError:\n            pass\n"
        "threading.Thread(target=swap, daemon=True).start()\nprint('swapping')"
    )
    try:
        assert executor.run(swap).stdout == "swapping\n"
        uri = resource_uri("bob-s", "files", "data.txt")
        leaked = served = 0
        unexplained: list[str] = []
        for _ in range(20000):
            try:
                contents = read_resource(uri, {}, stored=lambda session_id: session if session_id == "bob-s" else None).contents[0]
            except MCPError:
                continue
            except OSError as exc:  # reaches the MCP host as it is, this machine's paths in it
                unexplained.append(str(exc))
                continue
            text = getattr(contents, "text", "")
            served += text == "plain data"
            leaked += "sk-never-shown" in text
    finally:
        executor.shutdown()
    assert leaked == 0, f"{leaked} of 20000 reads returned the config"
    assert unexplained == [], f"{len(unexplained)} reads failed with a bare error: {unexplained[:1]}"
    assert served > 0, "the real file must still be read between swaps"


# Four worker processes of 900 MB each, at once: 3.6 GB from one kernel.
FOUR_WORKERS = (
    "import subprocess, sys\n"
    "worker = 'import time\\nheld = b\"x\" * (900 * 2**20)\\ntime.sleep(4)'\n"
    "workers = [subprocess.Popen([sys.executable, '-c', worker]) for _ in range(4)]\n"
    "print('exit codes', [w.wait() for w in workers])\n"
)


def _cgroups_here() -> bool:
    return cgroup.probe(cgroup.Caps(memory=1 << 30)) is None


@pytest.mark.skipif(not _cgroups_here(), reason="no cgroup can be made on this machine (needs root or a delegated cgroup v2)")
@pytest.mark.parametrize("sandbox", ["bubblewrap", "none"])
def test_four_workers_of_900_mb_under_a_1gb_memory_limit_end_in_a_clean_error_and_the_session_goes_on(tmp_path: Path, sandbox: str) -> None:
    config = ExecutionConfig.model_validate({"sandbox": sandbox, "memory_limit": "1GB", "timeout": 120})
    executor = KernelExecutor(tmp_path / "bob-memory", config=config)
    try:
        assert executor.run("kept = 42").success
        result = executor.run(FOUR_WORKERS)
        assert not result.success and "execution.memory_limit (1.0 GB)" in result.limit_reached, result
        assert "-9" in result.stdout, "the largest workers were ended"
        assert not result.kernel_died, "the kernel itself is not the one ended"
        after = executor.run("print(kept)")
        assert after.success and after.stdout == "42\n", "and the session goes on with its variables"
    finally:
        executor.shutdown()


@pytest.mark.skipif(not _cgroups_here(), reason="no cgroup can be made on this machine (needs root or a delegated cgroup v2)")
def test_four_workers_of_900_mb_on_the_gateway_are_held_to_its_memory_limit_in_total(gateway: Gateway, bob: Cells) -> None:
    said = bob.run(FOUR_WORKERS, timeout=120)  # the gateway's project: 2 GB, all of a kernel's processes together
    codes = said.rsplit("exit codes", 1)[-1]
    assert "-9" in codes, said
    assert bob.run("print(6 * 7)").strip() == "42", "the kernel itself goes on"


# 200,000 empty files: no bytes to speak of, every one an inode (paced a little, as real work would be).
EMPTY_FILES = (
    "import os, time\nos.makedirs('many', exist_ok=True)\nmade = 0\n"
    "for i in range(200_000):\n    open(f'many/{i}', 'w').close()\n    made += 1\n    if i % 2000 == 0:\n        time.sleep(0.02)\n"
    "print('made', made)\n"
)


def _files_in(folder: Path) -> int:
    return len(os.listdir(folder / "many")) if (folder / "many").is_dir() else 0


def test_two_hundred_thousand_empty_files_are_stopped_by_the_files_cap_on_this_machine(local: KernelExecutor) -> None:
    result = local.run(EMPTY_FILES)
    kept = _files_in(local.cwd)
    assert not result.success and "execution.disk_limit_files" in result.limit_reached, result
    # What is made between two looks stays (the watcher looks less often the more there is to count): far from the 200,000.
    assert kept < 10 * DISK_FILES, f"{kept:,} files kept under a cap of {DISK_FILES:,}"
    local.run("import shutil\nshutil.rmtree('many')")
    assert "still here" in local.run("print('still here')").stdout, "and the session goes on"


def test_two_hundred_thousand_empty_files_are_stopped_by_the_files_cap_on_the_gateway(gateway: Gateway) -> None:
    cells = Cells(gateway, session="bob-files", owner="bob")
    try:
        # The kernel is ended under the cell, so the cell never says it finished: wait until no file has been
        # made for 2 s (or the gateway has seen the kernel go), not for a timeout. A kernel left to finish
        # stops too, at 200,000 files.
        folder = gateway.root / "taskweaver_sessions" / "bob-files"
        cells.kernel.execute(EMPTY_FILES, user_expressions={})
        deadline = time.monotonic() + 60
        kept, changed = 0, time.monotonic()
        while time.monotonic() < deadline and cells.kernel.state() in ("busy", "idle", ""):
            time.sleep(0.25)
            if (now := _files_in(folder)) != kept:
                kept, changed = now, time.monotonic()
            elif kept and time.monotonic() - changed > 2:
                break
        time.sleep(0.5)
        kept = _files_in(folder)
    finally:
        cells.close()
    # What is made between two looks stays (the watcher looks less often the more there is to count): far from the 200,000.
    assert kept < 10 * DISK_FILES, f"{kept:,} files kept under a cap of {DISK_FILES:,}"


# Twenty PNGs of 2 MB in one cell (random bytes behind a PNG signature: nothing compresses them).
MANY_IMAGES = (
    "import base64, os\nfrom IPython.display import display\n"
    "for i in range(20):\n"
    "    png = base64.b64encode(b'\\x89PNG\\r\\n\\x1a\\n' + os.urandom(2 * 2**20)).decode()\n"
    "    display({'image/png': png}, raw=True)\n"
    "print('shown')\n"
)
DISPLAY_CAPS = {"display_per_cell": "8MB", "display_per_session": "12MB"}


def _kept_images(executor: KernelExecutor | GatewayExecutor) -> int:
    return sum(path.stat().st_size for path in executor.artifacts_dir.iterdir() if path.is_file())


def _flood_twice(executor: KernelExecutor | GatewayExecutor) -> None:
    first = executor.run(MANY_IMAGES)
    assert first.stdout == "shown\n", first
    assert _kept_images(executor) <= 8 * 2**20, "no more than execution.display_per_cell from one cell"
    said = [line for line in first.notices if "execution.display_per_cell" in line]
    assert len(said) == 1 and "not kept" in said[0], first.notices
    second = executor.run(MANY_IMAGES)
    assert _kept_images(executor) <= 12 * 2**20, "no more than execution.display_per_session in all"
    said = [line for line in second.notices if "execution.display_per_session" in line]
    assert len(said) == 1, second.notices


def test_display_data_is_capped_per_cell_and_per_session_on_this_machine(tmp_path: Path) -> None:
    config = ExecutionConfig.model_validate({"sandbox": "bubblewrap", "timeout": 120, **DISPLAY_CAPS})
    executor = KernelExecutor(tmp_path / "bob-images", config=config)
    try:
        _flood_twice(executor)
    finally:
        executor.shutdown()


def test_display_data_is_capped_per_cell_and_per_session_on_the_gateway(gateway: Gateway, tmp_path: Path) -> None:
    config = ExecutionConfig.model_validate({"timeout": 120, **DISPLAY_CAPS})
    executor = GatewayExecutor(tmp_path / "bob-images", config=config, gateway=KernelGatewayConfig(url=gateway.url, token=gateway.token, connect_timeout=60))
    try:
        _flood_twice(executor)
    finally:
        executor.shutdown()


def test_a_sessions_record_names_none_of_the_servers_folders(tmp_path: Path) -> None:
    project = make_project(tmp_path, "http://127.0.0.1:9")
    config = load_config(project)
    with WebServer(config) as web, httpx.Client(base_url=web.url, timeout=60) as client:
        session_id = client.post("/api/sessions", json={}).json()["id"]
        shown = client.get(f"/api/sessions/{session_id}").text
    assert str(config.sessions_dir) not in shown and str(project) not in shown and str(tmp_path) not in shown, shown
