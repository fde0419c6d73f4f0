"""The scripted model: an OpenAI-compatible HTTP server on 127.0.0.1 that answers from scripts.

Tests and the offline demo point the real `openai` client at it, so every byte goes over the
same wire as with a real endpoint. It tells which role a request is for from the system message
(each role's prompt names it) and answers from that role's queue, then from its default responder; with neither
it answers HTTP 500 naming the role, so a test that runs out of script fails loudly.

A `Reply` can also misbehave the way real servers do: send a raw body (cut off, not JSON, an odd
completion), drip its body one byte at a time, answer with content parts, or add headers such
as `Retry-After`.

A request with `stream: true` is answered as a real server streams: `text/event-stream` chunks of
`Reply.chunk_chars` characters, `Reply.chunk_delay` seconds apart, reasoning first
(`reasoning_content`) when the reply has some, usage last when `stream_options.include_usage` asks,
then `data: [DONE]`. `Reply.cut_after` breaks the stream off mid-reply; `Reply.gate` holds it after
`gate_after` characters until the test sets the event. A raw body or an error is sent as it is.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Literal

ROLES = ("planner", "code_generator", "compression", "other")
_HOST = "127.0.0.1"

_ERROR_CODES = {
    400: ("invalid_request_error", "invalid_request_error"),
    401: ("invalid_request_error", "invalid_api_key"),
    403: ("invalid_request_error", "permission_denied"),
    404: ("invalid_request_error", "model_not_found"),
    429: ("requests", "rate_limit_exceeded"),
}


@dataclass(frozen=True)
class Reply:
    """One scripted answer: content for a 200, or an HTTP error; optionally slow or broken."""

    content: str = ""
    status: int = 200
    delay: float = 0.0
    finish_reason: str = "stop"
    error_message: str | None = None
    include_usage: bool = True
    # Sent as the whole body instead of a completion or an error (with `status`): cut-off or odd JSON.
    raw_body: str | None = None
    # Seconds between the body's bytes: a server that drips its reply.
    drip: float = 0.0
    # Sent as the message's content as a list of text parts instead of `content`.
    content_parts: tuple[str, ...] | None = None
    # Extra response headers (`Retry-After`...); they replace the 10 ms retry hint of errors.
    headers: Mapping[str, str] = field(default_factory=dict)
    # Streaming (requests with stream=true): the pieces, their pace, reasoning sent before the content.
    chunk_chars: int = 16
    chunk_delay: float = 0.0
    reasoning: str = ""
    # The stream breaks off (connection closed, no [DONE]) after this many content characters.
    cut_after: int | None = None
    # The stream waits for this event after `gate_after` content characters (tests watch the screen meanwhile).
    gate: threading.Event | None = None
    gate_after: int = 0
    # Called with each content piece right after it is sent (benchmarks time the way to the screen).
    on_sent: Callable[[str], None] | None = None
    # Called once a streamed reply has been sent whole: [DONE] is out, the body's end follows at once.
    on_finished: Callable[[], None] | None = None


Responder = Callable[[list[dict[str, Any]]], str | Reply]
Scripted = str | Reply | Responder


@dataclass(frozen=True)
class ScriptedRequest:
    """A request the server received, with the role it was taken for."""

    role: str
    messages: list[dict[str, Any]]
    body: dict[str, Any]


def detect_role(messages: Sequence[Mapping[str, Any]]) -> str:
    """Which role a chat request is for, read from its system message's schema words; a fold that opens
    with its role's own prompt asks for the summary in its last message."""
    if messages and "ConversationSummary" in _text_of(messages[-1].get("content")):
        return "compression"
    system = "\n".join(_text_of(m.get("content")) for m in messages if m.get("role") == "system")
    if "init_plan" in system:
        return "planner"
    if "reply_content" in system:
        return "code_generator"
    if "ConversationSummary" in system:
        return "compression"
    return "other"


def last_user_text(messages: Sequence[Mapping[str, Any]]) -> str:
    """The text of the last user message, for responders that react to what they were sent."""
    for message in reversed(messages):
        if message.get("role") == "user":
            return _text_of(message.get("content"))
    return ""


class ScriptedServer:
    """An OpenAI-compatible chat server in a daemon thread, answering from per-role scripts."""

    def __init__(
        self,
        *,
        model: str | None = None,
        api_key: str | None = None,
        port: int = 0,
        server_kind: Literal["openai", "llama.cpp", "vllm"] = "openai",
        refuses: Sequence[str] = (),
        slots: int = 4,
        forward: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
        token_ratio: float = 1.0,
        counts_at: str | None = None,
    ) -> None:
        """`server_kind`: how cached tokens are reported (OpenAI's usage details, or llama.cpp's `timings` and
        `GET /props`); `refuses`: request fields answered with HTTP 400 naming them, as a strict server does;
        `forward`: a real server sent each request too, whose reply's `usage` (and `timings`) replace the
        scripted reply's estimates (the scripted model still writes the text).

        The server counts prompts as a model's tokenizer would: o200k's tokens times `token_ratio` (OpenAI's
        framing of messages; ChatML's for `server_kind="llama.cpp"`, which also answers llama.cpp's `/tokenize`
        and `/apply-template` by that count, and for `"vllm"`, which answers vLLM's `/tokenize`).
        `counts_at`: a real llama.cpp server's root, asked those two instead."""
        self.model = model
        self.api_key = api_key
        self.port = port  # 0: any free port; a fixed one plays a local server on its default port
        self.server_kind = server_kind
        self.refuses = tuple(refuses)
        self.slots = slots
        self.forward = forward
        self.token_ratio = token_ratio
        self.counts_at = counts_at
        self._last_prompt: dict[str, str] = {}  # per prompt_cache_key or id_slot: the prompt its cache holds
        self._lock = threading.Lock()
        self._queues: dict[str, deque[Scripted]] = {role: deque() for role in ROLES}
        self._defaults: dict[str, Scripted] = {}
        self._requests: list[ScriptedRequest] = []
        self._stopping = threading.Event()
        self._httpd: _HTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """The base URL to give the client, ending in /v1."""
        if self._httpd is None:
            raise RuntimeError("the scripted server is not started; call start() or use it in a with block")
        return f"http://{_HOST}:{self._httpd.server_port}/v1"

    @property
    def requests(self) -> list[ScriptedRequest]:
        """Every request received so far, in order (retries included)."""
        with self._lock:
            return list(self._requests)

    def start(self) -> ScriptedServer:
        """Listen on a free port of 127.0.0.1 and serve in a daemon thread."""
        if self._httpd is not None:
            return self
        self._stopping.clear()
        self._httpd = _HTTPServer((_HOST, self.port), _Handler)
        self._httpd.scripted = self
        self._thread = threading.Thread(
            # A short poll keeps stop() quick: shutdown waits for the loop's next look at its flag.
            target=self._httpd.serve_forever,
            kwargs={"poll_interval": 0.02},
            name="scripted-model",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and cut open connections; slow replies still waiting give up at once."""
        if self._httpd is None:
            return
        self._stopping.set()
        self._httpd.shutdown()
        self._httpd.server_close()
        self._httpd.drop_connections()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._httpd = None
        self._thread = None

    def __enter__(self) -> ScriptedServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def enqueue(self, role: str, *replies: Scripted) -> None:
        """Queue answers for `role`, used first in, first out."""
        with self._lock:
            self._queue(role).extend(replies)

    def set_default(self, role: str, responder: Scripted) -> None:
        """Answer `role` with `responder` whenever its queue is empty."""
        self._queue(role)
        with self._lock:
            self._defaults[role] = responder

    def remaining(self, role: str) -> int:
        """How many queued answers for `role` are still unused."""
        with self._lock:
            return len(self._queue(role))

    def _queue(self, role: str) -> deque[Scripted]:
        if role not in self._queues:
            raise ValueError(f"unknown role {role!r}; the scripted server knows {', '.join(ROLES)}")
        return self._queues[role]

    def _record(self, request: ScriptedRequest) -> None:
        with self._lock:
            self._requests.append(request)

    def _next(self, role: str) -> Scripted | None:
        with self._lock:
            queue = self._queues[role]
            return queue.popleft() if queue else self._defaults.get(role)

    def _wait(self, seconds: float) -> None:
        self._stopping.wait(seconds)

    def tokens(self, text: str) -> int:
        """How many tokens this server's model makes of `text`: o200k's, times `token_ratio`."""
        return math.ceil(_o200k().count(text) * self.token_ratio - 1e-9) if text else 0

    def prompt_tokens(self, messages: list[dict[str, Any]]) -> int:
        """A prompt's tokens as this server counts them (its `usage.prompt_tokens`); with `counts_at`, that server's count."""
        if self.counts_at is not None:
            listed = [{"role": m.get("role"), "content": _text_of(m.get("content"))} for m in messages if isinstance(m, dict)]
            prompt = _post_json(f"{self.counts_at}/apply-template", {"messages": listed})["prompt"]
            return len(_post_json(f"{self.counts_at}/tokenize", {"content": prompt, "add_special": True, "parse_special": True})["tokens"])
        if self.server_kind in ("llama.cpp", "vllm"):
            return self.tokens(chatml(messages))
        return math.ceil(_o200k_prompt([m for m in messages if isinstance(m, dict)]) * self.token_ratio - 1e-9)

    def _cached_tokens(self, body: dict[str, Any], messages: list[dict[str, Any]]) -> int:
        """A prefix cache like a server's: the rough tokens this prompt shares with the last one of its key (or slot)."""
        text = "".join(f"<{m.get('role')}>{_text_of(m.get('content'))}" for m in messages)
        key = str(body.get("prompt_cache_key") or body.get("id_slot") or "")
        with self._lock:
            earlier, self._last_prompt[key] = self._last_prompt.get(key, ""), text
        return _common_prefix(text, earlier) // 4


def planner_reply(
    message: str,
    *,
    send_to: str = "CodeInterpreter",
    plan: str = "1. carry out the request",
    init_plan: str | None = None,
    current_plan_step: str | None = None,
) -> str:
    """A Planner reply in the contract's JSON."""
    response = {
        "init_plan": plan if init_plan is None else init_plan,
        "plan": plan,
        "current_plan_step": plan.splitlines()[0] if current_plan_step is None else current_plan_step,
        "send_to": send_to,
        "message": message,
    }
    return json.dumps({"response": response})


def code_reply(code: str, *, thought: str = "I will run this code.") -> str:
    """A CodeGenerator reply that runs `code`."""
    return json.dumps({"response": {"thought": thought, "reply_type": "python", "reply_content": code}})


def text_reply(text: str, *, thought: str = "No code is needed.") -> str:
    """A CodeGenerator reply that answers in text instead of code."""
    return json.dumps({"response": {"thought": thought, "reply_type": "text", "reply_content": text}})


def summary_reply(summary: str, variables: Sequence[Mapping[str, str]] | None = None) -> str:
    """A round-compression reply; without `variables`, the Planner's form that leaves them out."""
    data: dict[str, Any] = {"ConversationSummary": summary}
    if variables is not None:
        data["Variables"] = [dict(v) for v in variables]
    return json.dumps(data)


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    scripted: ScriptedServer

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler]) -> None:
        super().__init__(address, handler)
        self._connections: set[socket.socket] = set()
        self._connections_lock = threading.Lock()

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._connections_lock:
            self._connections.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        with self._connections_lock:
            self._connections.discard(request)
        super().shutdown_request(request)

    def drop_connections(self) -> None:
        """Cut kept-alive connections, so a stopped server looks down to clients that have one open."""
        with self._connections_lock:
            connections = list(self._connections)
        for connection in connections:
            with contextlib.suppress(OSError):  # already closed by the client
                connection.shutdown(socket.SHUT_RDWR)


class _Handler(BaseHTTPRequestHandler):
    server: _HTTPServer
    protocol_version = "HTTP/1.1"  # keep-alive, as the SDK's connection pool expects
    # Buffered, so headers and body leave in one segment: two small writes meet Nagle's algorithm
    # and the client's delayed ACK, which costs 40 ms a reply.
    wbufsize = -1

    def log_message(self, format: str, *args: Any) -> None:
        """Stay quiet: test output is for the tests."""

    def do_GET(self) -> None:
        scripted = self.server.scripted
        if not self._authorized(scripted):
            return
        if self.path.rstrip("/") == "/v1/models":
            name = scripted.model or "scripted-model"
            self._send_json(200, {"object": "list", "data": [_model_entry(name)]})
            return
        if self.path.rstrip("/") == "/props" and scripted.server_kind == "llama.cpp":
            self._send_json(200, {"total_slots": scripted.slots, "default_generation_settings": {}})
            return
        self._send_error(404, f"no route GET {self.path}", code="not_found")

    def do_POST(self) -> None:
        scripted = self.server.scripted
        try:
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length) or b"{}")
        except (ValueError, json.JSONDecodeError):
            self._send_error(400, "the request body is not JSON")
            return
        if not isinstance(body, dict):
            self._send_error(400, "the request body must be a JSON object")
            return
        if self.path.rstrip("/") in ("/tokenize", "/apply-template") and scripted.server_kind == "llama.cpp":
            self._count(scripted, self.path.rstrip("/"), body)
            return
        if self.path.rstrip("/") == "/tokenize" and scripted.server_kind == "vllm":
            if self._authorized(scripted):
                listed = body.get("messages")
                text = chatml(listed) if isinstance(listed, list) else str(body.get("prompt", ""))
                count = scripted.tokens(text)
                self._send_json(200, {"count": count, "max_model_len": 8192, "tokens": list(range(count))})
            return
        raw_messages = body.get("messages")
        messages: list[dict[str, Any]] = raw_messages if isinstance(raw_messages, list) else []
        role = detect_role(messages)
        scripted._record(ScriptedRequest(role=role, messages=messages, body=body))
        if not self._authorized(scripted):
            return
        if self.path.rstrip("/") != "/v1/chat/completions":
            self._send_error(404, f"no route POST {self.path}", code="not_found")
            return
        refused = next((name for name in scripted.refuses if name in body), None)
        if refused is not None:
            self._send_error(400, f"Unrecognized request argument supplied: {refused}")
            return
        if scripted.model is not None and body.get("model") != scripted.model:
            model = body.get("model")
            self._send_error(404, f"The model `{model}` does not exist or you do not have access to it.")
            return
        self._answer(scripted, role, messages, body)

    def _answer(self, scripted: ScriptedServer, role: str, messages: list[dict[str, Any]], body: dict[str, Any]) -> None:
        scripted_reply = scripted._next(role)
        if scripted_reply is None:
            asked = " ".join(last_user_text(messages).split())[:200]
            self._send_error(
                500,
                f"scripted server: no reply queued for role '{role}' and no default responder (last user message: {asked!r})",
            )
            return
        try:
            reply = scripted_reply(messages) if callable(scripted_reply) else scripted_reply
        except Exception as exc:  # noqa: BLE001 - a broken responder must fail the test, not hang it
            self._send_error(500, f"scripted server: the responder for role '{role}' raised {exc!r}")
            return
        if isinstance(reply, str):
            reply = Reply(content=reply)
        if not isinstance(reply, Reply):
            self._send_error(500, f"scripted server: the responder for role '{role}' returned {reply!r}, not a reply")
            return
        if reply.delay > 0:
            scripted._wait(reply.delay)
        if reply.raw_body is not None:
            self._send_body(reply.status, reply.raw_body.encode("utf-8"), reply)
        elif reply.status != 200:
            self._send_error(reply.status, reply.error_message or f"scripted HTTP {reply.status} for role '{role}'", reply=reply)
        else:
            number = len(scripted.requests)
            completion = _completion(reply, messages, model=body.get("model") or scripted.model, number=number, prompt_tokens=scripted.prompt_tokens(messages))
            if "usage" in completion and scripted.forward is not None:
                completion.update(scripted.forward(body))  # what a real server said of the same prompt
            elif "usage" in completion:
                _report_cache(completion, scripted._cached_tokens(body, messages), kind=scripted.server_kind)
            if body.get("stream"):
                options = body.get("stream_options")
                usage = isinstance(options, dict) and bool(options.get("include_usage"))
                self._stream(reply, completion, usage=usage)
            else:
                self._send_json(200, completion, reply)

    def _count(self, scripted: ScriptedServer, path: str, body: dict[str, Any]) -> None:
        """llama.cpp's `/apply-template` (ChatML) and `/tokenize` (as many token ids as the server counts), or a real server's."""
        if not self._authorized(scripted):
            return
        if scripted.counts_at is not None:
            self._send_json(200, _post_json(f"{scripted.counts_at}{path}", body))
        elif path == "/apply-template":
            messages = body.get("messages")
            self._send_json(200, {"prompt": chatml(messages if isinstance(messages, list) else [])})
        else:
            self._send_json(200, {"tokens": list(range(scripted.tokens(str(body.get("content", "")))))})

    def _authorized(self, scripted: ScriptedServer) -> bool:
        if scripted.api_key is None:
            return True
        given = (self.headers.get("Authorization") or "").removeprefix("Bearer ").strip()
        if given == scripted.api_key:
            return True
        self._send_error(401, "Incorrect API key provided.")
        return False

    def _send_error(self, status: int, message: str, *, code: str | None = None, reply: Reply | None = None) -> None:
        kind, default_code = _ERROR_CODES.get(status, ("server_error", "server_error"))
        error = {"message": message, "type": kind, "param": None, "code": code or default_code}
        self._send_json(status, {"error": error}, reply)

    def _send_json(self, status: int, payload: dict[str, Any], reply: Reply | None = None) -> None:
        self._send_body(status, json.dumps(payload).encode("utf-8"), reply)

    def _send_body(self, status: int, data: bytes, reply: Reply | None) -> None:
        headers = dict(reply.headers) if reply is not None else {}
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            named = {name.lower() for name in headers}
            if (status == 429 or status >= 500) and not named & {"retry-after", "retry-after-ms"}:
                # The SDK honours this, so retry tests wait 10 ms instead of its 0.5 s backoff.
                self.send_header("retry-after-ms", "10")
            for name, value in headers.items():
                self.send_header(name, value)
            self.end_headers()
            if reply is not None and reply.drip > 0:
                self._drip(data, reply.drip)
            else:
                self.wfile.write(data)
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up (its timeout) before the slow reply was ready

    def _stream(self, reply: Reply, completion: dict[str, Any], *, usage: bool) -> None:
        """Send `completion` as server-sent events, as paced, gated or cut as `reply` says.

        Chunked, on a connection kept alive for the next request, as OpenAI and vLLM send streams; a
        cut-off stream closes the connection before the last chunk, so the client sees a broken body.
        """
        try:
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # each chunk leaves at once
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            self.wfile.flush()
            for event in _stream_events(reply, completion, usage=usage, pause=self._pause):
                if event is None:
                    self.close_connection = True
                    return  # cut off: the connection closes without [DONE] and without the last chunk
                data = b"data: " + event.encode("utf-8") + b"\n\n"
                framed = b"%x\r\n%s\r\n" % (len(data), data)
                if reply.drip > 0:
                    self._drip(framed, reply.drip)
                else:
                    self.wfile.write(framed)
                self.wfile.flush()
                if reply.on_sent is not None and '"content": "' in event:
                    reply.on_sent(json.loads(event)["choices"][0]["delta"]["content"])
                if self.server.scripted._stopping.is_set():
                    self.close_connection = True
                    return
            if reply.on_finished is not None:
                reply.on_finished()  # before the body's last bytes: no client can be done reading first
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
            self._abandon_output()

    def _abandon_output(self) -> None:
        """The client left mid-stream: drop what is still buffered, or the handler's own last flush fails loudly."""
        broken, self.wfile = self.wfile, io.BytesIO()
        with contextlib.suppress(OSError):
            broken.close()

    def _pause(self, reply: Reply, sent: int) -> None:
        """The wait before the next content chunk: the reply's pace, and its gate once `gate_after` is reached."""
        scripted = self.server.scripted
        if reply.gate is not None and sent >= reply.gate_after:
            while not reply.gate.is_set() and not scripted._stopping.is_set():
                reply.gate.wait(0.05)
        if reply.chunk_delay > 0:
            scripted._wait(reply.chunk_delay)

    def _drip(self, data: bytes, interval: float) -> None:
        """Send `data` one byte every `interval` seconds, until done, the client leaves or the server stops."""
        scripted = self.server.scripted
        for offset in range(len(data)):
            self.wfile.write(data[offset : offset + 1])
            self.wfile.flush()
            scripted._wait(interval)
            if scripted._stopping.is_set():
                self.close_connection = True
                return


def _completion(reply: Reply, messages: list[dict[str, Any]], *, model: str | None, number: int, prompt_tokens: int) -> dict[str, Any]:
    """The chat completion a real server would send for `reply`."""
    content: str | list[dict[str, str]] = reply.content
    if reply.content_parts is not None:
        content = [{"type": "text", "text": part} for part in reply.content_parts]
    completion: dict[str, Any] = {
        "id": f"chatcmpl-scripted-{number}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model or "scripted-model",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": content},
                "finish_reason": reply.finish_reason,
                "logprobs": None,
            }
        ],
    }
    if reply.include_usage:
        prompt = prompt_tokens
        answer = _rough_tokens(_text_of(content))
        completion["usage"] = {"prompt_tokens": prompt, "completion_tokens": answer, "total_tokens": prompt + answer}
    return completion


def _stream_events(reply: Reply, completion: dict[str, Any], *, usage: bool, pause: Callable[[Reply, int], None]) -> Iterator[str | None]:
    """The `data:` payloads of a streamed `completion`; None where the stream is cut off."""
    base = {key: completion[key] for key in ("id", "created", "model")}
    base["object"] = "chat.completion.chunk"

    def chunk(delta: dict[str, Any], finish: str | None = None) -> str:
        return json.dumps({**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})

    yield chunk({"role": "assistant", "content": ""})
    size = max(1, reply.chunk_chars)
    for start in range(0, len(reply.reasoning), size):
        yield chunk({"reasoning_content": reply.reasoning[start : start + size]})
    parts = reply.content_parts if reply.content_parts is not None else (reply.content,)
    sent = 0
    for part in parts:
        for start in range(0, len(part), size):
            piece = part[start : start + size]
            if reply.cut_after is not None and sent + len(piece) > reply.cut_after:
                yield chunk({"content": piece[: reply.cut_after - sent]})
                yield None
                return
            pause(reply, sent)
            yield chunk({"content": piece})
            sent += len(piece)
    yield chunk({}, reply.finish_reason)
    if usage and "usage" in completion:
        timings = {"timings": completion["timings"]} if "timings" in completion else {}  # llama.cpp's last chunk
        yield json.dumps({**base, "choices": [], "usage": completion["usage"], **timings})
    yield "[DONE]"


def _report_cache(completion: dict[str, Any], cached: int, *, kind: str) -> None:
    """Say how many prompt tokens came from the cache, as OpenAI (usage details) or llama.cpp (`timings`) does."""
    prompt = completion["usage"]["prompt_tokens"]
    cached = min(cached, prompt)
    if kind == "llama.cpp":
        completion["timings"] = {"cache_n": cached, "prompt_n": prompt - cached}
    else:
        completion["usage"]["prompt_tokens_details"] = {"cached_tokens": cached}


def _common_prefix(a: str, b: str) -> int:
    """Characters `a` and `b` share from their start (a binary search on slices: C speed on long prompts)."""
    low, high = 0, min(len(a), len(b))
    while low < high:
        middle = (low + high + 1) // 2
        if a[:middle] == b[:middle]:
            low = middle
        else:
            high = middle - 1
    return low


def chatml(messages: Sequence[Any]) -> str:
    """`messages` in ChatML with the reply primed, as a llama.cpp server's template renders them."""
    turns = "".join(f"<|im_start|>{m.get('role')}\n{_text_of(m.get('content'))}<|im_end|>\n" for m in messages if isinstance(m, dict))
    return f"{turns}<|im_start|>assistant\n"


def _o200k() -> Any:
    from taskweaver_lite.llm.tokens import get_tokenizer

    return get_tokenizer("o200k_base")


def _o200k_prompt(messages: Sequence[dict[str, Any]]) -> int:
    """OpenAI's count of a chat prompt (o200k, three tokens around each message and three priming the reply)."""
    counter = _o200k()
    return int(sum(3 + counter.count(str(m.get("role", ""))) + counter.count(_text_of(m.get("content"))) for m in messages) + 3)


def _post_json(url: str, body: dict[str, Any]) -> Any:
    import urllib.request

    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(request, timeout=60) as response:
        return json.loads(response.read())


def _model_entry(name: str) -> dict[str, Any]:
    return {"id": name, "object": "model", "created": 0, "owned_by": "scripted"}


def _rough_tokens(text: str) -> int:
    """About four characters per token, enough for usage numbers that move the right way."""
    return (len(text) + 3) // 4


def _text_of(content: Any) -> str:
    """Message content as text, whether a string or a list of content parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return ""
