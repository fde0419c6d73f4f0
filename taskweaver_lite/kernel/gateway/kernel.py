"""One kernel on a Jupyter Kernel Gateway or Enterprise Gateway: its REST calls and its WebSocket.

The gateway's API is Jupyter Server's: `POST /api/kernels` starts a kernel, `.../interrupt` and
`.../restart` act on it, `DELETE` ends it, and `/api/kernels/<id>/channels` is a WebSocket that
carries the Jupyter messaging protocol as JSON (each message names its channel). Messages are
built with jupyter-client's `Session`; REST goes through requests, the socket through websocket-client.
Every failure becomes a `GatewayError` whose message names the gateway's address.
"""

from __future__ import annotations

import contextlib
import json
import secrets
import select
import socket
import ssl
from typing import Any

import requests
import websocket
from jupyter_client.jsonutil import json_default
from jupyter_client.session import Session

from taskweaver_lite.config.settings import KernelGatewayConfig
from taskweaver_lite.errors import GatewayAuthError, GatewayConnectionLost, GatewayError, GatewayUnreachableError, KernelLimitReached
from taskweaver_lite.kernel.gateway.provisioner import NAME as PROVISIONER_NAME
from taskweaver_lite.kernel.gateway.provisioner import SESSION_ROUTE

GONE = "gone"  # the state of a kernel the gateway no longer has (culled, or ended for its user's next one)
_TOKEN_HINT = "set execution.kernel_gateway.token, or KG_AUTH_TOKEN in this program's environment, to the token the gateway was started with"


class GatewayKernel:
    """A kernel started through a gateway's REST API and driven over its WebSocket channel."""

    def __init__(self, config: KernelGatewayConfig) -> None:
        """Prepare the HTTP client; nothing is sent until `start`."""
        self.config = config
        self.url = config.url
        headers = config.request_headers()
        self._headers = headers
        self._http = requests.Session()
        self._http.headers.update(headers)
        self._http.verify = config.validate_cert
        # One client session id for the kernel's lifetime: the gateway buffers our messages under it
        # while the socket is down and hands them over when we reconnect with the same id.
        # The key only signs wire frames, which we never build (the gateway frames for the kernel); any
        # non-empty one spares the log a warning about unsigned messages.
        self._messages = Session(key=secrets.token_bytes(16), username="taskweaver-lite")
        self.kernel_id: str | None = None
        self._socket: websocket.WebSocket | None = None

    def start(self, *, env: dict[str, str]) -> str:
        """Start a kernel on the gateway; returns its id."""
        body: dict[str, Any] = {}
        if self.config.kernel_name:
            body["name"] = self.config.kernel_name
        if env:
            body["env"] = env
        model = self._call("POST", "/api/kernels", "start a kernel", json=body).json()
        self.kernel_id = str(model["id"])
        return self.kernel_id

    def attach(self, kernel_id: str) -> bool:
        """Take over a kernel the gateway already runs (started by another replica); False when it has no such kernel."""
        self.kernel_id = kernel_id
        if self.exists():
            return True
        self.kernel_id = None
        return False

    def connect(self) -> None:
        """Open (or reopen) the WebSocket to the kernel's channels."""
        self.disconnect()
        address = "ws" + self.url.removeprefix("http") + f"{self._path()}/channels?session_id={self._messages.session}"
        options = {} if self.config.validate_cert else {"cert_reqs": ssl.CERT_NONE, "check_hostname": False}
        try:
            # Text frames are decoded as UTF-8 by `recv`, which refuses bad bytes all the same: the library's own
            # check, in pure Python, cost a replica a tenth of its CPU on a busy kernel's messages.
            self._socket = websocket.create_connection(
                address,
                header=[f"{k}: {v}" for k, v in self._headers.items()],
                timeout=self.config.connect_timeout,
                sslopt=options,
                skip_utf8_validation=True,
            )
        except websocket.WebSocketBadStatusException as exc:
            raise self._refused(exc.status_code, "open the kernel's channels") from exc
        except (OSError, websocket.WebSocketException) as exc:
            raise GatewayUnreachableError(f"Cannot open the kernel's channels at the kernel gateway {self.url} ({exc}).") from exc

    def disconnect(self) -> None:
        """Close the WebSocket, if open."""
        if self._socket is not None:
            self._socket.close()
            self._socket = None

    @property
    def connected(self) -> bool:
        """Whether the WebSocket is open."""
        return self._socket is not None and self._socket.connected

    def send(self, channel: str, msg_type: str, content: dict[str, Any]) -> str:
        """Send one message on `channel` ('shell', 'control'); returns its msg_id."""
        msg = self._messages.msg(msg_type, content)
        msg["channel"] = channel
        try:
            self._live_socket().send(json.dumps(msg, default=json_default))
        except (OSError, websocket.WebSocketException) as exc:
            self.disconnect()
            raise GatewayConnectionLost(f"The connection to the kernel gateway {self.url} dropped ({exc}).") from exc
        return str(msg["header"]["msg_id"])

    def execute(self, code: str, *, user_expressions: dict[str, str], silent: bool = False) -> str:
        """Send an execute_request; returns its msg_id."""
        content = {
            "code": code,
            "silent": silent,
            "store_history": not silent,
            "user_expressions": user_expressions,
            "allow_stdin": False,
            "stop_on_error": False,
        }
        return self.send("shell", "execute_request", content)

    def receive(self, timeout: float) -> dict[str, Any] | None:
        """The next message (None if none came within `timeout`); GatewayConnectionLost if the socket closed."""
        data = self._next_frame(timeout)
        if data is None:
            return None
        msg: dict[str, Any] = json.loads(data)
        return msg

    def drop_waiting(self) -> None:
        """Read and drop, unparsed, every message already waiting (what another replica's cells sent)."""
        while self.waiting():
            self._next_frame(self.config.connect_timeout)  # a frame that has begun to arrive is read whole

    def _next_frame(self, timeout: float) -> bytes | None:
        """The next message's bytes, None when none came within `timeout`.

        The gateway pings an open socket every 30 s (and drops one that never answers): a ping is
        answered as it is read, and then only a message already waiting is read on. Reading past a
        ping into the silence of an idle kernel would hold the next cell for the whole timeout.
        """
        sock = self._live_socket()
        sock.settimeout(timeout)
        _ack_at_once(sock)
        while True:
            try:
                opcode, data = sock.recv_data(control_frame=True)
            except websocket.WebSocketTimeoutException:
                return None
            except (OSError, websocket.WebSocketException) as exc:
                self.disconnect()
                raise GatewayConnectionLost(f"The connection to the kernel gateway {self.url} dropped ({exc or 'closed'}).") from exc
            if opcode == websocket.ABNF.OPCODE_CLOSE:
                self.disconnect()
                raise GatewayConnectionLost(f"The kernel gateway {self.url} closed the connection.")
            if opcode in (websocket.ABNF.OPCODE_TEXT, websocket.ABNF.OPCODE_BINARY):
                return bytes(data)
            if not self.waiting():  # a ping or a pong, and nothing after it yet
                return None

    def waiting(self) -> bool:
        """Whether a message is ready to read now (no wait; False when not connected)."""
        raw = self._socket.sock if self._socket is not None else None
        if raw is None:
            return False
        # TLS may hold decrypted bytes the OS no longer reports as readable.
        if isinstance(raw, ssl.SSLSocket) and raw.pending():
            return True
        return bool(select.select([raw], [], [], 0)[0])

    def interrupt(self) -> None:
        """Interrupt the running cell through the REST API."""
        self._call("POST", f"{self._path()}/interrupt", "interrupt the kernel")

    def restart(self) -> None:
        """Restart the kernel through the REST API (its variables go; the socket is reopened)."""
        self._call("POST", f"{self._path()}/restart", "restart the kernel")
        self.connect()

    def state(self) -> str:
        """The kernel's execution state as the gateway tracks it ('busy', 'idle', 'restarting'...; 'gone' if it has no such kernel; '' if unknown)."""
        try:
            answer = self._http.get(self.url + self._path(), timeout=self.config.connect_timeout)
            if answer.status_code == 404:
                return GONE
            return str(answer.json().get("execution_state") or "") if answer.status_code == 200 else ""
        except (requests.RequestException, ValueError, AttributeError):
            return ""

    def present(self) -> bool:
        """Whether the gateway still has our kernel: False when it answers that it has not; GatewayUnreachableError when it does not answer."""
        try:
            answer = self._http.get(self.url + self._path(), timeout=self.config.connect_timeout)
        except requests.RequestException as exc:
            raise GatewayUnreachableError(f"Cannot reach the kernel gateway {self.url} ({exc}); check that the gateway runs.") from exc
        if answer.status_code == 404:
            return False
        if answer.status_code >= 400:
            raise self._refused(answer.status_code, "find the session's kernel", answer.text)
        return True

    def exists(self) -> bool:
        """Whether the gateway still has our kernel."""
        try:
            return bool(self._http.get(self.url + self._path(), timeout=self.config.connect_timeout).status_code == 200)
        except requests.RequestException:
            return False

    def release(self) -> None:
        """Close our connections and leave the kernel running on the gateway (another replica attaches to it)."""
        self.disconnect()
        self.kernel_id = None
        self._http.close()

    def shutdown(self) -> None:
        """End the kernel on the gateway and close every connection; safe to call more than once."""
        self.disconnect()
        try:
            if self.kernel_id is not None:
                self._http.delete(self.url + self._path(), timeout=self.config.connect_timeout)
        except requests.RequestException:
            pass  # the gateway is gone: so is its kernel, or it will cull it
        finally:
            self.kernel_id = None
            self._http.close()

    def sandboxed(self) -> bool | None:
        """Whether the gateway is `taskweaver-lite gateway`: every kernelspec it lists names our sandbox's provisioner. None: it did not say."""
        try:
            answer = self._http.get(self.url + "/api/kernelspecs", timeout=self.config.connect_timeout)
            listing = answer.json() if answer.status_code == 200 else None
        except (requests.RequestException, ValueError):
            return None
        specs = listing.get("kernelspecs") if isinstance(listing, dict) else None
        if not isinstance(specs, dict) or not specs:
            return None
        return all(_provisioner_name(entry) == PROVISIONER_NAME for entry in specs.values())

    def remove_session(self, session_id: str) -> bool:
        """On `taskweaver-lite gateway`: end the session's kernels and remove its folder there. False from a gateway without that route."""
        try:
            answer = self._http.delete(self.url + SESSION_ROUTE + session_id, timeout=self.config.connect_timeout)
        except requests.RequestException:
            return False
        return answer.status_code == 204

    def _live_socket(self) -> websocket.WebSocket:
        if self._socket is None:
            raise GatewayConnectionLost(f"Not connected to the kernel gateway {self.url}.")
        return self._socket

    def _path(self) -> str:
        if self.kernel_id is None:
            raise GatewayError(f"No kernel was started on the kernel gateway {self.url}.")
        return f"/api/kernels/{self.kernel_id}"

    def _call(self, method: str, path: str, action: str, *, json: dict[str, Any] | None = None) -> requests.Response:
        try:
            response = self._http.request(method, self.url + path, json=json, timeout=self.config.connect_timeout)
        except requests.Timeout as exc:
            raise GatewayUnreachableError(
                f"The kernel gateway {self.url} did not answer within {self.config.connect_timeout:g} s (execution.kernel_gateway.connect_timeout)."
            ) from exc
        except requests.RequestException as exc:
            raise GatewayUnreachableError(
                f"Cannot reach the kernel gateway {self.url} ({exc}); check execution.kernel_gateway.url and that the gateway runs."
            ) from exc
        if response.status_code >= 400:
            raise self._refused(response.status_code, action, response.text)
        return response

    def _refused(self, status: int, action: str, body: str = "") -> GatewayError:
        reason = _reason(body)
        if status == 429 and reason:  # taskweaver-lite gateway: the user's kernels are at gateway.max_kernels_per_user
            return KernelLimitReached(reason)
        if status == 401 or (status == 403 and not _explained(body)):
            return GatewayAuthError(f"The kernel gateway {self.url} refused the token (HTTP {status}); {_TOKEN_HINT}.")
        return GatewayError(f"The kernel gateway {self.url} could not {action} (HTTP {status}{': ' + reason if reason else ''}).")


def _ack_at_once(sock: websocket.WebSocket) -> None:
    """Ask Linux to acknowledge the next packets at once rather than after its 40 ms delay.

    The gateway's WebSocket (tornado) leaves Nagle's algorithm on, so each of a cell's small
    messages waits for our acknowledgement of the one before: ~45 ms per `x = 1` instead of ~10.
    The flag does not stick, hence before every read.
    """
    if hasattr(socket, "TCP_QUICKACK") and sock.sock is not None:
        with contextlib.suppress(OSError):
            sock.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_QUICKACK, 1)


def _provisioner_name(entry: Any) -> str | None:
    """The provisioner a kernelspec listing's entry names (`spec.metadata.kernel_provisioner.provisioner_name`)."""
    for key in ("spec", "metadata", "kernel_provisioner", "provisioner_name"):
        entry = entry.get(key) if isinstance(entry, dict) else None
    return entry if isinstance(entry, str) else None


def _explained(body: str) -> bool:
    """Whether a 403's body gives the gateway's own reason (a start it refused), rather than a refused token's bare page."""
    try:
        data = json.loads(body)
    except ValueError:
        return False
    return isinstance(data, dict) and bool(data.get("message")) and data.get("reason") not in (None, "Forbidden")


def _reason(body: str) -> str:
    """The gateway's own explanation from a JSON error body (its `message` or `reason`)."""
    try:
        data = json.loads(body)
    except ValueError:
        return body.strip()[:200]
    if isinstance(data, dict):
        return str(data.get("message") or data.get("reason") or "")[:200]
    return ""
