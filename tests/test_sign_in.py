"""The page's sign-in as an attacker and an auditor see it: a sign-out that ends the sign-in, cookies the store cannot make,
refused tokens counted per client behind a proxy and refused in constant time, and the audit trail of who did what.

The server runs for real (uvicorn on 127.0.0.1) on an SQLite store with users; requests are httpx's,
with the headers a browser or a proxy would send. The browser itself, through nginx with TLS, is
tests/test_deploy.py.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import sqlite3
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
from taskweaver_lite.web.auth import COOKIE

pytestmark = pytest.mark.unit


@pytest.fixture
def project(tmp_path: Path) -> Path:
    return make_project(tmp_path, "http://127.0.0.1:9")  # no model is called


def add_user(project: Path, name: str, capsys: pytest.CaptureFixture[str], *, admin: bool = False) -> str:
    assert main(["users", "add", name, "-p", str(project), *(["--admin"] if admin else [])]) == 0
    return capsys.readouterr().out.splitlines()[-1]


def signed_in(client: httpx.Client, token: str, **headers: str) -> str:
    """Sign in by the page's form; the cookie's value."""
    answer = client.post("/sign-in", data={"token": token}, headers=headers, follow_redirects=False)
    assert answer.status_code == 303, answer.text
    return answer.cookies[COOKIE]


def test_after_sign_out_the_cookie_is_refused_even_when_the_browser_kept_it(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ana = add_user(project, "ana", capsys)
    with WebServer(load_config(project)) as web, httpx.Client(base_url=web.url) as client:
        value = signed_in(client, ana)
        assert client.get("/api/sessions").status_code == 200
        out = client.post("/sign-out", follow_redirects=False)
        assert out.status_code == 303
        with httpx.Client(base_url=web.url, cookies={COOKIE: value}) as kept:  # a copy of the cookie, as a thief or a stale tab holds it
            assert kept.get("/api/sessions").status_code == 401, "a signed-out cookie must be refused by the server, not only deleted"
        with httpx.Client(base_url=web.url) as other:
            value_2 = signed_in(other, ana)
            assert value_2 != value and other.get("/api/sessions").status_code == 200, "another browser's sign-in is its own"


def test_a_cookie_made_from_what_the_store_holds_is_refused_and_none_lasts_past_sign_in_hours(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ana = add_user(project, "ana", capsys, admin=True)
    store = sqlite3.connect(project / "sessions.db")
    token_id, token_hash = store.execute("SELECT token_id, token_hash FROM users WHERE name = 'ana'").fetchone()
    store.close()
    with WebServer(load_config(project, ["serve.sign_in_hours=1"])) as web, httpx.Client(base_url=web.url) as client:
        # Everything in the users table, signed as the store's own hash would sign it, for 31 years.
        message = f"{token_id}.{int(time.time()) + 31 * 365 * 86400}"
        forged = f"{message}.{hmac.new(bytes.fromhex(token_hash), message.encode(), hashlib.sha256).hexdigest()}"
        client.cookies.set(COOKIE, forged)
        assert client.get("/api/sessions").status_code == 401, "reading the users table must not be enough to sign in as its admin"
        client.cookies.clear()
        value = signed_in(client, ana)
        sign_in_id, until, _ = value.split(".")
        assert int(until) <= time.time() + 3600 + 5, "until is at most serve.sign_in_hours away"
        rows = sqlite3.connect(project / "sessions.db")
        kept = [str(v) for row in rows.execute("SELECT * FROM sign_ins").fetchall() for v in row]
        rows.close()
        assert value not in kept and value.rsplit(".", 1)[1] not in kept, "the store holds no cookie, nor its signature"
        client.cookies.set(COOKIE, f"{sign_in_id}.{int(until) + 86400}.{'0' * 64}")
        assert client.get("/api/sessions").status_code == 401, "a longer until with a made-up signature"


def test_the_sign_in_key_lives_outside_the_store_owner_only_and_a_bad_one_names_its_setting(
    project: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ana = add_user(project, "ana", capsys)
    with WebServer(load_config(project)) as web, httpx.Client(base_url=web.url) as client:
        value = signed_in(client, ana)
    key = project / "sign-in.key"
    assert key.exists() and key.stat().st_mode & 0o077 == 0, "made at first start, owner-only"
    assert key.read_text().strip() not in (project / "sessions.db").read_bytes().decode("latin-1")
    with WebServer(load_config(project)) as web, httpx.Client(base_url=web.url, cookies={COOKIE: value}) as client:
        assert client.get("/api/sessions").status_code == 200, "a restart keeps the key, and the sign-ins"
    other = tmp_path / "other.key"
    other.write_text("f" * 64)
    with WebServer(load_config(project, [f"serve.sign_in_key_file={other}"])) as web, httpx.Client(base_url=web.url, cookies={COOKIE: value}) as client:
        assert client.get("/api/sessions").status_code == 401, "another key: the old sign-ins are refused"
    short = tmp_path / "short.key"
    short.write_text("too short")
    with pytest.raises(ConfigError, match=r"serve\.sign_in_key_file: .* fewer than 32"):
        WebServer(load_config(project, [f"serve.sign_in_key_file={short}"]))
    with pytest.raises(ConfigError, match=r"serve\.sign_in_key_file: .*missing.key cannot be read"):
        WebServer(load_config(project, [f"serve.sign_in_key_file={tmp_path / 'missing.key'}"]))


def test_behind_a_trusted_proxy_network_the_cookie_is_secure_and_refused_tokens_are_counted_per_forwarded_client(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ana = add_user(project, "ana", capsys)
    settings = ["serve.trusted_proxies=['127.0.0.0/8']", "serve.failed_token_limit=3"]
    with WebServer(load_config(project, settings)) as web, httpx.Client(base_url=web.url) as client:
        over_tls = {"X-Forwarded-Proto": "https", "X-Forwarded-For": "203.0.113.7"}
        answer = client.post("/sign-in", data={"token": ana}, headers=over_tls, follow_redirects=False)
        assert "Secure" in answer.headers["set-cookie"], "a proxy within a trusted network ended TLS: the cookie is Secure"
        guesser = {"X-Forwarded-For": "198.51.100.66"}
        for n in range(3):
            bad = {"Authorization": f"Bearer twl_{n:016x}_{'x' * 43}", **guesser}
            assert client.get("/api/sessions", headers=bad).status_code == 401
        assert client.get("/api/sessions", headers={"Authorization": f"Bearer twl_{9:016x}_{'x' * 43}", **guesser}).status_code == 429
        newcomer = {"Authorization": f"Bearer {ana}", "X-Forwarded-For": "192.0.2.10"}
        assert client.get("/api/sessions", headers=newcomer).status_code == 200, "one guesser behind the proxy does not lock out the others"
    with pytest.raises(Exception, match=r"(?i)serve\.trusted_proxies.*not an IP address or a network"):
        load_config(project, ["serve.trusted_proxies=['proxy.example']"])


def test_x_forwarded_for_from_an_untrusted_peer_does_not_escape_the_limit(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    add_user(project, "ana", capsys)
    with WebServer(load_config(project, ["serve.failed_token_limit=2"])) as web, httpx.Client(base_url=web.url) as client:
        for n in range(2):
            rotated = {"Authorization": f"Bearer twl_{n:016x}_{'x' * 43}", "X-Forwarded-For": f"10.9.9.{n}"}
            assert client.get("/api/sessions", headers=rotated).status_code == 401
        again = {"Authorization": f"Bearer twl_{7:016x}_{'x' * 43}", "X-Forwarded-For": "10.9.9.200"}
        assert client.get("/api/sessions", headers=again).status_code == 429, "a rotated X-Forwarded-For from a peer not trusted is ignored"


def test_two_authorization_headers_are_refused(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ana = add_user(project, "ana", capsys)
    with WebServer(load_config(project)) as web, httpx.Client(base_url=web.url) as client:
        twice = httpx.Headers([("Authorization", f"Bearer {ana}"), ("Authorization", "Bearer twl_0000000000000000_" + "x" * 43)])
        answer = client.get("/api/sessions", headers=twice)
        assert answer.status_code == 400 and "2 times" in answer.json()["error"], answer.text


def test_a_refused_token_takes_as_long_whether_or_not_its_id_exists(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ana = add_user(project, "ana", capsys)
    known_id = ana.split("_")[1]
    store = SessionStore(project / "sessions.db")
    kinds = {"known": f"twl_{known_id}_{'y' * 43}", "unknown": f"twl_{'0' * 16}_{'y' * 43}", "malformed": "not-a-token"}
    times: dict[str, list[float]] = {kind: [] for kind in kinds}
    try:
        for _ in range(2):  # interleaved, the least of each kept
            for kind, token in kinds.items():
                # The CPU this thread spends: the work a refusal does, which a wall clock shows an attacker as time, but
                # which other programs on a loaded machine do not add to (a wall clock here measured them, up to 20 s).
                started = time.thread_time()
                assert store.user_for_token(token) is None
                times[kind].append(time.thread_time() - started)
    finally:
        store.close()
    wrong_secret, unknown_id, malformed = (min(times[kind]) * 1000 for kind in kinds)
    assert unknown_id > wrong_secret * 0.5 and malformed > wrong_secret * 0.5, (  # without the decoy check: 0.002
        f"a refusal's work tells whether a token id exists: {wrong_secret:.1f} ms of CPU (known id) against {unknown_id:.1f} ms (unknown), "
        f"{malformed:.1f} ms (malformed)"
    )


def test_the_audit_lists_a_users_add_a_refused_token_a_delete_and_a_sign_in_with_actor_and_time(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    started = time.time()
    root = add_user(project, "root", capsys, admin=True)
    ana = add_user(project, "ana", capsys)
    store = SessionStore(project / "sessions.db")
    ana_id = next(user.id for user in store.users() if user.name == "ana")
    store.create_session("ana-1", started=time.time(), owner=ana_id)
    store.record("ana-1", RoundStarted(Round(index=1, user_query="ana's request")))
    store.close()
    with WebServer(load_config(project, ["serve.trusted_proxies=['127.0.0.1']"])) as web, httpx.Client(base_url=web.url) as client:
        assert client.get("/api/sessions", headers={"Authorization": f"Bearer twl_{'a' * 16}_{'x' * 43}", "X-Forwarded-For": "198.51.100.9"}).status_code == 401
        signed_in(client, ana)
        client.post("/sign-out")
        as_root = {"Authorization": f"Bearer {root}"}
        assert client.get("/api/sessions/ana-1", headers=as_root).status_code == 200
        assert client.delete("/api/sessions/ana-1", headers=as_root).status_code == 200
    assert main(["users", "promote", "ana", "-p", str(project)]) == 0
    assert main(["users", "remove", "ana", "-p", str(project)]) == 0
    capsys.readouterr()
    assert main(["audit", "-p", str(project), "--json"]) == 0
    entries = json.loads(capsys.readouterr().out)
    seen = [(e["actor"], e["action"], e["target"]) for e in entries]
    for expected in [
        ("cli:", "user-added", "root"),
        ("cli:", "user-added", "ana"),
        ("-", "token-refused", f"token {'a' * 16}"),
        ("ana", "sign-in", "ana"),
        ("ana", "sign-out", "ana"),
        ("root", "session-opened-by-admin", "ana-1"),
        ("root", "session-deleted", "ana-1"),
        ("cli:", "user-promoted", "ana"),
        ("cli:", "user-removed", "ana"),
    ]:
        assert any(actor.startswith(expected[0]) and action == expected[1] and target == expected[2] for actor, action, target in seen), (expected, seen)
    refused = next(e for e in entries if e["action"] == "token-refused")
    assert refused["source"] == "198.51.100.9", "behind a trusted proxy, the client it names"
    assert all(e["time"].endswith("Z") and started - 1 <= e["at"] <= time.time() for e in entries), "UTC times"
    assert all(e["source"] for e in entries), "every entry says where from"
    later = json.loads(_audit_json(project, capsys, "--since", time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(time.time() + 60))))
    assert later == [], "--since leaves out what came before"
    assert main(["audit", "-p", str(project)]) == 0
    table = capsys.readouterr().out
    assert "TIME (UTC)" in table and "session-deleted" in table and ana not in table and root not in table, "a token never reaches the trail"


def _audit_json(project: Path, capsys: pytest.CaptureFixture[str], *options: str) -> str:
    assert main(["audit", "-p", str(project), "--json", *options]) == 0
    return capsys.readouterr().out


def test_the_audit_trail_is_append_only_in_the_store(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    add_user(project, "ana", capsys)
    db = sqlite3.connect(project / "sessions.db")
    try:
        for statement in ("UPDATE audit SET actor = 'someone else'", "DELETE FROM audit"):
            with pytest.raises(sqlite3.DatabaseError, match="append-only"):
                db.execute(statement)
        assert db.execute("SELECT actor FROM audit").fetchone()[0].startswith("cli:")
    finally:
        db.close()


def test_behind_a_trusted_header_auto_add_users_adds_the_allowed_by_their_groups_and_a_removed_user_stays_out(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    add_user(project, "root", capsys, admin=True)
    settings = [
        "serve.trusted_user_header=X-Forwarded-User",
        "serve.trusted_groups_header=X-Forwarded-Groups",
        "serve.trusted_proxies=['127.0.0.1']",
        "serve.auto_add_users=true",
        "serve.allowed_groups=['analysts']",
        "serve.admin_groups=['tw-admins']",
    ]

    def admins() -> dict[str, bool]:
        capsys.readouterr()
        assert main(["users", "list", "--json", "-p", str(project)]) == 0
        return {u["name"]: u["admin"] for u in json.loads(capsys.readouterr().out)}

    with WebServer(load_config(project, settings)) as web, httpx.Client(base_url=web.url) as client:

        def ask(name: str, groups: str) -> httpx.Response:
            return client.get("/api/sessions", headers={"X-Forwarded-User": name, "X-Forwarded-Groups": groups})

        assert ask("newbie", "analysts").status_code == 200, "added at the first request the proxy names them in"
        assert ask("boss", "analysts, tw-admins").status_code == 200
        outsider = ask("outsider", "sales")
        assert outsider.status_code == 403 and "only members of analysts" in outsider.json()["error"], outsider.text
        assert admins() == {"root": True, "newbie": False, "boss": True}
        assert ask("boss", "analysts").status_code == 200 and admins()["boss"] is False, "the proxy's groups decide who is an admin, at each request"
        assert main(["users", "remove", "newbie", "-p", str(project)]) == 0
        removed = ask("newbie", "analysts")
        assert removed.status_code == 403 and "was removed" in removed.json()["error"], "a removed user stays out"
    capsys.readouterr()
    assert main(["audit", "--json", "-p", str(project)]) == 0
    entries = [(e["actor"], e["action"], e["target"]) for e in json.loads(capsys.readouterr().out)]
    assert ("proxy:x-forwarded-user", "user-added", "newbie") in entries and ("proxy:x-forwarded-user", "user-demoted", "boss") in entries, entries
    with WebServer(load_config(project, settings[:3])) as web, httpx.Client(base_url=web.url) as client:
        assert client.get("/api/sessions", headers={"X-Forwarded-User": "stranger"}).status_code == 401, "off by default: nobody is added"
