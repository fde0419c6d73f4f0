"""deploy/compose.yaml's services on a first start, run by hand in the order docs/team.md gives, without a container runtime.

Each service's command is compose.yaml's own, with only what a container would provide put in: the
project folders (copies of deploy/project and deploy/gateway-project, their addresses pointed at this
machine), free ports, the secrets' environment. PostgreSQL is a fresh, empty database; nobody has
been added yet. The services must come up and stay up (compose would otherwise restart them in a
loop), refuse requests until the first user is added, then serve that user at once.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from taskweaver_lite.testing.kernel_gateway import free_port
from taskweaver_lite.testing.postgres_cluster import PostgresCluster
from taskweaver_lite.testing.replicas import run_code_model
from taskweaver_lite.testing.scripted_server import ScriptedServer

pytestmark = [pytest.mark.team, pytest.mark.timeout(300)]  # a gateway, two replicas and PostgreSQL started in order on a loaded machine

REPO = Path(__file__).resolve().parent.parent
COMPOSE = yaml.safe_load((REPO / "deploy" / "compose.yaml").read_text(encoding="utf-8"))["services"]
UP_LIMIT = 90.0


def _command(service: str, *, mounts: dict[str, Path], port: int) -> list[str]:
    """compose.yaml's command for `service`, run with this interpreter, its container paths and its port replaced."""
    command = [str(mounts.get(arg, arg)) for arg in COMPOSE[service]["command"]]
    command[command.index("--port") + 1] = str(port)
    assert command[0] == "taskweaver-lite"
    return [sys.executable, "-m", "taskweaver_lite", *command[1:]]


@contextlib.contextmanager
def _started(command: list[str], *, log: Path, env: dict[str, str]) -> Iterator[subprocess.Popen[bytes]]:
    with log.open("wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **env})
    try:
        yield process
    finally:
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _wait_until(url: str, process: subprocess.Popen[bytes], log: Path, *, status: int, headers: dict[str, str] | None = None) -> httpx.Response:
    """Until `url` answers `status`, the process still running all along (its log when it ends)."""
    deadline = time.monotonic() + UP_LIMIT
    while True:
        assert process.poll() is None, f"exited with {process.returncode}: compose would restart it in a loop\n{log.read_text(errors='replace')[-3000:]}"
        with contextlib.suppress(httpx.TransportError):
            answer = httpx.get(url, headers=headers, timeout=5)
            if answer.status_code == status:
                return answer
        assert time.monotonic() < deadline, f"{url} never answered {status}\n{log.read_text(errors='replace')[-3000:]}"
        time.sleep(0.2)


def test_the_compose_services_started_in_the_documented_order_come_up_on_a_first_start(postgres_cluster: PostgresCluster, tmp_path: Path) -> None:
    token = secrets.token_hex(16)
    gateway_port, ports = free_port(), [free_port(), free_port()]
    # The folders compose mounts, as copies: the gateway's root and the replicas' store, gateway and model pointed here.
    gateway_project = tmp_path / "gateway-project"
    shutil.copytree(REPO / "deploy" / "gateway-project", gateway_project)
    settings = yaml.safe_load((gateway_project / "taskweaver_config.yaml").read_text(encoding="utf-8"))
    settings["gateway"]["root"] = str(tmp_path / "gateway-sessions")
    (gateway_project / "taskweaver_config.yaml").write_text(yaml.safe_dump(settings), encoding="utf-8")
    with ScriptedServer() as model:
        run_code_model(model)
        project = tmp_path / "project"
        shutil.copytree(REPO / "deploy" / "project", project)
        settings = yaml.safe_load((project / "taskweaver_config.yaml").read_text(encoding="utf-8"))
        settings["llm"]["api_base"] = model.url
        settings["store"]["url"] = postgres_cluster.new_database()  # 1. PostgreSQL: a fresh database, no users
        settings["execution"]["kernel_gateway"]["url"] = f"http://127.0.0.1:{gateway_port}"
        (project / "taskweaver_config.yaml").write_text(yaml.safe_dump(settings), encoding="utf-8")
        mounts = {"/gateway-project": gateway_project, "/project": project}
        gateway_env = {"KG_AUTH_TOKEN": token}
        replica_env = {"KG_AUTH_TOKEN": token, "OPENAI_API_KEY": "test", "XDG_STATE_HOME": str(tmp_path / "state")}
        with contextlib.ExitStack() as stack:
            # 2. the gateway, 3. the replicas: nobody added yet.
            gateway = stack.enter_context(_started(_command("gateway", mounts=mounts, port=gateway_port), log=tmp_path / "gateway.log", env=gateway_env))
            _wait_until(f"http://127.0.0.1:{gateway_port}/api", gateway, tmp_path / "gateway.log", status=200, headers={"Authorization": f"token {token}"})
            replicas = []
            for n, port in enumerate(ports):
                log = tmp_path / f"replica{n + 1}.log"
                replicas.append((stack.enter_context(_started(_command(f"replica{n + 1}", mounts=mounts, port=port), log=log, env=replica_env)), log))
            for (process, log), port in zip(replicas, ports, strict=True):
                _wait_until(f"http://127.0.0.1:{port}/healthz", process, log, status=200)  # compose's health check: the proxy may start
                refused = httpx.get(f"http://127.0.0.1:{port}/api/sessions", timeout=10)
                assert refused.status_code == 401 and "users add" in refused.json()["error"], refused.text
                assert "users add NAME --admin" in log.read_text(encoding="utf-8"), "said at start, in one line"
            # 4. users, once: from any machine that reaches the store.
            added = subprocess.run(
                [sys.executable, "-m", "taskweaver_lite", "users", "add", "ana", "--admin", "-p", str(project)], capture_output=True, text=True, timeout=60
            )
            assert added.returncode == 0, added.stderr
            headers = {"Authorization": f"Bearer {added.stdout.strip().splitlines()[-1]}"}
            for (process, log), port in zip(replicas, ports, strict=True):
                _wait_until(f"http://127.0.0.1:{port}/api/sessions", process, log, status=200, headers=headers)  # the first user, without a restart
            with httpx.Client(base_url=f"http://127.0.0.1:{ports[0]}", headers=headers, timeout=120) as client:
                session_id = client.post("/api/sessions", json={}).json()["id"]
                with client.stream("POST", f"/api/sessions/{session_id}/messages", json={"text": "RUN<<print(6 * 7)>>"}) as answer:
                    said = "".join(answer.iter_text())
                assert answer.status_code == 200 and "42" in said, said[-2000:]
            for process, log in replicas:
                assert process.poll() is None and "Traceback" not in log.read_text(encoding="utf-8"), log.read_text(encoding="utf-8")[-3000:]
