"""Sign-in with an OpenID Connect provider (`serve.oidc`): the authorization code flow with PKCE, on Authlib.

    GET /oidc/sign-in    to the provider, with a fresh state, nonce and PKCE verifier (kept in a short-lived cookie
                         sealed with the server's sign-in key: any replica takes the callback)
    GET /oidc/callback   the code exchanged for tokens (Authlib, with the client's secret and the verifier), the ID
                         token's signature, issuer, audience, expiry and nonce checked (joserfc, the provider's keys),
                         the person let in or not (enrolment.py), then the page's sign-in cookie as a token sign-in gives

The provider's configuration and keys are read at the first sign-in (the provider may be down when `serve`
starts) and kept for an hour. The callback answers with a page that moves on to `/` by itself: the
sign-in cookie is SameSite=Strict, which a browser does not send on a redirect that began at another site.
"""

from __future__ import annotations

import asyncio
import base64
import functools
import hmac
import html
import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Route

from taskweaver_lite.config.settings import OidcConfig
from taskweaver_lite.errors import ConfigError, StoreError
from taskweaver_lite.store.interface import Actor, AuditEntry
from taskweaver_lite.web.auth import COOKIE, Access
from taskweaver_lite.web.enrolment import Admission, admitted, enrol
from taskweaver_lite.web.sign_in import SignInKey

STATE_COOKIE = "twl_oidc"
STATE_SECONDS = 600  # a sign-in at the provider must come back within this
DISCOVERY_SECONDS = 3600.0
HTTP_TIMEOUT = 10.0
_log = logging.getLogger(__name__)


@dataclass
class Provider:
    """The provider `serve.oidc` names: its configuration and keys, read when first needed and kept for an hour."""

    settings: OidcConfig
    _found: tuple[float, dict[str, Any], Any] | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def metadata(self) -> tuple[dict[str, Any], Any]:
        """The provider's configuration and its signing keys (a joserfc KeySet); ConfigError naming serve.oidc.issuer when it cannot be read."""
        with self._lock:
            if self._found is not None and time.monotonic() - self._found[0] < DISCOVERY_SECONDS:
                return self._found[1], self._found[2]
        import requests
        from joserfc.jwk import KeySet

        where = f"{self.settings.issuer}/.well-known/openid-configuration"
        try:
            answer = requests.get(where, timeout=HTTP_TIMEOUT)
            answer.raise_for_status()
            metadata = answer.json()
            keys = requests.get(metadata["jwks_uri"], timeout=HTTP_TIMEOUT)
            keys.raise_for_status()
            keyset = KeySet.import_key_set(keys.json())
        except (requests.RequestException, ValueError, KeyError) as exc:
            raise ConfigError(f"serve.oidc.issuer: {where} could not be read ({type(exc).__name__}: {exc})") from None
        if metadata.get("issuer", "").rstrip("/") != self.settings.issuer:
            raise ConfigError(f"serve.oidc.issuer is {self.settings.issuer}, but the provider there names itself {metadata.get('issuer')}")
        with self._lock:
            self._found = (time.monotonic(), metadata, keyset)
        return metadata, keyset

    def client(self, redirect_url: str) -> Any:
        """Authlib's OAuth 2 client for this provider, asking for PKCE (S256)."""
        from authlib.integrations.requests_client import OAuth2Session

        secret = self.settings.client_secret.get_secret_value() if self.settings.client_secret is not None else None
        return OAuth2Session(
            self.settings.client_id,
            secret,
            scope=" ".join(self.settings.scopes),
            redirect_uri=redirect_url,
            code_challenge_method="S256",
            token_endpoint_auth_method="client_secret_basic" if secret else "none",
        )

    def start(self, redirect_url: str) -> tuple[str, dict[str, str]]:
        """The provider's sign-in address, and what the callback must find again (state, nonce, PKCE verifier)."""
        from authlib.common.security import generate_token

        metadata, _ = self.metadata()
        kept = {"state": generate_token(32), "nonce": generate_token(32), "verifier": generate_token(64), "redirect": redirect_url}
        address, _ = self.client(redirect_url).create_authorization_url(
            metadata["authorization_endpoint"], state=kept["state"], nonce=kept["nonce"], code_verifier=kept["verifier"]
        )
        return address, kept

    def finish(self, code: str, kept: dict[str, str]) -> dict[str, Any]:
        """The ID token's claims (with the userinfo's, when the groups claim is not in it) for `code`; ValueError saying what did not hold."""
        import requests
        from authlib.common.errors import AuthlibBaseError
        from joserfc import jwt
        from joserfc.errors import JoseError

        metadata, keyset = self.metadata()
        client = self.client(kept["redirect"])
        try:
            tokens = client.fetch_token(metadata["token_endpoint"], code=code, code_verifier=kept["verifier"], timeout=HTTP_TIMEOUT)
        except (AuthlibBaseError, requests.RequestException, ValueError) as exc:  # the provider refused, or did not answer
            raise ValueError(f"the provider did not give tokens for this sign-in ({type(exc).__name__}: {exc})") from None
        if "id_token" not in tokens:
            raise ValueError("the provider gave no ID token: is `openid` among serve.oidc.scopes?")
        algorithms = metadata.get("id_token_signing_alg_values_supported") or ["RS256"]
        try:
            token = jwt.decode(tokens["id_token"], keyset, algorithms=[a for a in algorithms if a != "none"])
            jwt.JWTClaimsRegistry(
                iss={"essential": True, "value": self.settings.issuer},
                aud={"essential": True, "value": self.settings.client_id},
                nonce={"essential": True, "value": kept["nonce"]},
                exp={"essential": True},
                sub={"essential": True},
            ).validate(token.claims)
        except (JoseError, ValueError) as exc:
            raise ValueError(f"the provider's ID token does not hold ({type(exc).__name__}: {exc})") from None
        claims = dict(token.claims)
        userinfo = metadata.get("userinfo_endpoint")
        if self.settings.groups_claim not in claims and userinfo:
            answer = client.get(userinfo, timeout=HTTP_TIMEOUT)
            if answer.ok:
                extra = answer.json()
                if extra.get("sub") == claims["sub"]:
                    claims = {**extra, **claims}
        return claims

    def admission(self, claims: dict[str, Any]) -> Admission | str:
        """Whether the settings let in the person these claims name."""
        name = claims.get(self.settings.name_claim)
        if not isinstance(name, str) or not name:
            return f"The provider sent no {self.settings.name_claim!r} claim to name you by (serve.oidc.name_claim)."
        email = claims.get("email") if claims.get("email_verified") is True else None
        groups = claims.get(self.settings.groups_claim) or []
        return admitted(
            name,
            groups=[str(g) for g in groups] if isinstance(groups, list) else [str(groups)],
            email=email if isinstance(email, str) else None,
            allowed_domains=self.settings.allowed_domains,
            allowed_groups=self.settings.allowed_groups,
            admin_groups=self.settings.admin_groups,
        )


def seal_state(kept: dict[str, str], seal: Any) -> str:
    """The state cookie's value: what the callback needs, with its time, sealed with the sign-in key."""
    text = base64.urlsafe_b64encode(json.dumps({**kept, "at": time.time()}).encode()).decode().rstrip("=")
    return str(seal(text))


def open_state(value: str, unseal: Any) -> dict[str, str] | None:
    """What `seal_state` kept, when the server sealed it less than STATE_SECONDS ago; None otherwise."""
    text = unseal(value) if value else None
    if text is None:
        return None
    try:
        kept = json.loads(base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)))
    except ValueError:
        return None
    if not isinstance(kept, dict) or time.time() - float(kept.get("at", 0)) > STATE_SECONDS:
        return None
    return {key: str(value) for key, value in kept.items()}


def moving_on(location: str) -> HTMLResponse:
    """A page that goes on to `location` by itself (a navigation of this site's own, which carries its SameSite=Strict cookie)."""
    where = html.escape(location, quote=True)
    body = f'<!doctype html><meta http-equiv="refresh" content="0;url={where}"><title>Signed in</title><p>Signed in: <a href="{where}">continue</a>.</p>'
    return HTMLResponse(body, headers={"Cache-Control": "no-store", "Referrer-Policy": "same-origin"})


def provider_actor(settings: OidcConfig, source: str) -> Actor:
    """Who adds, promotes and demotes users at their sign-in, for the audit trail: `oidc:<issuer>`."""
    return Actor(f"oidc:{settings.issuer.split('://', 1)[-1]}", source)


def oidc_routes(provider: Provider, access: Access, key: SignInKey, sign_in_page: Callable[[str], Response]) -> list[Route]:
    """`/oidc/sign-in` and `/oidc/callback` for `provider`; `sign_in_page(problem)` answers a sign-in that did not go through."""

    async def begin(request: Request) -> Response:
        scheme = "https" if access.proxies.is_https(request) else "http"
        redirect = provider.settings.redirect_url or f"{scheme}://{request.headers.get('host', '')}/oidc/callback"
        try:
            address, kept = await asyncio.to_thread(provider.start, redirect)
        except ConfigError as exc:
            _log.warning("%s", exc)
            return sign_in_page("The sign-in provider cannot be reached now; try again shortly, or sign in with a token.")
        response = RedirectResponse(address, status_code=303)
        # Lax: the provider's redirect back is a top-level navigation from its site, which must carry this cookie.
        response.set_cookie(
            STATE_COOKIE, seal_state(kept, key.seal), max_age=STATE_SECONDS, path="/oidc/", httponly=True, samesite="lax",
            secure=access.proxies.is_https(request),
        )  # fmt: skip
        return response

    async def callback(request: Request) -> Response:
        address = access.proxies.client_address(request)
        kept = open_state(request.cookies.get(STATE_COOKIE, ""), key.unsealed)
        state = request.query_params.get("state", "")
        if kept is None or not hmac.compare_digest(state.encode(), kept["state"].encode()):
            return sign_in_page("This sign-in was not started here, or took more than ten minutes: start it again.")
        if "error" in request.query_params:
            said = request.query_params.get("error_description") or request.query_params["error"]
            return sign_in_page(f"The provider did not sign you in: {said}")
        try:
            claims = await asyncio.to_thread(provider.finish, request.query_params.get("code", ""), kept)
        except ConfigError as exc:
            _log.warning("%s", exc)
            return sign_in_page("The sign-in provider cannot be reached now; try again shortly, or sign in with a token.")
        except ValueError as exc:
            _log.warning("single sign-on refused from %s: %s", address, exc)
            return sign_in_page("The provider's answer could not be checked, so you are not signed in; try again.")
        admission = provider.admission(claims)
        by = provider_actor(provider.settings, address)
        if isinstance(admission, str):
            refused = AuditEntry(
                at=time.time(),
                actor=by.name,
                action="sign-in-refused",
                target=str(claims.get(provider.settings.name_claim, "")),
                source=address,
                detail=admission,
            )
            await asyncio.to_thread(access.audit, refused)
            return sign_in_page(admission)
        assert access.users is not None
        try:
            user = await asyncio.to_thread(enrol, access.users.store, admission, by=by)
            if isinstance(user, str):
                refused = AuditEntry(at=time.time(), actor=by.name, action="sign-in-refused", target=admission.name, source=address, detail=user)
                await asyncio.to_thread(access.audit, refused)
                return sign_in_page(user)
            value = await asyncio.to_thread(functools.partial(access.sign_in_user, user, via="oidc"))
        except StoreError:
            return sign_in_page("The session store cannot be reached, so you cannot be signed in; try again shortly.")
        entry = AuditEntry(at=time.time(), actor=user.name, action="sign-in", target=user.name, source=address, detail=f"oidc {provider.settings.issuer}")
        await asyncio.to_thread(access.audit, entry)
        response = moving_on("/")
        seconds = round(access.sign_in_hours * 3600)
        response.set_cookie(COOKIE, value, max_age=seconds, httponly=True, samesite="strict", secure=access.proxies.is_https(request))
        response.delete_cookie(STATE_COOKIE, path="/oidc/", httponly=True, samesite="lax", secure=access.proxies.is_https(request))
        return response

    return [Route("/oidc/sign-in", begin), Route("/oidc/callback", callback)]
