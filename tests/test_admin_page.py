"""The admin page's routes and a user's own token: admins only, every change in the audit trail with the admin as actor,
sessions with their owners, kernels, usage per user (tokens by model, cells, the seconds they ran).

The server runs for real (uvicorn on 127.0.0.1) on an SQLite store; sessions, model calls and cells are
written to the store directly, so no kernel or model runs. The page itself, in Chromium through nginx
with TLS, is tests/test_deploy.py.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
import pytest
from helpers import make_project

from taskweaver_lite.cli.main import main
from taskweaver_lite.config.file import load_config
from taskweaver_lite.records.conversation import Post, Round
from taskweaver_lite.records.events import ModelCalled, PostAdded, RoundStarted
from taskweaver_lite.records.execution import ExecutionResult
from taskweaver_lite.store.database import SessionStore
from taskweaver_lite.testing.web_server import WebServer
from taskweaver_lite.web.auth import COOKIE

pytestmark = pytest.mark.unit


@pytest.fixture
def project(tmp_path: Path) -> Path:
    return make_project(tmp_path, "http://127.0.0.1:9")


def add_user(project: Path, name: str, capsys: pytest.CaptureFixture[str], *, admin: bool = False) -> str:
    assert main(["users", "add", name, "-p", str(project), *(["--admin"] if admin else [])]) == 0
    return capsys.readouterr().out.splitlines()[-1]


def a_session_with_work(project: Path, session_id: str, owner: str, *, model: str, cells: tuple[float, ...]) -> None:
    """A session of `owner` with one model call of `model` and a cell post per entry of `cells` (its seconds)."""
    store = SessionStore(project / "sessions.db")
    try:
        owner_id = next(user.id for user in store.users() if user.name == owner)
        store.create_session(session_id, started=time.time(), owner=owner_id)
        round_ = Round(index=1, user_query="a request")
        store.record(session_id, RoundStarted(round_))
        store.record(session_id, ModelCalled(purpose="planner", prompt_tokens=100, completion_tokens=20, latency=0.1, ok=True, model=model))
        for seconds in cells:
            run = ExecutionResult(code="x = 1", success=True, elapsed=seconds)
            store.record(session_id, PostAdded(round_, Post(send_from="CodeInterpreter", send_to="Planner", message="ran", code="x = 1", execution=run)))
    finally:
        store.close()


def test_the_admin_routes_are_for_admins_and_every_change_is_audited_with_the_admin_as_actor(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = add_user(project, "root", capsys, admin=True)
    ana = add_user(project, "ana", capsys)
    a_session_with_work(project, "ana-1", "ana", model="gpt-4o-mini", cells=(1.5, 2.0))
    a_session_with_work(project, "root-1", "root", model="big-model", cells=())
    with WebServer(load_config(project)) as web, httpx.Client(base_url=web.url, headers={"Authorization": f"Bearer {root}"}) as admin:
        as_ana = {"Authorization": f"Bearer {ana}"}
        refused = admin.get("/api/admin/users", headers=as_ana)
        assert refused.status_code == 403 and "not an admin" in refused.json()["error"]
        assert admin.post("/api/admin/users", json={"name": "mallory", "admin": True}, headers=as_ana).status_code == 403
        assert admin.get("/admin").status_code == 200 and "Audit trail" in admin.get("/admin").text
        assert [u["name"] for u in admin.get("/api/admin/users").json()] == ["ana", "root"]
        made = admin.post("/api/admin/users", json={"name": "bo", "expires_days": 30}).json()
        assert made["token"].startswith("twl_") and admin.get("/api/sessions", headers={"Authorization": f"Bearer {made['token']}"}).status_code == 200
        assert admin.post("/api/admin/users", json={"name": "bo"}).status_code == 400, "a name taken"
        assert admin.post("/api/admin/users/bo/promote").status_code == 200
        assert admin.post("/api/admin/users/bo/demote").status_code == 200
        rotated = admin.post("/api/admin/users/bo/rotate").json()["token"]
        assert admin.get("/api/sessions", headers={"Authorization": f"Bearer {made['token']}"}).status_code == 401, "the old token stops at once"
        assert admin.post("/api/admin/users/bo/expire", json={"days": 0}).status_code == 200
        assert admin.get("/api/sessions", headers={"Authorization": f"Bearer {rotated}"}).status_code == 401, "expired at once"
        assert admin.delete("/api/admin/users/bo").status_code == 200
        assert admin.delete("/api/admin/users/root").status_code == 400, "an admin does not remove themselves here"
        assert admin.post("/api/admin/users/nobody/promote").status_code == 404
        sessions = {s["id"]: s["owner"] for s in admin.get("/api/admin/sessions").json()}
        assert sessions == {"ana-1": "ana", "root-1": "root"}
        kernels = admin.get("/api/admin/kernels").json()
        assert kernels["gateway"] is None and kernels["kernels"] == [], "no gateway and nothing open here"
        usage = {u["user"]: u for u in admin.get("/api/admin/usage").json()}
        assert usage["ana"]["cells"] == 2 and usage["ana"]["cell_seconds"] == 3.5 and usage["ana"]["sessions"] == 1
        assert usage["ana"]["models"] == {"gpt-4o-mini": {"calls": 1, "prompt_tokens": 100, "completion_tokens": 20, "cached_tokens": 0}}
        assert set(usage["root"]["models"]) == {"big-model"} and usage["root"]["cells"] == 0
        audit = [(e["actor"], e["action"], e["target"]) for e in admin.get("/api/admin/audit").json()]
        for action in ("user-added", "user-promoted", "user-demoted", "user-rotated", "user-expired", "user-removed"):
            assert ("root", action, "bo") in audit, (action, audit)
        assert all(e["source"] == "127.0.0.1" for e in admin.get("/api/admin/audit").json() if e["actor"] == "root")


def test_a_user_rotates_their_own_token_and_their_browser_stays_signed_in(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ana = add_user(project, "ana", capsys)
    with WebServer(load_config(project)) as web, httpx.Client(base_url=web.url) as browser:
        assert browser.post("/sign-in", data={"token": ana}, follow_redirects=False).status_code == 303
        me = browser.get("/api/me").json()
        assert me["name"] == "ana" and me["admin"] is False and me["users"] is True
        made = browser.post("/api/me/token")
        assert made.status_code == 200, made.text
        token = made.json()["token"]
        assert browser.get("/api/sessions").status_code == 200, "the page that asked keeps its sign-in, now of the new token"
        with httpx.Client(base_url=web.url) as other:
            assert other.get("/api/sessions", headers={"Authorization": f"Bearer {ana}"}).status_code == 401, "the old token stops at once"
            assert other.get("/api/sessions", headers={"Authorization": f"Bearer {token}"}).status_code == 200
        assert COOKIE in made.cookies
    capsys.readouterr()
    assert main(["audit", "--json", "-p", str(project)]) == 0
    assert ("ana", "user-rotated", "ana") in [(e["actor"], e["action"], e["target"]) for e in json.loads(capsys.readouterr().out)]


def test_without_users_there_is_no_admin_page_to_reach(project: Path) -> None:
    with WebServer(load_config(project)) as web, httpx.Client(base_url=web.url) as client:
        assert client.get("/api/admin/users").status_code == 404
        assert client.get("/api/me").json() == {"name": None, "admin": False, "users": False}
