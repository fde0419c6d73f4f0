"""Who may use the server: loopback only by default; one token, or each user's own, anywhere else.

Three modes, chosen by the store and the flags:
- **Users** (the store has users: `taskweaver-lite users add`): every request names its user by
  `Authorization: Bearer <token>` (or the `twl_token` cookie the page sets after `/?token=...`), on
  127.0.0.1 too; 401 without a valid one. The server may start on any address without `--token`.
  The request's user goes into its scope (`scope["state"]["user"]`, a `store.interface.User`),
  where the routes read it: another user's session is absent to them (404), unless they are admin.
  With `serve.trusted_user_header` set (e.g. `X-Forwarded-User` behind oauth2-proxy), a request
  from an address in `serve.trusted_proxies` may name its user by that header instead; the header
  is ignored when the setting is off, and refused (403) from any other address.
- **One token** (`--token` or TASKWEAVER_LITE_TOKEN, no users): every request carries that token.
- **Loopback** (neither): only 127.0.0.1, ::1 and localhost are answered (a site re-pointed at
  127.0.0.1 by DNS rebinding is refused); on any other address the server refuses to start.
Users are looked up in the store on each request (their list is kept two seconds): users added or
removed while the server runs take effect at once, with no restart. A token past its expiry
(`users add --expires DAYS`) is refused with 401 and a line saying when it expired; one replaced by
`users rotate` stops working at once (its id is no longer in the store). Besides:
- A state-changing request (POST, DELETE) must also be same-origin (its Origin and Sec-Fetch-Site, when
  sent, say so) and JSON, a file upload, or empty: a page elsewhere cannot drive a session through
  the user's browser.
- No CORS headers are ever sent.
"""

from __future__ import annotations

import asyncio
import hmac
import os
import threading
import time
from dataclasses import dataclass, field

from starlette.requests import Request

from taskweaver_lite.config.settings import ServeConfig
from taskweaver_lite.errors import ConfigError, StoreError
from taskweaver_lite.store.interface import Store, User

LOOPBACK = frozenset({"127.0.0.1", "::1", "localhost"})
TOKEN_ENV = "TASKWEAVER_LITE_TOKEN"
COOKIE = "twl_token"
USERS_TTL_SECONDS = 2.0  # how long the list of users is trusted before the store is asked again
Refusal = tuple[int, str]


@dataclass(frozen=True)
class TrustedHeader:
    """A single sign-on proxy's header naming the user, and the addresses it is believed from."""

    name: str
    proxies: frozenset[str]


@dataclass
class Users:
    """The store's users, looked up per request (their list cached briefly; tokens checked every time)."""

    store: Store
    trusted: TrustedHeader | None = None
    _cached: tuple[float, dict[str, User]] = (0.0, {})
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def known(self) -> dict[str, User] | None:
        """The users as last read, while that is under USERS_TTL_SECONDS old; None when the store must be asked again."""
        with self._lock:
            at, users = self._cached
        return users if time.monotonic() - at < USERS_TTL_SECONDS else None

    def by_name(self) -> dict[str, User]:
        """Every user by name (at most USERS_TTL_SECONDS old)."""
        users = self.known()
        if users is not None:
            return users
        users = {user.name: user for user in self.store.users()}
        with self._lock:
            self._cached = (time.monotonic(), users)
        return users

    def identify(self, request: Request) -> User | Refusal:
        """The request's user, or why it is refused (a token the store does not know: 401)."""
        if self.trusted is not None and self.trusted.name in request.headers:
            client = request.client.host if request.client is not None else ""
            if client not in self.trusted.proxies:
                return 403, f"The {self.trusted.name} header is only believed from serve.trusted_proxies; this request came from {client}."
            named = self.by_name().get(request.headers[self.trusted.name].strip())
            if named is None:
                return 401, f"The user named by {self.trusted.name} is not known here: add them with `taskweaver-lite users add NAME`."
            return named
        offered = _offered_token(request)
        user = self.store.user_for_token(offered) if offered else None
        if user is None:
            return 401, "This server needs your user's token: send `Authorization: Bearer <token>`, or open the page as /?token=<token>."
        if user.expired():
            return 401, expired_token(user)
        return user


@dataclass(frozen=True)
class Access:
    """The server's rule: the one token every request needs (None on loopback without one), or each user's own (`users`)."""

    token: str | None
    users: Users | None = None
    public: bool = False  # bound to an address other machines reach

    @classmethod
    def for_address(cls, host: str, token: str | None, *, store_has_users: bool = False) -> Access:
        """The rule for a server bound to `host`; ConfigError when a non-loopback address has neither a token nor users."""
        token = token or os.environ.get(TOKEN_ENV) or None
        if token is None and host not in LOOPBACK and not store_has_users:
            raise ConfigError(
                f"serve --host {host} makes the sessions (and their code execution) reachable from other machines: "
                f"add users (taskweaver-lite users add NAME), give a token with --token or the {TOKEN_ENV} environment variable, "
                "or bind to 127.0.0.1."
            )
        return cls(token, public=host not in LOOPBACK)

    def with_users(self, store: Store, *, trusted: TrustedHeader | None = None) -> Access:
        """This rule, with the store's users taking over once it has any."""
        return Access(self.token, users=Users(store, trusted), public=self.public)

    @property
    def uses_tokens(self) -> bool:
        """Whether a token opens the page (`/?token=...` sets the cookie): one token, or users."""
        return self.token is not None or self.users is not None

    async def check(self, request: Request) -> Refusal | None:
        """Why `request` is refused (HTTP status, message); None when it may go on, its user (if any) in its scope."""
        if self.users is not None and self.users.known() != {}:  # users, or not known lately: the store is asked off the loop
            try:
                found = await asyncio.to_thread(self._identify, request)
            except StoreError as exc:
                return 503, f"The session store cannot be reached, so users cannot be checked: {exc}"
            if isinstance(found, tuple):
                return found
            if found is not None:
                request.scope.setdefault("state", {})["user"] = found
                return _same_origin(request)
        return self.problem(request)

    def _identify(self, request: Request) -> User | Refusal | None:
        """The request's user when the store has users; None when it has none (one-token or loopback rules apply)."""
        assert self.users is not None
        if not self.users.by_name():
            if self.token is None and self.public:  # started on users alone, and every user was removed since
                return 401, "This server has no users left: add one with `taskweaver-lite users add NAME`."
            return None
        return self.users.identify(request)

    def accepts(self, offered: str) -> bool:
        """Whether `offered` (the page's `/?token=`) is a token worth keeping in the cookie; checked again on every request."""
        if self.token is not None and hmac.compare_digest(offered.encode(), self.token.encode()):
            return True
        return self.users is not None and offered.startswith("twl_")

    def problem(self, request: Request) -> Refusal | None:
        """Why `request` is refused under the one-token and loopback rules; None when it may go on."""
        if self.token is None and _host_name(request) not in LOOPBACK:
            # Without a token only this machine's own names: a site whose name is re-pointed at
            # 127.0.0.1 (DNS rebinding) would otherwise pass as same-origin.
            return 403, "This server answers to 127.0.0.1, localhost and [::1] only (start it with a token to serve other names)."
        if self.token is not None and not self._has_token(request):
            return 401, "This server needs a token: send `Authorization: Bearer <token>`, or open the page as /?token=<token>."
        return _same_origin(request)

    def _has_token(self, request: Request) -> bool:
        assert self.token is not None
        return hmac.compare_digest(_offered_token(request).encode(), self.token.encode())


def trusted_header(settings: ServeConfig) -> TrustedHeader | None:
    """The single sign-on header `serve.trusted_user_header` names, believed from `serve.trusted_proxies`; None when off."""
    if not settings.trusted_user_header:
        return None
    return TrustedHeader(settings.trusted_user_header.lower(), frozenset(settings.trusted_proxies))


def expired_token(user: User) -> str:
    """The one line a request with an expired token gets."""
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(user.expires_at or 0))
    return f"The token of {user.name} expired on {when}: ask an administrator for a new one (taskweaver-lite users rotate {user.name})."


def _offered_token(request: Request) -> str:
    header = request.headers.get("authorization", "")
    return header[7:].strip() if header.lower().startswith("bearer ") else request.cookies.get(COOKIE, "")


def _same_origin(request: Request) -> Refusal | None:
    """A state-changing request from another site, or with a body a form could send, is refused."""
    if request.method in ("POST", "PUT", "DELETE", "PATCH"):
        origin = request.headers.get("origin")
        if origin is not None and origin != _own_origin(request):
            return 403, "Requests from other sites are refused."
        if request.headers.get("sec-fetch-site", "same-origin") not in ("same-origin", "none"):
            return 403, "Requests from other sites are refused."
        kind = request.headers.get("content-type", "").split(";")[0].strip()
        empty = not kind and request.headers.get("content-length", "0") == "0"
        if not empty and kind not in ("application/json", "multipart/form-data"):
            return 415, "Send JSON (Content-Type: application/json), a multipart file upload, or no body."
    return None


def _host_name(request: Request) -> str:
    host = request.headers.get("host", "")
    if host.startswith("["):
        return host[1 : host.find("]")] if "]" in host else host
    return host.rsplit(":", 1)[0] if ":" in host else host


def _own_origin(request: Request) -> str:
    """The origin the browser sees: behind a proxy that ends TLS, the scheme is the one it names in X-Forwarded-Proto.

    Believing the header from anyone is safe here: a page on another site cannot set it on a request
    (it is no CORS-safelisted header and no CORS is answered), and the host must match all the same.
    """
    host = request.headers.get("host", "")
    forwarded = request.headers.get("x-forwarded-proto", "").split(",")[0].strip().lower()
    scheme = forwarded if forwarded in ("http", "https") else request.url.scheme
    return f"{scheme}://{host}"
