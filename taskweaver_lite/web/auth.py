"""Who may use the server: loopback only by default; a token on every request anywhere else.

- Bound to 127.0.0.1 (or ::1, localhost) no token is needed, and only those host names are
  answered (a site re-pointed at 127.0.0.1 by DNS rebinding is refused); on any other address the
  server refuses to start without one (`--token` or TASKWEAVER_LITE_TOKEN).
- With a token, every request carries it: `Authorization: Bearer <token>` for API clients, or the
  `twl_token` cookie the page sets after `/?token=...` (an EventSource or an <img> sends no header).
- A state-changing request (POST) must also be same-origin (its Origin and Sec-Fetch-Site, when
  sent, say so) and JSON, a file upload, or empty: a page elsewhere cannot drive a session through
  the user's browser.
- No CORS headers are ever sent.
"""

from __future__ import annotations

import hmac
import os
from dataclasses import dataclass

from starlette.requests import Request

from taskweaver_lite.errors import ConfigError

LOOPBACK = frozenset({"127.0.0.1", "::1", "localhost"})
TOKEN_ENV = "TASKWEAVER_LITE_TOKEN"
COOKIE = "twl_token"


@dataclass(frozen=True)
class Access:
    """The server's rule: the token every request needs (None on loopback without one)."""

    token: str | None

    @classmethod
    def for_address(cls, host: str, token: str | None) -> Access:
        """The rule for a server bound to `host`; ConfigError when a non-loopback address has no token."""
        token = token or os.environ.get(TOKEN_ENV) or None
        if token is None and host not in LOOPBACK:
            raise ConfigError(
                f"serve --host {host} makes the sessions (and their code execution) reachable from other machines: "
                f"give a token with --token or the {TOKEN_ENV} environment variable, or bind to 127.0.0.1."
            )
        return cls(token)

    def problem(self, request: Request) -> tuple[int, str] | None:
        """Why `request` is refused (HTTP status, message); None when it may go on."""
        if self.token is None and _host_name(request) not in LOOPBACK:
            # Without a token only this machine's own names: a site whose name is re-pointed at
            # 127.0.0.1 (DNS rebinding) would otherwise pass as same-origin.
            return 403, "This server answers to 127.0.0.1, localhost and [::1] only (start it with a token to serve other names)."
        if self.token is not None and not self._has_token(request):
            return 401, "This server needs a token: send `Authorization: Bearer <token>`, or open the page as /?token=<token>."
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

    def _has_token(self, request: Request) -> bool:
        assert self.token is not None
        header = request.headers.get("authorization", "")
        offered = header[7:] if header.lower().startswith("bearer ") else request.cookies.get(COOKIE, "")
        return hmac.compare_digest(offered.encode(), self.token.encode())


def _host_name(request: Request) -> str:
    host = request.headers.get("host", "")
    if host.startswith("["):
        return host[1 : host.find("]")] if "]" in host else host
    return host.rsplit(":", 1)[0] if ":" in host else host


def _own_origin(request: Request) -> str:
    host = request.headers.get("host", "")
    return f"{request.url.scheme}://{host}"
