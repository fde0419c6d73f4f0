"""Single sign-on with a real OpenID Connect provider, in a real browser: panva's oidc-provider (npm) started here,
`serve` with `serve.oidc`, headless Chromium signing in through the provider's own login and consent pages.

A first allowed sign-in adds the user (an admin by `admin_groups`), one from a domain not allowed is
refused, and a user removed since stays out. Skipped without node's oidc-provider (`.ci/run` installs
it into build/npm) or Chromium.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from chromium import NEEDS_CHROMIUM, chromium, sign_in_at_the_provider
from helpers import OIDC_PROVIDER_MODULE, make_project, oidc_provider

from taskweaver_lite.cli.main import main
from taskweaver_lite.config.file import load_config
from taskweaver_lite.testing.server_start import free_port
from taskweaver_lite.testing.web_server import WebServer

pytestmark = [
    pytest.mark.team,
    NEEDS_CHROMIUM,
    pytest.mark.skipif(shutil.which("node") is None or not OIDC_PROVIDER_MODULE.exists(), reason="oidc-provider is not in build/npm (.ci/run installs it)"),
]
SECRET = "client-secret-for-the-tests-0123456789"
ACCOUNTS = {
    "carol": {"email": "carol@example.org", "groups": ["analysts", "tw-admins"]},
    "dan": {"email": "dan@example.org", "groups": ["analysts"]},
    "eve": {"email": "eve@elsewhere.test", "groups": ["analysts"]},
}


@pytest.fixture
def browser() -> Iterator[Any]:
    with chromium() as driver:
        yield driver


def test_a_first_allowed_sign_in_adds_the_user_a_domain_not_allowed_is_refused_and_a_removed_user_stays_out(
    tmp_path: Path, browser: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    from selenium.webdriver.common.by import By

    project = make_project(tmp_path, "http://127.0.0.1:9")
    assert main(["users", "add", "root", "--admin", "-p", str(project)]) == 0
    provider_port = free_port()
    issuer = f"http://127.0.0.1:{provider_port}"
    oidc = {
        "issuer": issuer, "client_id": "taskweaver", "client_secret": SECRET, "allowed_domains": ["example.org"],
        "admin_groups": ["tw-admins"], "scopes": ["openid", "email", "profile", "groups"], "label": "the test provider",
    }  # fmt: skip
    config = load_config(project, [f"serve.oidc={json.dumps(oidc)}"])
    web = WebServer(config)
    with oidc_provider(port=provider_port, redirect_uris=[f"{web.url}/oidc/callback"], accounts=ACCOUNTS, client_secret=SECRET), web:
        shown = sign_in_at_the_provider(browser, web.url, "carol")
        assert browser.find_elements(By.ID, "new-session"), f"carol's first sign-in signs the page in: {shown}"
        cookie = next(c for c in browser.get_cookies() if c["name"] == "twl_sign_in")
        with httpx.Client(base_url=web.url, cookies={"twl_sign_in": cookie["value"]}) as client:
            assert client.get("/api/sessions").status_code == 200
        capsys.readouterr()
        assert main(["users", "list", "--json", "-p", str(project)]) == 0
        users = {u["name"]: u["admin"] for u in json.loads(capsys.readouterr().out)}
        assert users == {"root": True, "carol@example.org": True}, f"added at her first sign-in, an admin by admin_groups: {users}"

        shown = sign_in_at_the_provider(browser, web.url, "dan")
        assert browser.find_elements(By.ID, "new-session"), shown
        capsys.readouterr()
        assert main(["users", "list", "--json", "-p", str(project)]) == 0
        assert {u["name"]: u["admin"] for u in json.loads(capsys.readouterr().out)}["dan@example.org"] is False

        shown = sign_in_at_the_provider(browser, web.url, "eve")
        assert "only addresses at example.org" in shown and not browser.find_elements(By.ID, "new-session"), shown

        assert main(["users", "remove", "carol@example.org", "-p", str(project)]) == 0
        shown = sign_in_at_the_provider(browser, web.url, "carol")
        assert "was removed" in shown and not browser.find_elements(By.ID, "new-session"), "a removed user stays out"
        capsys.readouterr()
        assert main(["audit", "--json", "-p", str(project)]) == 0
        entries = [(e["actor"], e["action"], e["target"]) for e in json.loads(capsys.readouterr().out)]
        actor = f"oidc:127.0.0.1:{provider_port}"
        for expected in [
            (actor, "user-added", "carol@example.org"),
            ("carol@example.org", "sign-in", "carol@example.org"),
            (actor, "sign-in-refused", "eve@elsewhere.test"),
            (actor, "sign-in-refused", "carol@example.org"),
        ]:
            assert expected in entries, (expected, entries)
