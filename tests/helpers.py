"""Shared helpers for session and CLI tests: a project wired to a scripted server, a CLI runner."""

from __future__ import annotations

import os
import pty
import select
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from taskweaver_lite.kernel.interface import OutputSink
from taskweaver_lite.records.execution import ExecutionResult, KernelEnvironment, Variable
from taskweaver_lite.testing.server_start import wait_until_answering

REPO = Path(__file__).resolve().parent.parent


def make_project(root: Path, server_url: str, **sections: Mapping[str, object]) -> Path:
    """A project folder with the bundled examples and data, pointed at the scripted server."""
    project = root / "project"
    shutil.copytree(REPO / "project", project, ignore=shutil.ignore_patterns("sessions", "*.db*", ".chat_history"))
    config: dict[str, dict[str, Any]] = {
        "llm": {"api_base": server_url, "api_key": "test-key", "model": "scripted", "max_retries": 2, "timeout": 10},
        "execution": {"timeout": 30},
    }
    for name, values in sections.items():
        config.setdefault(name, {}).update(values)
    (project / "taskweaver_config.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
    return project


def cli_env() -> dict[str, str]:
    """The environment for a CLI subprocess: no real keys, no colours, unbuffered."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPENAI_")}
    env.update(PYTHONUNBUFFERED="1", NO_COLOR="1", TERM="dumb")
    return env


@contextmanager
def running_cli(*args: str) -> Iterator[subprocess.Popen[str]]:
    """`python -m taskweaver_lite ARGS` with all three streams piped; killed if still running at the end, pipes closed."""
    command = [sys.executable, "-m", "taskweaver_lite", *args]
    with subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=cli_env()) as proc:
        try:
            yield proc
        finally:
            if proc.poll() is None:
                proc.kill()


def run_cli(*args: str, stdin: str = "", timeout: float = 90, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run `python -m taskweaver_lite ARGS` with piped stdin and captured output (in `cwd`, if given)."""
    return subprocess.run(
        [sys.executable, "-m", "taskweaver_lite", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=cli_env(),
        cwd=cwd,
    )


def watch_stderr(proc: subprocess.Popen[str], marker: str) -> tuple[list[str], threading.Event, threading.Thread]:
    """Read `proc`'s stderr in a thread into a list; the event is set once a line contains `marker`."""
    lines: list[str] = []
    seen = threading.Event()

    def read() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.append(line)
            if marker in line:
                seen.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    return lines, seen, reader


def processes_naming(folder: Path) -> list[str]:
    """The live processes whose command line names `folder` (a sandbox binds its session's folders by path), as `pid: command`."""
    needle = os.fsencode(folder)
    found = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            cmdline = (entry / "cmdline").read_bytes()  # empty for a zombie: dead, only not reaped yet
        except OSError:
            continue
        if needle in cmdline:
            found.append(f"{entry.name}: {cmdline.replace(bytes(1), b' ').decode(errors='replace')[:200]}")
    return found


def outliving(folder: Path, *, seconds: float = 30.0) -> list[str]:
    """The processes naming `folder` still alive after waiting up to `seconds` for them to end (none: [])."""
    deadline = time.monotonic() + seconds
    while (left := processes_naming(folder)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


class Terminal:
    """A pseudo-terminal the program runs on; `read_until` collects what it shows."""

    def __init__(self, args: list[str]) -> None:
        self.master, slave = pty.openpty()
        env = {**cli_env(), "TERM": "xterm", "COLUMNS": "100", "LINES": "40"}
        self.proc = subprocess.Popen(args, stdin=slave, stdout=slave, stderr=slave, env=env, close_fds=True)
        os.close(slave)
        self.shown = ""

    def read_until(self, text: str, seconds: float = 30, *, after: str = "") -> bool:
        """Read until `text` is on screen (after the first `after`, when given)."""
        deadline = time.monotonic() + seconds

        def seen() -> bool:
            start = self.shown.find(after)
            return start >= 0 and text in self.shown[start + len(after) :]

        while not seen() and time.monotonic() < deadline:
            ready, _, _ = select.select([self.master], [], [], 0.05)
            if ready:
                try:
                    self.shown += os.read(self.master, 65536).decode("utf-8", "replace")
                except OSError:
                    break
        return seen()

    def type(self, text: str) -> None:
        os.write(self.master, text.encode())

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)
        os.close(self.master)


class IdleExecutor:
    """The `Executor` protocol with no kernel behind it: these sessions open, resume and close, and run no cell."""

    def __init__(self, session_dir: Path) -> None:
        self.working_dir = session_dir / "cwd"
        self.working_dir.mkdir(parents=True, exist_ok=True)

    def upload(self, source: Path, *, name: str | None = None) -> str:
        return name or source.name

    def artifact(self, name: str) -> Path:
        return self.working_dir / name

    def run(self, code: str, *, timeout: float | None = None, on_output: OutputSink | None = None) -> ExecutionResult:
        return ExecutionResult(code=code, success=True)

    def interrupt(self) -> None:
        pass

    def kept_variables(self) -> bool:
        return False

    def catch_up(self, kernel_id: str | None, *, cells_before: int) -> bool:
        return False

    def start(self) -> None:
        pass

    def still_there(self) -> bool:
        return True

    def known_there(self) -> bool:
        return True

    def variables(self) -> tuple[Variable, ...]:
        return ()

    def environment(self) -> KernelEnvironment:
        return KernelEnvironment()

    def restart(self) -> tuple[str, ...]:
        return ()

    def shutdown(self) -> None:
        pass


OIDC_PROVIDER_MODULE = REPO / "build" / "npm" / "node_modules" / "oidc-provider" / "lib" / "index.js"


@contextmanager
def oidc_provider(*, port: int, redirect_uris: list[str], accounts: dict[str, dict[str, Any]], client_secret: str) -> Iterator[str]:
    """panva's oidc-provider (npm, build/npm) on `port` of 127.0.0.1, with client `taskweaver` and `accounts`: its issuer URL."""
    import json

    import httpx

    config = {"client_id": "taskweaver", "client_secret": client_secret, "redirect_uris": redirect_uris, "accounts": accounts}
    command = ["node", str(REPO / "tests" / "oidc" / "provider.mjs"), str(port), json.dumps(config)]
    env = {**os.environ, "OIDC_PROVIDER_MODULE": str(OIDC_PROVIDER_MODULE)}
    folder = Path(tempfile.mkdtemp(prefix="twl-oidc-"))
    log = folder / "provider.log"
    with log.open("wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env)
    with process:
        issuer = f"http://127.0.0.1:{port}"
        try:

            def answers() -> bool:
                try:
                    return httpx.get(f"{issuer}/.well-known/openid-configuration", timeout=2).status_code == 200
                except httpx.TransportError:
                    return False

            wait_until_answering(process, answers, what="oidc-provider", log=log, pause=0.2)
            yield issuer
        finally:
            process.terminate()
            process.wait(10)
            shutil.rmtree(folder, ignore_errors=True)
