"""Users: `taskweaver-lite users add|list|remove`, and a server whose store has users asking every request for one.

The server runs for real (uvicorn on 127.0.0.1); its sessions are made in the store directly, so no
kernel starts: what is tested is who may see what.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import httpx
import pytest
from helpers import make_project

from taskweaver_lite.cli.main import main
from taskweaver_lite.cli.serve import proxy_warning
from taskweaver_lite.config.file import load_config
from taskweaver_lite.errors import ConfigError
from taskweaver_lite.records.conversation import Round
from taskweaver_lite.records.events import RoundStarted
from taskweaver_lite.store.database import SessionStore
from taskweaver_lite.testing.web_server import WebServer
from taskweaver_lite.web.auth import COOKIE, Access

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
    """A session with one round in the project's store, made by the user named `owner` (sessions belong to a user's id)."""
    store = SessionStore(project / "sessions.db")
    ids = {user.name: user.id for user in store.users()}
    store.create_session(session_id, started=time.time(), owner=None if owner is None else ids[owner])
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
        # A user's token is never taken from the address (proxies log it): the link gets the sign-in page, no cookie.
        linked = client.get(f"/?token={ana}", headers={"Sec-Fetch-Site": "none"}, follow_redirects=False)
        assert linked.status_code == 401 and "set-cookie" not in linked.headers and "never taken from the address" in linked.text
        # The page's form sets the cookie, and the cookie then names the user.
        opened = client.post("/sign-in", data={"token": ana}, follow_redirects=False)
        assert opened.status_code == 303 and COOKIE in opened.cookies
        assert client.get("/api/sessions").status_code == 200, "the cookie the page got names ana"
        main(["users", "remove", "ana", "-p", str(project)])
        assert client.get("/api/sessions", headers={"Authorization": f"Bearer {ana}"}).status_code == 401, "a removed user's token, at once"
        assert client.get("/api/sessions").status_code == 401, "a removed user's sign-in, at once"


def test_a_trusted_proxy_header_names_the_user_only_when_enabled_and_only_from_a_listed_peer(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    add_user(project, "ana", capsys)
    stored(project, "ana-1", "ana")
    header = {"X-Forwarded-User": "ana"}
    with WebServer(load_config(project)) as web, httpx.Client(base_url=web.url) as client:
        assert client.get("/api/sessions", headers=header).status_code == 401, "off by default: the header is worth nothing"
    enabled = ["serve.trusted_user_header=X-Forwarded-User"]
    with WebServer(load_config(project, enabled)) as web, httpx.Client(base_url=web.url) as client:
        refused = client.get("/api/sessions", headers=header)
        assert refused.status_code == 403 and "serve.trusted_proxies" in refused.json()["error"], "no proxy is trusted until listed, 127.0.0.1 neither"
    listed = [*enabled, "serve.trusted_proxies=['127.0.0.1']"]
    with WebServer(load_config(project, listed)) as web, httpx.Client(base_url=web.url) as client:
        answer = client.get("/api/sessions", headers=header)
        assert answer.status_code == 200 and [row["id"] for row in answer.json()] == ["ana-1"]
        assert client.get("/api/sessions", headers={"X-Forwarded-User": "mallory"}).status_code == 401
        twice = client.get("/api/sessions", headers=[("X-Forwarded-User", "mallory"), ("X-Forwarded-User", "ana")])
        assert twice.status_code == 400 and "came 2 times" in twice.json()["error"], "a header sent twice names nobody"
    elsewhere = [*enabled, "serve.trusted_proxies=['10.1.2.3']"]
    with WebServer(load_config(project, elsewhere)) as web, httpx.Client(base_url=web.url) as client:
        # A local process claiming, by X-Forwarded-For, to be the proxy: the TCP peer (127.0.0.1) is what counts.
        forged = client.get("/api/sessions", headers={**header, "X-Forwarded-For": "10.1.2.3"})
        assert forged.status_code == 403 and "came from 127.0.0.1" in forged.json()["error"], forged.text


def test_serve_says_at_start_that_a_trusted_user_header_without_a_trusted_proxy_refuses_every_request(project: Path) -> None:
    assert proxy_warning(load_config(project)) is None, "off: nothing to say"
    alone = proxy_warning(load_config(project, ["serve.trusted_user_header=X-Forwarded-User"]))
    assert alone is not None and "serve.trusted_proxies is empty" in alone and "X-Forwarded-User" in alone and "\n" not in alone
    assert proxy_warning(load_config(project, ["serve.trusted_user_header=X-Forwarded-User", "serve.trusted_proxies=['10.0.0.2']"])) is None


def test_users_let_a_server_start_on_any_address_without_a_token() -> None:
    assert Access.for_address("0.0.0.0", None, store_has_users=True).token is None
    with pytest.raises(ConfigError, match="add users"):
        Access.for_address("0.0.0.0", None, store_has_users=False)


def test_a_token_given_for_some_days_is_listed_with_its_expiry_and_refused_once_past_it(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    brief = add_user(project, "ana", capsys, expires="0.000002")  # 0.17 s
    started = time.time()
    lasting = add_user(project, "bob", capsys, expires="30")
    forever = add_user(project, "cy", capsys)
    assert all(token.startswith("twl_") and " " not in token for token in (brief, lasting, forever)), "the token alone on the last line"
    assert main(["users", "list", "--json", "-p", str(project)]) == 0
    listed = {u["name"]: u for u in json.loads(capsys.readouterr().out)}
    assert listed["cy"]["expires_at"] is None
    assert abs(listed["bob"]["expires_at"] - (started + 30 * 86400)) < 60
    time.sleep(0.2)
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
    old = add_user(project, "ana", capsys, expires="0.000002")  # 0.17 s
    time.sleep(0.2)
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
    with WebServer(load_config(project, ["serve.max_sessions_per_user=2"])) as web, httpx.Client(base_url=web.url) as client:
        refused = client.post("/api/sessions", json={}, headers={"Authorization": f"Bearer {ana}"})
        message = refused.json()["error"]
        assert refused.status_code == 429 and "\n" not in message, refused.text
        assert message.startswith("You have 2 sessions") and "serve.max_sessions_per_user (2)" in message, message
        listed = client.get("/api/sessions", headers={"Authorization": f"Bearer {ana}"}).json()
        assert sorted(row["id"] for row in listed) == ["ana-1", "ana-2"], "nothing was made"
        assert client.get("/api/sessions", headers={"Authorization": f"Bearer {root}"}).status_code == 200


def test_the_page_signs_in_by_a_posted_form_with_a_signed_expiring_cookie_never_the_token(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ana = add_user(project, "ana", capsys)
    secret = ana.split("_", 2)[2]  # twl_<id>_<secret>: the secret may hold "_" itself
    with WebServer(load_config(project, ["serve.trusted_proxies=['127.0.0.1']"])) as web, httpx.Client(base_url=web.url) as client:
        page = client.get("/")
        assert page.status_code == 401 and '<form method="post" action="/sign-in">' in page.text
        assert "a token of their own" in page.text and "its token" not in page.text, "users mode speaks of the user's own token"
        assert client.get("/static/style.css").status_code == 200, "the sign-in page is styled before anyone signs in"
        wrong = client.post("/sign-in", data={"token": "twl_0000000000000000_" + "x" * 43}, follow_redirects=False)
        assert wrong.status_code == 401 and "set-cookie" not in wrong.headers and "not valid" in wrong.text, "no cookie for a token that is not valid"
        refused = client.post("/sign-in", data={"token": "twl_nonsense"}, follow_redirects=False)
        assert refused.status_code == 401 and "set-cookie" not in refused.headers
        signed = client.post("/sign-in", data={"token": ana}, follow_redirects=False)
        assert signed.status_code == 303 and signed.headers["location"] == "/"
        cookie = signed.headers["set-cookie"]
        value = signed.cookies[COOKIE]
        assert secret not in value and ana not in value, "the cookie is not the token"
        assert "HttpOnly" in cookie and "Max-Age=43200" in cookie and "Secure" not in cookie, cookie
        assert client.get("/api/sessions").status_code == 200, "the cookie signs the API in"
        behind_tls = client.post("/sign-in", data={"token": ana}, headers={"X-Forwarded-Proto": "https"}, follow_redirects=False)
        assert "Secure" in behind_tls.headers["set-cookie"], "behind a trusted proxy that ended TLS the cookie is Secure"
        client.post("/sign-out", follow_redirects=False)
        assert client.get("/api/sessions").status_code == 401, "signed out"
        client.post("/sign-in", data={"token": ana})
        assert main(["users", "rotate", "ana", "-p", str(project)]) == 0
        rotated = capsys.readouterr().out.splitlines()[-1]
        assert client.get("/api/sessions").status_code == 401, "a sign-in ends with the token it was made from"
    with WebServer(load_config(project)) as web, httpx.Client(base_url=web.url) as client:
        untrusted = client.post("/sign-in", data={"token": rotated}, headers={"X-Forwarded-Proto": "https"})
        assert untrusted.status_code == 303 and "Secure" not in untrusted.headers["set-cookie"], "X-Forwarded-Proto is believed only from serve.trusted_proxies"
        client.cookies.set(COOKIE, "-.9999999999." + "0" * 64)
        assert client.get("/api/sessions").status_code == 401, "a cookie no server signed"


def test_refused_tokens_from_one_address_past_serve_failed_token_limit_get_429_with_retry_after(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ana, bob = add_user(project, "ana", capsys), add_user(project, "bob", capsys)
    with WebServer(load_config(project, ["serve.failed_token_limit=3"])) as web, httpx.Client(base_url=web.url) as client:
        assert client.get("/api/sessions", headers={"Authorization": f"Bearer {bob}"}).status_code == 200
        for n in range(3):
            assert client.get("/api/sessions", headers={"Authorization": f"Bearer twl_{n:016x}_{'x' * 43}"}).status_code == 401
        limited = client.get("/api/sessions", headers={"Authorization": f"Bearer {ana}"})
        assert limited.status_code == 429 and 0 < int(limited.headers["retry-after"]) <= 60, limited.text
        assert "try again in" in limited.json()["error"]
        assert client.post("/sign-in", data={"token": ana}).status_code == 429, "the sign-in form counts and waits too"
        shared = client.get("/api/sessions", headers={"Authorization": f"Bearer {bob}"})
        assert shared.status_code == 200, "a token that worked before is not held back with the guesses from its address"


def test_a_revoked_token_ends_the_event_streams_opened_with_it(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tokens = {name: add_user(project, name, capsys) for name in ("ana", "bob", "cy", "dee")}
    for name in tokens:
        stored(project, f"{name}-1", name)
    ended: dict[str, float] = {}  # when each stream ended (time.monotonic)
    streaming = {name: threading.Event() for name in tokens}

    def follow(name: str) -> None:
        headers = {"Authorization": f"Bearer {tokens[name]}"}
        with httpx.Client(base_url=web.url, headers=headers, timeout=30) as client, client.stream("GET", f"/api/sessions/{name}-1/events") as stream:
            assert stream.status_code == 200
            streaming[name].set()
            for _ in stream.iter_lines():
                if outlived_the_others() or time.monotonic() > give_up[0]:
                    return  # still open: `ended` lacks it
        ended[name] = time.monotonic()

    def outlived_the_others() -> bool:
        """Open 0.8 s (more than two checks) past the last of the revoked and expired streams' ends."""
        others = [ended[name] for name in ("ana", "bob", "cy") if name in ended]
        return len(others) == 3 and time.monotonic() > max(others) + 0.8

    def at(*command: str) -> float:
        """When `command` was given: the moment before it ran."""
        given = time.monotonic()
        assert main([*command, "-p", str(project)]) == 0
        return given

    give_up = [time.monotonic() + 60.0]  # a stream still open then has outlived its check for good (12 s past the changes, below)
    with WebServer(load_config(project, ["serve.lease_timeout=1"])) as web:  # each stream asks every third of a second
        followers = [threading.Thread(target=follow, args=(name,)) for name in tokens]
        for thread in followers:
            thread.start()
        for name, event in streaming.items():  # every stream open before any token is revoked (a loaded machine is slow to get there)
            assert event.wait(20), f"{name}'s stream did not open"
        # Changed once every stream is open, not timed from the tokens' making: a loaded machine may take seconds to open them.
        revoked = {"ana": at("users", "remove", "ana"), "bob": at("users", "rotate", "bob"), "cy": at("users", "expires", "cy", "0.00001")}  # cy's: 0.864 s
        give_up[0] = time.monotonic() + 12
        for thread in followers:  # dee's last: it leaves once it has outlived the others
            thread.join(30)
    assert set(ended) >= {"ana", "bob", "cy"}, ended
    after = {name: ended[name] - revoked[name] for name in revoked}
    # The bound is nine checks: what it tells apart is a stream that ends at a check from one that runs on (12 s),
    # and a loaded machine runs each check late.
    assert after["ana"] < 3 and after["bob"] < 3, ("removed and rotated: ended at the next checks", after)
    assert 0.864 < after["cy"] < 0.864 + 3, ("expired: ended once past its expiry, not when the expiry was set", after)
    assert "dee" not in ended, "a token that still works keeps its stream"


def test_a_user_holds_at_most_serve_max_streams_per_user_event_streams(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ana = add_user(project, "ana", capsys)
    stored(project, "ana-1", "ana")
    with (
        WebServer(load_config(project, ["serve.max_streams_per_user=2"])) as web,
        httpx.Client(base_url=web.url, headers={"Authorization": f"Bearer {ana}"}) as client,
    ):
        with client.stream("GET", "/api/sessions/ana-1/events") as first, client.stream("GET", "/api/sessions/ana-1/events") as second:
            assert first.status_code == second.status_code == 200
            third = client.get("/api/sessions/ana-1/events")
            assert third.status_code == 429 and "serve.max_streams_per_user" in third.json()["error"]
        deadline = time.monotonic() + 10  # the server hears of the closed connections a moment later
        while True:
            with client.stream("GET", "/api/sessions/ana-1/events") as again:
                if again.status_code == 200 or time.monotonic() > deadline:
                    assert again.status_code == 200, "a stream that ended gives its place back"
                    break
            time.sleep(0.2)


def test_removing_the_last_user_refuses_every_request_rather_than_opening_the_sessions(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    add_user(project, "ana", capsys)
    stored(project, "ana-1", "ana")
    assert main(["users", "remove", "ana", "-p", str(project)]) == 0
    assert "taskweaver-lite users add" in capsys.readouterr().out, "the admin is told how to get back in"
    with WebServer(load_config(project)) as web, httpx.Client(base_url=web.url) as client:
        refused = client.get("/api/sessions")
        assert refused.status_code == 401 and "adds one with `taskweaver-lite users add NAME`" in refused.json()["error"], refused.text
        assert client.get("/api/sessions/ana-1/events").status_code == 401


@pytest.mark.kernel  # the old carol's session is made over HTTP, as a server records it: its kernel starts
def test_a_name_removed_and_added_again_is_someone_new_without_the_old_ones_sessions_or_tips(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    old_carol = add_user(project, "carol", capsys)
    with WebServer(load_config(project)) as web, httpx.Client(base_url=web.url, timeout=60) as client:
        made = client.post("/api/sessions", json={}, headers={"Authorization": f"Bearer {old_carol}"})
        assert made.status_code == 200, made.text
        session_id = made.json()["id"]
        store = SessionStore(project / "sessions.db")
        store.save_tips(session_id, [("preference", "the old carol's tip")])
        old_id = store.users()[0].id
        store.close()
        with client.stream("POST", f"/api/sessions/{session_id}/messages", json={"text": "hello"}, headers={"Authorization": f"Bearer {old_carol}"}) as asked:
            assert asked.status_code == 200 and "error" in asked.read().decode()  # no model answers: the call is still counted
        metrics = client.get("/metrics", headers={"Authorization": f"Bearer {old_carol}"}).text
        assert 'user="carol"' in metrics and old_id not in metrics, "the metrics name the user, not the id their sessions belong to"
        main(["users", "remove", "carol", "-p", str(project)])
        carol = add_user(project, "carol", capsys)
        assert client.get(f"/api/sessions/{session_id}", headers={"Authorization": f"Bearer {carol}"}).status_code == 404, "not the old carol's"
    store = SessionStore(project / "sessions.db")
    new_id = store.users()[0].id
    assert new_id != old_id and store.owner_of(session_id) == old_id and store.stored_tips(owner=new_id) == []
    store.close()


def test_at_serve_max_sessions_per_user_a_new_session_is_the_users_one_never_asked_anything(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ana = add_user(project, "ana", capsys)
    stored(project, "ana-1", "ana")
    store = SessionStore(project / "sessions.db")
    store.create_session("ana-empty", started=time.time(), owner=store.users()[0].id)  # made, never asked anything: it counts
    store.close()
    with WebServer(load_config(project, ["serve.max_sessions_per_user=2"])) as web, httpx.Client(base_url=web.url) as client:
        headers = {"Authorization": f"Bearer {ana}"}
        again = [client.post("/api/sessions", json={}, headers=headers) for _ in range(3)]
        assert [answer.json() for answer in again] == [{"id": "ana-empty"}] * 3, "past the limit, New hands back her unused session: nothing is made"
        assert client.post("/api/sessions/ana-empty/resume", headers=headers).status_code == 200
    store = SessionStore(project / "sessions.db")
    assert store.count_sessions(owner=store.users()[0].id) == 2
    store.close()
