"""Who may use the server: loopback only by default; one token, or each user's own, anywhere else.

Three modes, chosen by the store and the flags:
- **Users** (the store has users: `taskweaver-lite users add`): every request names its user by
  `Authorization: Bearer <token>` (or the page's sign-in cookie), on 127.0.0.1 too; 401 without a
  valid one. The server may start on any address without `--token`. The request's user goes into
  its scope (`scope["state"]["user"]`, a `store.interface.User`), where the routes read it:
  another user's session is absent to them (404), unless they are admin. With
  `serve.trusted_user_header` set (e.g. `X-Forwarded-User` behind oauth2-proxy), a request whose
  TCP peer is in `serve.trusted_proxies` (empty until set) may name its user by that header
  instead; the header is refused from any other peer (403), and when sent twice (400).
  A store that has had users stays in this mode once the last is removed: every request is
  refused until an administrator adds a user again.
- **One token** (`--token` or TASKWEAVER_LITE_TOKEN, no users): every request carries that token.
- **Loopback** (neither): only 127.0.0.1, ::1 and localhost are answered (a site re-pointed at
  127.0.0.1 by DNS rebinding is refused); on any other address the server refuses to start.
Users are looked up in the store on each request (their list is kept two seconds): users added or
removed while the server runs take effect at once, with no restart. A token past its expiry
(`users add --expires DAYS`) is refused with 401 and a line saying when it expired; one replaced by
`users rotate` stops working at once (its id is no longer in the store). Besides:
- The page signs in by a POST form (`/sign-in`): the cookie it gets names a sign-in kept in the store,
  signed with the server's key (sign_in.py: never the token, never anything the store holds), that
  runs out after `serve.sign_in_hours`; `Secure` when the request came over TLS (its scheme, or a
  trusted proxy's X-Forwarded-Proto). `/sign-out` ends that sign-in in the store: its cookie is
  refused from then on, by every replica, even by a browser that kept it.
- A client address with `serve.failed_token_limit` tokens refused within a minute gets 429 (with
  Retry-After) until the minute is over: tokens cannot be guessed, and scrypt's cost is not free.
  Behind a proxy in `serve.trusted_proxies` the client is the one its X-Forwarded-For names last, so
  one guesser does not lock out everyone behind the proxy. Every refused token costs one scrypt,
  whatever was wrong with it, and is written to the audit trail with its address.
- A request with two `Authorization` headers is refused (400): which one a proxy passes on is not ours to guess.
- A state-changing request (POST, DELETE) must also be same-origin (its Origin and Sec-Fetch-Site, when
  sent, say so) and JSON, a file upload, or empty: a page elsewhere cannot drive a session through
  the user's browser.
- No CORS headers are ever sent.
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
import hmac
import ipaddress
import logging
import math
import os
import threading
import time
from dataclasses import dataclass, field
from typing import NamedTuple

from starlette.requests import Request

from taskweaver_lite.config.settings import ServeConfig
from taskweaver_lite.errors import ConfigError, StoreError
from taskweaver_lite.store.interface import Actor, AuditEntry, Store, User
from taskweaver_lite.store.users import token_id
from taskweaver_lite.web.enrolment import admitted, enrol
from taskweaver_lite.web.sign_in import SignIns

LOOPBACK = frozenset({"127.0.0.1", "::1", "localhost"})
TOKEN_ENV = "TASKWEAVER_LITE_TOKEN"
COOKIE = "twl_sign_in"
USERS_TTL_SECONDS = 2.0  # how long the list of users is trusted before the store is asked again
FAILURE_WINDOW_SECONDS = 60.0
_log = logging.getLogger(__name__)
NEEDS_A_USER = "This server needs your user's token: send `Authorization: Bearer <token>`, or sign in on the page."
NEEDS_THE_TOKEN = "This server needs a token: send `Authorization: Bearer <token>`, or sign in on the page."
NO_USERS_LEFT = (
    "This server has no users (none added yet, or none left), so every request is refused: an administrator adds one with `taskweaver-lite users add NAME`."
)


class Refusal(NamedTuple):
    """Why a request is refused: its HTTP status and one line; `retry_after` for a 429; `bad_token` when it counts as a guess."""

    status: int
    message: str
    retry_after: int | None = None
    bad_token: bool = False


Network = ipaddress.IPv4Network | ipaddress.IPv6Network


@dataclass(frozen=True)
class Proxies:
    """The proxies in front of the server: the TCP peers whose forwarding headers are believed, and the header that names the user."""

    networks: tuple[Network, ...] = ()  # addresses are networks of one
    user_header: str | None = None  # lower case; None: no header names a user

    def forwarded(self, request: Request) -> bool:
        """Whether the request's TCP peer itself is one of the proxies (an address listed, or within a network listed)."""
        try:
            address = ipaddress.ip_address(peer(request))
        except ValueError:
            return False
        return any(address in network for network in self.networks)

    def client_address(self, request: Request) -> str:
        """The client's address: the peer's, or behind a trusted proxy the last one its X-Forwarded-For names."""
        forwarded_for = request.headers.get("x-forwarded-for", "")
        if self.forwarded(request) and forwarded_for.strip():
            return forwarded_for.rsplit(",", 1)[-1].strip()
        return peer(request)

    def is_https(self, request: Request) -> bool:
        """Whether the client reached us over TLS: the request's own scheme, or a trusted proxy's X-Forwarded-Proto."""
        if request.url.scheme == "https":
            return True
        return self.forwarded(request) and request.headers.get("x-forwarded-proto", "").strip().lower() == "https"


def proxies(settings: ServeConfig) -> Proxies:
    """The proxies `serve.trusted_proxies` lists, and the user header `serve.trusted_user_header` names (None when off)."""
    header = settings.trusted_user_header.lower() if settings.trusted_user_header else None
    return Proxies(tuple(ipaddress.ip_network(entry, strict=False) for entry in settings.trusted_proxies), header)


def peer(request: Request) -> str:
    """The TCP peer's address, as the socket gave it (uvicorn runs without its proxy-header rewrite: connections.py)."""
    return request.client.host if request.client is not None else ""


class FailedTokens:
    """Tokens refused per client address within the last minute; past `limit`, that address's new tokens wait out the minute.

    A token that has passed a check before is never held back: a user sharing an address (a proxy,
    a NAT, one machine) with someone guessing keeps working; only tokens not yet seen wait.
    """

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._times: dict[str, collections.deque[float]] = {}
        self._proven: set[str] = set()  # sha256 of tokens that passed (never the token)
        self._lock = threading.Lock()

    def held_back(self, address: str, token: str) -> int | None:
        """Seconds before `token` from `address` is checked; None when it may be now (under the limit, or a token that passed before)."""
        if not token:
            return None
        with self._lock:
            if hashlib.sha256(token.encode()).hexdigest() in self._proven:
                return None
        return self.wait(address)

    def passed(self, token: str) -> None:
        """`token` was found good: it is never held back."""
        with self._lock:
            if len(self._proven) > 10_000:
                self._proven.clear()
            self._proven.add(hashlib.sha256(token.encode()).hexdigest())

    def wait(self, address: str) -> int | None:
        """Seconds `address` must wait before it is heard again; None when it may go on."""
        now = time.monotonic()
        with self._lock:
            times = self._times.get(address)
            while times and times[0] <= now - FAILURE_WINDOW_SECONDS:
                times.popleft()
            if not times:
                self._times.pop(address, None)
                return None
            if len(times) < self._limit:
                return None
            return max(1, math.ceil(times[0] + FAILURE_WINDOW_SECONDS - now))

    def failed(self, address: str) -> None:
        """One more token refused from `address`."""
        with self._lock:
            if len(self._times) > 100_000:  # a flood of addresses: forget them rather than grow without end
                self._times.clear()
            self._times.setdefault(address, collections.deque()).append(time.monotonic())


@dataclass(frozen=True)
class Roster:
    """The store's users by name, and whether it has ever had any."""

    by_name: dict[str, User]
    had_users: bool

    @property
    def in_force(self) -> bool:
        """Whether requests must name a user: the store has users, or had them (the last removed leaves every request refused)."""
        return bool(self.by_name) or self.had_users


@dataclass
class Users:
    """The store's users, looked up per request (their list cached briefly; tokens checked every time)."""

    store: Store
    proxies: Proxies = field(default_factory=Proxies)
    sign_ins: SignIns | None = None
    settings: ServeConfig | None = None  # auto_add_users, trusted_groups_header, allowed_groups, admin_groups
    _cached: tuple[float, Roster | None] = (0.0, None)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def known(self) -> Roster | None:
        """The users as last read, while that is under USERS_TTL_SECONDS old; None when the store must be asked again."""
        with self._lock:
            at, roster = self._cached
        return roster if time.monotonic() - at < USERS_TTL_SECONDS else None

    def roster(self) -> Roster:
        """Every user by name, and whether the store has had any (at most USERS_TTL_SECONDS old)."""
        roster = self.known()
        if roster is not None:
            return roster
        roster = Roster({user.name: user for user in self.store.users()}, self.store.had_users())
        with self._lock:
            self._cached = (time.monotonic(), roster)
        return roster

    def identify(self, request: Request) -> User | Refusal:
        """The request's user, or why it is refused (a token the store does not know: 401)."""
        header = self.proxies.user_header
        if header is not None and header in request.headers:
            return self._named_by_proxy(request, header)
        bearer = _bearer(request)
        if bearer:
            user = self.store.user_for_token(bearer)
            if user is None:
                return Refusal(401, "This token is not valid here: send your own user's token as `Authorization: Bearer <token>`.", bad_token=True)
        else:
            signed_in = self.sign_ins.found(request.cookies.get(COOKIE, "")) if self.sign_ins is not None else None
            user = signed_in.user if signed_in is not None else None
            if user is None:
                return Refusal(401, NEEDS_A_USER)
        if user.expired():
            return Refusal(401, expired_token(user))
        return user

    def _named_by_proxy(self, request: Request, header: str) -> User | Refusal:
        if not self.proxies.forwarded(request):
            return Refusal(403, f"The {header} header is only believed from serve.trusted_proxies; this request came from {peer(request) or 'nowhere known'}.")
        values = request.headers.getlist(header)
        if len(values) != 1:
            return Refusal(400, f"The {header} header came {len(values)} times: the proxy must send it once.")
        name = values[0].strip()
        named = self.roster().by_name.get(name)
        settings = self.settings
        groups_header = settings.trusted_groups_header.lower() if settings is not None and settings.trusted_groups_header else None
        if settings is None or (named is None and not settings.auto_add_users) or (named is not None and not (groups_header and settings.admin_groups)):
            if named is None:
                return Refusal(
                    401, f"The user named by {header} is not known here: add them with `taskweaver-lite users add NAME` (or set serve.auto_add_users)."
                )
            return named
        # serve.auto_add_users, or admins decided by the proxy's groups: the user is enrolled as single sign-on does.
        sent = request.headers.getlist(groups_header) if groups_header else []
        if len(sent) > 1:
            return Refusal(400, f"The {groups_header} header came {len(sent)} times: the proxy must send it once.")
        groups = [group.strip() for group in sent[0].split(",") if group.strip()] if sent else []
        admission = admitted(
            name, groups=groups, allowed_groups=settings.allowed_groups if named is None else (), admin_groups=settings.admin_groups if groups_header else ()
        )
        if isinstance(admission, str):
            return Refusal(403, admission)
        enrolled = enrol(self.store, admission, by=Actor(f"proxy:{header}", peer(request)))
        if isinstance(enrolled, str):
            return Refusal(403, enrolled)
        return enrolled


@dataclass(frozen=True)
class Access:
    """The server's rule: the one token every request needs (None on loopback without one), or each user's own (`users`)."""

    token: str | None
    users: Users | None = None
    public: bool = False  # bound to an address other machines reach
    proxies: Proxies = field(default_factory=Proxies)
    failures: FailedTokens = field(default_factory=lambda: FailedTokens(ServeConfig().failed_token_limit))
    sign_in_hours: float = ServeConfig().sign_in_hours
    sign_ins: SignIns | None = None  # None until the server has its store and key (with_users)
    sso_label: str = ""  # the sign-in page's single sign-on button (serve.oidc.label); "": none

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

    def with_users(self, store: Store, *, settings: ServeConfig, sign_ins: SignIns) -> Access:
        """This rule, with the store's users taking over once it has any, and `settings`' proxies, sign-ins and limit on refused tokens."""
        trusted = proxies(settings)
        return Access(
            self.token,
            users=Users(store, trusted, sign_ins, settings),
            public=self.public,
            proxies=trusted,
            failures=FailedTokens(settings.failed_token_limit),
            sign_in_hours=settings.sign_in_hours,
            sign_ins=sign_ins,
            sso_label=settings.oidc.label if settings.oidc is not None else "",
        )

    @property
    def uses_tokens(self) -> bool:
        """Whether the page needs a sign-in: one token, or users."""
        return self.token is not None or self.users is not None

    def users_in_force(self) -> bool:
        """Whether requests name users (as last known, without asking the store): what the sign-in page speaks of."""
        roster = self.users.known() if self.users is not None else None
        return roster.in_force if roster is not None else self.token is None

    async def check(self, request: Request) -> Refusal | None:
        """Why `request` is refused; None when it may go on, its user (if any) in its scope."""
        sent = len(request.headers.getlist("authorization"))
        if sent > 1:
            return Refusal(400, f"The Authorization header came {sent} times: send it once.")
        address = self.proxies.client_address(request)
        bearer = _bearer(request)
        wait = self.failures.held_back(address, bearer)
        if wait is not None:
            return too_many_refused(address, wait)
        refused = await self._identified(request)
        if refused is not None and refused.bad_token:
            self.failures.failed(address)
            await asyncio.to_thread(self.audit, AuditEntry(at=time.time(), actor="-", action="token-refused", target=_token_name(bearer), source=address))
        elif refused is None and bearer:
            self.failures.passed(bearer)
        return refused

    def audit(self, entry: AuditEntry) -> None:
        """Append `entry` to the store's audit trail; while the store is down, a warning in the log instead (the request is not held up)."""
        if self.users is None:
            return
        try:
            self.users.store.audit(entry)
        except StoreError as exc:
            _log.warning("audit entry not stored (%s %s %s from %s): %s", entry.actor, entry.action, entry.target, entry.source, " ".join(str(exc).split()))

    async def still_allowed(self, request: Request) -> bool:
        """Whether the credential `request` came with still holds (an event stream asks this while it runs): not removed, replaced or run out."""
        if self.users is not None:
            try:
                found = await asyncio.to_thread(self._identify, request)
            except StoreError:
                return True  # the store is down: the stream says so and waits, it does not judge the token meanwhile
            before = request.scope.get("state", {}).get("user")
            if found is not None:
                return isinstance(found, User) and before is not None and found.id == before.id
        return self.problem(request) is None

    async def _identified(self, request: Request) -> Refusal | None:
        roster = self.users.known() if self.users is not None else None
        if self.users is not None and (roster is None or roster.in_force):  # users, or not known lately: the store is asked off the loop
            try:
                found = await asyncio.to_thread(self._identify, request)
            except StoreError as exc:
                _log.warning("users cannot be checked: %s", " ".join(str(exc).split()))
                return Refusal(503, "The session store cannot be reached, so users cannot be checked; try again shortly.")
            if isinstance(found, Refusal):
                return found
            if found is not None:
                request.scope.setdefault("state", {})["user"] = found
                return _same_origin(request)
        if COOKIE in request.cookies:  # a sign-in is looked up in the store: off the loop
            return await asyncio.to_thread(self.problem, request)
        return self.problem(request)

    def _identify(self, request: Request) -> User | Refusal | None:
        """The request's user when users are in force; None when the store never had any (one-token or loopback rules apply)."""
        assert self.users is not None
        roster = self.users.roster()
        if not roster.by_name:
            if roster.had_users or (self.token is None and self.public):  # every user removed since: refused, not open
                return Refusal(401, NO_USERS_LEFT)
            return None
        return self.users.identify(request)

    def sign_in(self, offered: str) -> tuple[str, str] | None:
        """The page's sign-in cookie for a valid token (naming a sign-in good for `sign_in_hours`, never the token) and who signed in; None for any other."""
        assert self.sign_ins is not None, "a server's Access gets its sign-ins from with_users"
        if self.users is not None and self.users.roster().in_force:
            user = self.users.store.user_for_token(offered)
            if user is None or user.expired():
                return None
            return self.sign_ins.make(user_id=user.id, token_id=str(token_id(offered))), user.name
        if self.token is not None and hmac.compare_digest(offered.encode(), self.token.encode()):
            return self.sign_ins.make(user_id=None, token_id=self._token_digest()), "-"
        return None

    def sign_in_user(self, user: User, *, via: str) -> str:
        """A sign-in cookie for `user`, whom another way than a token proved (OpenID Connect, `via`)."""
        assert self.sign_ins is not None and self.users is not None
        current = self.users.store.token_id_of(user.name)
        if current is None:
            raise StoreError(f"the user {user.name} was removed while signing in")
        return self.sign_ins.make(user_id=user.id, token_id=current, via=via)

    def problem(self, request: Request) -> Refusal | None:
        """Why `request` is refused under the one-token and loopback rules; None when it may go on."""
        if self.token is None and _host_name(request) not in LOOPBACK:
            # Without a token only this machine's own names: a site whose name is re-pointed at
            # 127.0.0.1 (DNS rebinding) would otherwise pass as same-origin.
            return Refusal(403, "This server answers to 127.0.0.1, localhost and [::1] only (start it with a token to serve other names).")
        if self.token is not None:
            bearer = _bearer(request)
            if bearer and not hmac.compare_digest(bearer.encode(), self.token.encode()):
                return Refusal(401, "This token is not the server's: send `Authorization: Bearer <token>` with the one it was started with.", bad_token=True)
            if not bearer and not self._signed_in(request):
                return Refusal(401, NEEDS_THE_TOKEN)
        return _same_origin(request)

    def _signed_in(self, request: Request) -> bool:
        """Whether the request's cookie names a sign-in made with the server's one token (this one: a server started with another refuses it)."""
        value = request.cookies.get(COOKIE, "")
        try:
            found = self.sign_ins.found(value) if self.sign_ins is not None and value else None
        except StoreError:
            return False
        return found is not None and found.user_id is None and hmac.compare_digest(found.token_id, self._token_digest())

    def _token_digest(self) -> str:
        """What a sign-in keeps of the server's one token: enough to tell it from another, nothing that opens anything."""
        assert self.token is not None
        return hashlib.sha256(b"taskweaver-lite one token " + self.token.encode()).hexdigest()[:32]


def too_many_refused(address: str, wait: int) -> Refusal:
    """The 429 an address gets once it has had too many tokens refused."""
    return Refusal(429, f"Too many refused tokens from {address}: try again in {wait} s (a token that worked here before is not held back).", retry_after=wait)


def expired_token(user: User) -> str:
    """The one line a request with an expired token gets."""
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(user.expires_at or 0))
    return f"The token of {user.name} expired on {when}: ask an administrator for a new one (taskweaver-lite users rotate {user.name})."


def _token_name(bearer: str) -> str:
    """What the audit keeps of a refused token: its public id when it has one, never its secret."""
    if not bearer:
        return ""
    ident = token_id(bearer)
    return f"token {ident}" if ident is not None else "a token of no user's form"


def _bearer(request: Request) -> str:
    header = request.headers.get("authorization", "")
    return header[7:].strip() if header.lower().startswith("bearer ") else ""


def same_origin_link(request: Request) -> str | None:
    """Why the sign-in link (`GET /?token=`) is refused: followed from another site (login CSRF); None when it was opened from outside any site.

    A browser says where a navigation came from in Sec-Fetch-Site: `none` for an address typed, pasted or opened
    from a terminal, `same-origin` from the page itself. Anything else, or a browser that does not say, is refused.
    """
    if request.headers.get("sec-fetch-site", "") in ("none", "same-origin"):
        return None
    return "This sign-in link was followed from another site, so it is not used: paste the token below, or open the link yourself."


def same_origin_form(request: Request) -> Refusal | None:
    """A sign-in or sign-out form from another site is refused (a form's own body type is allowed)."""
    return _same_origin(request, form=True)


def _same_origin(request: Request, *, form: bool = False) -> Refusal | None:
    """A state-changing request from another site, or with a body a form could send, is refused."""
    if request.method in ("POST", "PUT", "DELETE", "PATCH"):
        origin = request.headers.get("origin")
        if origin is not None and origin != _own_origin(request):
            return Refusal(403, "Requests from other sites are refused.")
        if request.headers.get("sec-fetch-site", "same-origin") not in ("same-origin", "none"):
            return Refusal(403, "Requests from other sites are refused.")
        kind = request.headers.get("content-type", "").split(";")[0].strip()
        empty = not kind and request.headers.get("content-length", "0") == "0"
        allowed = ("application/x-www-form-urlencoded",) if form else ("application/json", "multipart/form-data")
        if not empty and kind not in allowed:
            return Refusal(415, "Send JSON (Content-Type: application/json), a multipart file upload, or no body.")
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
