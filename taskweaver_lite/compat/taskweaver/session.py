"""What the session lends a TaskWeaver role class: its event emitter and post proxy, logger, tracing, model and metadata.

These are the objects `injector` hands a role besides its config (compat/taskweaver/api.py):

- `SessionEventEmitter` and its `PostEventProxy`: the reply post built piece by piece; a status
  update is the session's progress line for the role;
- `TelemetryLogger` (Python logging) and `Tracing` (accepted, not recorded: no spans are kept);
- `LLMApi.chat_completion`: the role's own model (`<role>.llm` over `llm`), counted with the session's calls;
- `SessionMetadata`: the session's id and working folder.

What TaskWeaver has and this does not raises `NotProvided`, one line saying what to port to our
`reply(request, tools)` and where the example is.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar

from taskweaver_lite.compat.taskweaver.memory import Attachment, AttachmentType, Post
from taskweaver_lite.records.model_calls import Message

PORTING_DOC = "docs/taskweaver-roles.md, 'Porting to reply()'"
F = TypeVar("F", bound=Callable[..., Any])


class NotProvided(Exception):
    """A part of TaskWeaver's API a role used that is not provided here; `str()` says what to port."""

    def __init__(self, what: str) -> None:
        super().__init__(f"TaskWeaver's {what} is not provided here: port that part of the role to reply(request, tools) ({PORTING_DOC})")


class TelemetryLogger:
    """The role's logger: Python logging under `taskweaver_lite.roles.<name>`."""

    def __init__(self, name: str) -> None:
        self.logger = logging.getLogger(f"taskweaver_lite.roles.{name}")

    def info(self, msg: str, *args: Any, **kwargs: Any) -> None:
        """Log at INFO."""
        self.logger.info(msg, *args, **kwargs)

    def warning(self, msg: str, *args: Any, **kwargs: Any) -> None:
        """Log at WARNING."""
        self.logger.warning(msg, *args, **kwargs)

    def error(self, msg: str, *args: Any, **kwargs: Any) -> None:
        """Log at ERROR."""
        self.logger.error(msg, *args, **kwargs)

    def debug(self, msg: str, *args: Any, **kwargs: Any) -> None:
        """Log at DEBUG."""
        self.logger.debug(msg, *args, **kwargs)

    def telemetry_logging(self, telemetry_log_message: str, telemetry_log_content: dict[str, Any]) -> None:
        """Telemetry goes to the log as a plain line (nothing is sent anywhere)."""
        self.logger.info("%s %s", telemetry_log_message, telemetry_log_content)


class _NoSpan:
    """A tracer and span that record nothing."""

    def __enter__(self) -> _NoSpan:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def start_as_current_span(self, span_name: str) -> _NoSpan:
        return self

    def set_attribute(self, key: str, value: Any) -> None:
        return None

    def set_status(self, status_code: Any, status_message: str | None = None) -> None:
        return None

    def record_exception(self, exception: BaseException) -> None:
        return None


class Tracing:
    """TaskWeaver's tracing calls, accepted and not recorded (this program keeps no OpenTelemetry spans)."""

    @staticmethod
    def set_span_status(status_code: str, status_message: str | None = None) -> None:
        """Not recorded."""

    @staticmethod
    def set_span_attribute(key: str, value: Any) -> None:
        """Not recorded."""

    @staticmethod
    def set_span_exception(exception: BaseException) -> None:
        """Not recorded."""

    @staticmethod
    def add_prompt_size(size: int = 0, labels: dict[str, str] | None = None) -> None:
        """Not recorded (token counts are in /tokens and the store)."""

    @staticmethod
    def count_tokens(data: str) -> int:
        """0, as TaskWeaver's own answer when tracing is off."""
        return 0


def tracing_decorator(func: F) -> F:
    """The function as it is: spans are not recorded here."""
    return func


tracing_decorator_non_class = tracing_decorator


def get_tracer() -> _NoSpan:
    """A tracer that records nothing."""
    return _NoSpan()


class PostEventProxy:
    """Builds the role's reply post piece by piece, as TaskWeaver's post proxy does; `end()` returns it."""

    def __init__(self, emitter: SessionEventEmitter, round_id: str, post: Post) -> None:
        self.emitter, self.round_id, self.post = emitter, round_id, post
        self.message_is_end = False

    def update_send_to(self, send_to: str) -> None:
        """Address the post (the session sends it back to whoever asked, whatever this says)."""
        self.post.send_to = send_to

    def update_status(self, status: str) -> None:
        """Show what the role is doing (the session's progress line)."""
        self.emitter.status(status)

    def update_message(self, message: str, is_end: bool = True) -> None:
        """Add text to the post's message."""
        if self.message_is_end:
            raise ValueError("the post's message was already ended (update_message(..., is_end=True) came before)")
        self.post.message += message
        self.message_is_end = is_end

    def update_attachment(self, message: str, type: AttachmentType | None = None, extra: Any = None, id: str | None = None, is_end: bool = True) -> Attachment:
        """Add an attachment, or (with the `id` of the last one) add text to it."""
        if id is not None:
            attachment = self.post.attachment_list[-1]
            attachment.content += message
            attachment.extra = extra
            return attachment
        if type is None:
            raise ValueError("update_attachment needs a type for a new attachment")
        attachment = Attachment.create(type=type, content=message, extra=extra)
        self.post.add_attachment(attachment)
        return attachment

    def error(self, msg: str) -> None:
        """Make the post an error message, its attachments dropped."""
        self.post.attachment_list = []
        self.post.message = msg

    def end(self, msg: str = "") -> Post:
        """The finished post."""
        return self.post


class SessionEventEmitter:
    """The session's events as a role sees them: the running round, and post proxies for its replies."""

    def __init__(self) -> None:
        self.current_round_id: str | None = None
        self.on_status: Callable[[str], None] = lambda status: None  # the session's progress line, set per request

    def start_round(self, round_id: str) -> None:
        """The round a reply belongs to (the session sets it before each request)."""
        self.current_round_id = round_id

    def end_round(self, round_id: str) -> None:
        """The round is over."""
        self.current_round_id = None

    def create_post_proxy(self, send_from: str) -> PostEventProxy:
        """A proxy building a new post from `send_from`."""
        if self.current_round_id is None:
            raise ValueError("create_post_proxy is called inside reply(), while a round runs")
        return PostEventProxy(self, self.current_round_id, Post.create(message="", send_from=send_from))

    def status(self, status: str) -> None:
        """Pass a role's status line on to the session's progress display."""
        self.on_status(status)

    def emit_error(self, msg: str) -> None:
        """An error the role reports: shown as its status."""
        self.on_status(msg)

    @contextmanager
    def handle_events_ctx(self, handler: Any = None) -> Iterator[None]:
        """Event handlers are the session's here: a role's own are not called."""
        yield


ChatMessageType = dict[str, Any]


def format_chat_message(role: str, message: str, image_urls: list[str] | None = None, name: str | None = None) -> ChatMessageType:
    """A chat message as TaskWeaver writes one (images are not passed on to the model here)."""
    if image_urls:
        raise NotProvided("format_chat_message with image_urls (images in a role's own model call)")
    msg: ChatMessageType = {"role": role, "content": message}
    if name is not None:
        msg["name"] = name
    return msg


@dataclass
class LLMApi:
    """The role's model: `chat_completion(messages)` calls `<role>.llm` (over `llm`), counted with the session's calls."""

    complete: Callable[[Sequence[Message], int | None], str]

    def chat_completion(
        self,
        messages: list[ChatMessageType],
        stream: bool = True,
        temperature: float | None = None,
        max_tokens: int | None = None,
        top_p: float | None = None,
        stop: list[str] | None = None,
        llm_alias: str | None = None,
        **kwargs: Any,
    ) -> ChatMessageType:
        """The model's answer as `{"role": "assistant", "content": text}`."""
        if llm_alias:
            raise NotProvided(f"LLMApi.chat_completion(llm_alias={llm_alias!r}) (set the role's model with <role>.llm instead)")
        sent = [Message(role=_chat_role(m), content=_text(m.get("content"))) for m in messages]
        return {"role": "assistant", "content": self.complete(sent, max_tokens)}

    def chat_completion_stream(self, messages: list[ChatMessageType], **kwargs: Any) -> Generator[ChatMessageType, None, None]:
        """The whole answer as one piece."""
        yield self.chat_completion(messages, **kwargs)

    def get_embedding(self, string: str) -> list[float]:
        """Not provided."""
        raise NotProvided("LLMApi.get_embedding")

    def get_embedding_list(self, strings: list[str]) -> list[list[float]]:
        """Not provided."""
        raise NotProvided("LLMApi.get_embedding_list")


def _chat_role(message: Mapping[str, Any]) -> Any:
    role = message.get("role")
    if role not in ("system", "user", "assistant"):
        raise NotProvided(f"a chat message with role {role!r}")
    return role


def _text(content: Any) -> str:
    """A message's text: TaskWeaver's list form ([{type: text, text: ...}]) joined."""
    if isinstance(content, list):
        if any(part.get("type") != "text" for part in content):
            raise NotProvided("a chat message with images (images in a role's own model call)")
        return "\n".join(str(part.get("text", "")) for part in content)
    return str(content or "")


@dataclass
class SessionMetadata:
    """The session's ids and folders, as TaskWeaver names them."""

    session_id: str
    workspace: str
    execution_id: str = ""
    session_dir: str = ""
    execution_cwd: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
