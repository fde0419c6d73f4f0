"""Users: `taskweaver-lite users add|list|remove`, and a server whose store has users asking every request for one.

The server runs for real (uvicorn on 127.0.0.1); its sessions are made in the store directly, so no
kernel starts: what is tested is who may see what.
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
from taskweaver_lite.errors import ConfigError
from taskweaver_lite.records.conversation import Round
from taskweaver_lite.records.events import RoundStarted
from taskweaver_lite.store.database import SessionStore
from taskweaver_lite.testing.web_server import WebServer
from taskweaver_lite.web.auth import Access

pytestmark = pytest.mark.unit


@pytest.fixture
def project(tmp_path: Path) -> Path:
    return make_project(tmp_path, "http://127.0.0.1:9")  # no model is called


def add_user(project: Path, name: str, capsys: pytest.CaptureFixture[str], *, admin: bool = False, expires: str | None = None) -> str:
    options = [*(["--admin"] if admin else []), *(["--expires", expires] if expires else [])]
    assert main(["users", "add", name, "-p", str(project), *options]) == 0
    out = capsys.readouterr().out
    return out.splitlines()[-1]


def stored(project: Path, session_id: str, owner: str | None) -> None:
    store = SessionStore(project / "sessions.db")
    store.create_session(session_id, started=time.time(), owner=owner)
    store.record(session_id, RoundStarted(Round(index=1, user_query=f"{session_id}'s request")))
    store.close()


def test_users_add_prints_the_token_alone_on_its_last_line_and_list_and_remove_follow(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    token = add_user(project, "ana", capsys)
    assert token.startswith("twl_") and " " not in token
    add_user(project, "root", capsys, admin=True)
    assert main(["users", "list", "--json", "-p", str(project)]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [(u["name"], u["admin"]) for u in listed] == [("ana", False), ("root", True)]
    assert all(set(u) == {"name", "admin", "created_at", "expires_at"} and u["expires_at"] is None for u in listed), "tokens never expire unless told"
    assert main(["users", "list", "-p", str(project)]) == 0
    assert token not in capsys.readouterr().out
    assert main(["users", "remove", "ana", "-p", str(project)]) == 0
    capsys.readouterr()
    assert main(["users", "remove", "ana", "-p", str(project)]) == 1
    assert "there is no user 'ana'" in capsys.readouterr().err


def test_a_server_on_a_store_with_users_asks_every_request_for_one_even_on_loopback(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ana, bob, root = (add_user(project, name, capsys, admin=name == "root") for name in ("ana", "bob", "root"))
    stored(project, "ana-1", "ana")
    stored(project, "bob-1", "bob")
    with WebServer(load_config(project)) as web, httpx.Client(base_url=web.url) as client:
        assert client.get("/api/sessions").status_code == 401
        assert client.get("/api/sessions", headers={"Authorization": "Bearer twl_0000000000000000_" + "x" * 43}).status_code == 401

        def ids(token: str) -> list[str]:
            answer = client.get("/api/sessions", headers={"Authorization": f"Bearer {token}"})
            assert answer.status_code == 200, answer.text
            return sorted(row["id"] for row in answer.json())

        assert ids(ana) == ["ana-1"] and ids(bob) == ["bob-1"] and ids(root) == ["ana-1", "bob-1"]
        assert client.get("/api/sessions/bob-1", headers={"Authorization": f"Bearer {ana}"}).status_code == 404, "another's session is not there"
        # The page: /?token= sets the cookie, and the cookie then names the user.
        opened = client.get(f"/?token={ana}", follow_redirects=False)
        assert opened.status_code == 303 and "twl_token" in opened.cookies
        assert client.get("/api/sessions").status_code == 200, "the cookie the page got names ana"
        main(["users", "remove", "ana", "-p", str(project)])
        assert client.get("/api/sessions", headers={"Authorization": f"Bearer {ana}"}).status_code == 401, "a removed user's token, at once"


def test_a_trusted_proxy_header_names_the_user_only_when_enabled_and_only_from_the_proxy(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    add_user(project, "ana", capsys)
    stored(project, "ana-1", "ana")
    header = {"X-Forwarded-User": "ana"}
    with WebServer(load_config(project)) as web, httpx.Client(base_url=web.url) as client:
        assert client.get("/api/sessions", headers=header).status_code == 401, "off by default: the header is worth nothing"
    enabled = ["serve.trusted_user_header=X-Forwarded-User"]
    with WebServer(load_config(project, enabled)) as web, httpx.Client(base_url=web.url) as client:
        answer = client.get("/api/sessions", headers=header)
        assert answer.status_code == 200 and [row["id"] for row in answer.json()] == ["ana-1"]
        assert client.get("/api/sessions", headers={"X-Forwarded-User": "mallory"}).status_code == 401
    elsewhere = [*enabled, "serve.trusted_proxies=['10.1.2.3']"]
    with WebServer(load_config(project, elsewhere)) as web, httpx.Client(base_url=web.url) as client:
        refused = client.get("/api/sessions", headers=header)
        assert refused.status_code == 403 and "serve.trusted_proxies" in refused.json()["error"]


def test_users_let_a_server_start_on_any_address_without_a_token() -> None:
    assert Access.for_address("0.0.0.0", None, store_has_users=True).token is None
    with pytest.raises(ConfigError, match="add users"):
        Access.for_address("0.0.0.0", None, store_has_users=False)


def test_a_token_given_for_some_days_is_listed_with_its_expiry_and_refused_once_past_it(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    brief = add_user(project, "ana", capsys, expires="0.00001")  # under a second
    started = time.time()
    lasting = add_user(project, "bob", capsys, expires="30")
    forever = add_user(project, "cy", capsys)
    assert all(token.startswith("twl_") and " " not in token for token in (brief, lasting, forever)), "the token alone on the last line"
    assert main(["users", "list", "--json", "-p", str(project)]) == 0
    listed = {u["name"]: u for u in json.loads(capsys.readouterr().out)}
    assert listed["cy"]["expires_at"] is None
    assert abs(listed["bob"]["expires_at"] - (started + 30 * 86400)) < 60
    time.sleep(1.0)
    assert main(["users", "list", "-p", str(project)]) == 0
    table = capsys.readouterr().out.splitlines()
    assert "TOKEN EXPIRES" in table[0]
    assert table[1].startswith("ana") and table[1].endswith("(expired)")
    assert table[2].startswith("bob") and time.strftime("%Y-%m-%d", time.localtime(started + 30 * 86400)) in table[2] and "expired" not in table[2]
    assert table[3].startswith("cy") and table[3].endswith("never")
    with WebServer(load_config(project)) as web, httpx.Client(base_url=web.url) as client:
        refused = client.get("/api/sessions", headers={"Authorization": f"Bearer {brief}"})
        message = refused.json()["error"]
        assert refused.status_code == 401 and "\n" not in message, refused.text
        assert message.startswith("The token of ana expired on ") and "taskweaver-lite users rotate ana" in message, message
        for token in (lasting, forever):
            assert client.get("/api/sessions", headers={"Authorization": f"Bearer {token}"}).status_code == 200


def test_users_rotate_prints_a_new_token_and_the_old_one_stops_working_at_once(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    old = add_user(project, "ana", capsys, expires="0.00001")
    time.sleep(1.0)
    with WebServer(load_config(project)) as web, httpx.Client(base_url=web.url) as client:
        assert client.get("/api/sessions", headers={"Authorization": f"Bearer {old}"}).status_code == 401, "expired"
        assert main(["users", "rotate", "ana", "--expires", "7", "-p", str(project)]) == 0
        out, err = capsys.readouterr()
        new = out.splitlines()[-1]
        assert new.startswith("twl_") and new != old and out.strip() == new, "the new token, alone on stdout's last line"
        assert "old one no longer works" in err and "expires on" in err
        assert client.get("/api/sessions", headers={"Authorization": f"Bearer {new}"}).status_code == 200
        # Rotated again without --expires: the same seven days; the token before it stops at once, though this server verified it.
        assert main(["users", "rotate", "ana", "-p", str(project)]) == 0
        newest = capsys.readouterr().out.splitlines()[-1]
        assert client.get("/api/sessions", headers={"Authorization": f"Bearer {new}"}).status_code == 401
        assert client.get("/api/sessions", headers={"Authorization": f"Bearer {newest}"}).status_code == 200
    assert main(["users", "list", "--json", "-p", str(project)]) == 0
    (ana,) = json.loads(capsys.readouterr().out)
    assert abs(ana["expires_at"] - (time.time() + 7 * 86400)) < 60
    assert main(["users", "rotate", "nobody", "-p", str(project)]) == 1
    assert "there is no user 'nobody'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["users", "add", "bo", "--expires", "0", "-p", str(project)])
    assert "--expires 90" in capsys.readouterr().err


def test_a_user_at_serve_max_sessions_per_user_gets_429_naming_the_setting(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ana, root = add_user(project, "ana", capsys), add_user(project, "root", capsys, admin=True)
    stored(project, "ana-1", "ana")
    stored(project, "ana-2", "ana")
    store = SessionStore(project / "sessions.db")
    store.create_session("ana-empty", started=time.time(), owner="ana")  # never asked anything: not listed, not counted
    store.close()
    with WebServer(load_config(project, ["serve.max_sessions_per_user=2"])) as web, httpx.Client(base_url=web.url) as client:
        refused = client.post("/api/sessions", json={}, headers={"Authorization": f"Bearer {ana}"})
        message = refused.json()["error"]
        assert refused.status_code == 429 and "\n" not in message, refused.text
        assert message.startswith("You have 2 sessions") and "serve.max_sessions_per_user (2)" in message, message
        listed = client.get("/api/sessions", headers={"Authorization": f"Bearer {ana}"}).json()
        assert sorted(row["id"] for row in listed) == ["ana-1", "ana-2"], "nothing was made"
        assert client.get("/api/sessions", headers={"Authorization": f"Bearer {root}"}).status_code == 200
