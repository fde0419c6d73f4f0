"""`serve` replicas as real processes, for the team tests and bench: a project on one store and gateway, a scripted model that runs code.

    write_team_project(folder, store_url=url, gateway=gateway, model_url=server.url)
    with ServeProcess.start(folder) as first, ServeProcess.start(folder) as second:
        ...                       # first.url, second.url; first.kill() is kill -9, first.terminate() SIGTERM

The model (`run_code_model`): a request `RUN<<code>>` has the Planner delegate that code and then
answer with what the CodeInterpreter reported (its output); any other request is answered at once.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from types import TracebackType
from typing import Any

import httpx
import yaml

from taskweaver_lite.testing.kernel_gateway import Gateway
from taskweaver_lite.testing.scripted_server import Reply, ScriptedServer, code_reply, last_user_text, planner_reply, summary_reply
from taskweaver_lite.testing.server_start import free_port, wait_until_answering

_CODE = re.compile(r"RUN<<(.*?)>>", re.DOTALL)


def run_code_model(server: ScriptedServer, *, delay: float = 0.0) -> None:
    """Script `server`: RUN<<code>> requests run their code and are answered with its report; others at once; folds summarise."""

    def planner(messages: list[dict[str, Any]]) -> Reply:
        last = str(messages[-1]["content"])
        asked = _CODE.search(last)
        if asked is not None and "CodeInterpreter" not in last.split("\n", 1)[0]:
            return Reply(content=planner_reply(f"RUN<<{asked[1]}>>"), delay=delay)
        return Reply(content=planner_reply(f"Done. {last[-400:]}", send_to="User"), delay=delay)

    def code_generator(messages: list[dict[str, Any]]) -> Reply:
        asked = _CODE.search(last_user_text(messages))
        return Reply(content=code_reply(asked[1] if asked else "print('nothing to run')"), delay=delay)

    server.set_default("planner", planner)
    server.set_default("code_generator", code_generator)
    server.set_default("compression", Reply(content=summary_reply("The user ran code.", []), delay=delay))


def write_team_project(
    folder: Path,
    *,
    store_url: str | None,
    gateway: Gateway | None,
    model_url: str,
    lease_timeout: float = 15.0,
    stream: bool = False,
    single_replica: bool = False,
) -> Path:
    """A project whose config keeps sessions in `store_url` (None: the SQLite file), kernels on `gateway` (None: local), the model at `model_url`."""
    folder.mkdir(parents=True, exist_ok=True)
    config: dict[str, Any] = {
        "llm": {"api_base": model_url, "api_key": "test", "model": "scripted", "stream": stream},
        "store": {"url": store_url} if store_url is not None else {},
        "serve": {"lease_timeout": lease_timeout, "lease_wait": 5, "drain_timeout": 20, "single_replica": single_replica},
        "execution": {"kernel_gateway": {"url": gateway.url, "token": gateway.token}} if gateway is not None else {},
    }
    (folder / "taskweaver_config.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
    return folder


class ServeProcess:
    """One `taskweaver-lite serve` process on a free port of 127.0.0.1; stopped (SIGTERM, then SIGKILL) at the end of its block."""

    def __init__(self, project: Path, *, args: tuple[str, ...] = (), env: dict[str, str] | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = project / f"serve-{self.port}.log"
        self.access_log = project / f"access-{self.port}.log"
        command = [sys.executable, "-m", "taskweaver_lite", "serve", "-p", str(project), "--port", str(self.port), "--log", str(self.access_log), *args]
        environment = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=environment)

    @classmethod
    def start(cls, project: Path, *, args: tuple[str, ...] = (), env: dict[str, str] | None = None) -> ServeProcess:
        """Start one and wait until it answers /healthz (whatever it says)."""
        serve = cls(project, args=args, env=env)
        try:
            serve.wait_until_up()
        except BaseException:
            serve.stop()
            raise
        return serve

    @classmethod
    def start_several(cls, project: Path, count: int, *, args: tuple[str, ...] = (), env: dict[str, str] | None = None) -> list[ServeProcess]:
        """`count` replicas started one after the other; those already up are stopped should a later one fail to start."""
        started: list[ServeProcess] = []
        try:
            for _ in range(count):
                started.append(cls.start(project, args=args, env=env))
        except BaseException:
            for serve in started:
                serve.stop()
            raise
        return started

    def wait_until_up(self) -> None:
        """Until /healthz answers (whatever it says); RuntimeError (with the log) if the process ends or is stuck first."""

        def answers() -> bool:
            with contextlib.suppress(httpx.TransportError):
                httpx.get(self.url + "/healthz", timeout=2)
                return True
            return False

        wait_until_answering(self.process, answers, what="serve", log=self.log_path)

    def log(self) -> str:
        """What the process wrote to stdout and stderr so far."""
        return self.log_path.read_text(encoding="utf-8", errors="replace")

    def kill(self) -> None:
        """kill -9: no goodbye, no lease freed, nothing flushed."""
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(10)

    def terminate(self) -> None:
        """SIGTERM: what a deploy or an orchestrator sends first."""
        self.process.send_signal(signal.SIGTERM)

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 30 s."""
        if self.process.poll() is None:
            self.terminate()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.kill()

    def __enter__(self) -> ServeProcess:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()
