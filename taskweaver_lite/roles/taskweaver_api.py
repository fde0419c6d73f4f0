"""What TaskWeaver's role API hands a role class, so that a role written for TaskWeaver runs unchanged.

A TaskWeaver role subclasses `taskweaver.role.Role`, is built by the `injector` package with its
config (a `RoleConfig` subclass reading `<role>.<key>` settings), a logger, tracing, the session's
event emitter, its `RoleEntry` and, when it asks, the `LLMApi`; its `reply(memory)` returns a
`Post`, usually from `event_emitter.create_post_proxy(alias)`. This module holds those pieces:

- `AppConfigSource`/`ModuleConfig`/`RoleConfig`: a role's settings read as TaskWeaver reads them,
  from the role's section of the project config (`echo: {decorator: "**"}`, or TaskWeaver's JSON
  `"echo.decorator"`), then the environment (`ECHO_DECORATOR`), then the default;
- `Role`, `RoleEntry`; `SessionEventEmitter` and its `PostEventProxy`;
- `TelemetryLogger` (Python logging) and `Tracing` (no spans: tracing is not kept here);
- `LLMApi.chat_completion`: the role's own model (`<role>.llm`), counted like any call.

What TaskWeaver has and this does not (experience and example loading for a custom role, shared
memory entries, extra LLM aliases, embeddings) raises `NotProvided`, one line saying what to port
to our `reply(request, tools)`. `roles/taskweaver_role.py` registers these under TaskWeaver's
module names and runs the role.
"""

from __future__ import annotations

import inspect
import logging
import os
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from taskweaver_lite.llm.client import Message
from taskweaver_lite.roles.taskweaver_memory import Attachment, AttachmentType, Memory, Post

PORTING_DOC = "docs/taskweaver-roles.md, 'Porting to reply()'"
F = TypeVar("F", bound=Callable[..., Any])


class NotProvided(Exception):
    """A part of TaskWeaver's API a role used that is not provided here; `str()` says what to port."""

    def __init__(self, what: str) -> None:
        super().__init__(f"TaskWeaver's {what} is not provided here: port that part of the role to reply(request, tools) ({PORTING_DOC})")


def injectable(init: F) -> F:
    """`injector.inject(init)` when the package is installed (TaskWeaver's roles are built by it), else `init` as it is."""
    try:
        from injector import inject
    except ImportError:
        return init
    injected: F = inject(init)
    return injected


class AppConfigSource:
    """The settings a role's config reads: the project config's role sections, then the environment, then the default."""

    def __init__(self, values: Mapping[str, Any], *, app_base_path: Path) -> None:
        self.values = dict(values)  # dotted keys: "echo.decorator"
        self.app_base_path = str(app_base_path)
        self.module_base_path = str(app_base_path)
        self.read: set[str] = set()  # the keys a role asked for

    def _value(self, key: str, default: Any, required: bool = True) -> Any:
        self.read.add(key)
        if self.values.get(key) is not None:
            return self.values[key]
        env = os.environ.get(key.upper().replace(".", "_"))  # TaskWeaver's rule: echo.decorator -> ECHO_DECORATOR
        if env is not None:
            return None if env.lower() in ("null", "none", "nil") else env
        if default is None and required:
            section, _, name = key.rpartition(".")
            env_name = key.upper().replace(".", "_")
            raise ValueError(f"the role needs the setting {key}: add `{section}: {{{name}: ...}}` to taskweaver_config.yaml (or set {env_name})")
        return default

    def get_str(self, key: str, default: str | None = None, required: bool = True) -> str:
        """A text setting."""
        value = self._value(key, default, required)
        return value if value is None else str(value)  # type: ignore[return-value]  # TaskWeaver returns None for an optional unset key

    def get_bool(self, key: str, default: bool | None = None, required: bool = True) -> bool:
        """A yes/no setting (true/false, yes/no, 1/0)."""
        value = self._value(key, default, required)
        if isinstance(value, bool) or value is None:
            return bool(value)
        words = {"true": True, "yes": True, "1": True, "false": False, "no": False, "0": False}
        if str(value).lower() not in words:
            raise ValueError(f"the setting {key} must be true or false, not {value!r}")
        return words[str(value).lower()]

    def get_int(self, key: str, default: int | None = None, required: bool = True) -> int:
        """A whole-number setting."""
        return int(self._value(key, default, required))

    def get_float(self, key: str, default: float | None = None, required: bool = True) -> float:
        """A number setting."""
        return float(self._value(key, default, required))

    def get_list(self, key: str, default: list[Any] | None = None, required: bool = True) -> list[Any]:
        """A list setting (a comma-separated text counts)."""
        value = self._value(key, default, required)
        return [part.strip() for part in value.split(",")] if isinstance(value, str) else list(value or [])

    def get_dict(self, key: str, default: dict[str, Any] | None = None, required: bool = True) -> dict[str, Any]:
        """A mapping setting."""
        return dict(self._value(key, default, required) or {})

    def get_enum(self, key: str, options: list[str], default: str | None = None, required: bool = True) -> str:
        """A setting that must be one of `options`."""
        value = self.get_str(key, default, required)
        if value not in options:
            raise ValueError(f"the setting {key} must be one of {', '.join(options)}, not {value!r}")
        return value

    def get_path(self, key: str, default: str | None = None, required: bool = True) -> str:
        """A path setting; TaskWeaver's `${AppBaseDir}` is the project folder."""
        value = self.get_str(key, default, required)
        return value if value is None else value.replace("${AppBaseDir}", self.app_base_path)


class ModuleConfig:
    """A config section: `_configure` reads `<name>.<key>` settings with the `_get_*` helpers."""

    @injectable
    def __init__(self, src: AppConfigSource) -> None:
        self.src = src
        self.name = ""
        self._configure()

    def _set_name(self, name: str) -> None:
        self.name = name

    def _config_key(self, key: str) -> str:
        return f"{self.name}.{key}" if self.name else key

    def _configure(self) -> None:
        pass

    def _get_str(self, key: str, default: str | None, required: bool = True) -> str:
        return self.src.get_str(self._config_key(key), default, required)

    def _get_enum(self, key: str, options: list[str], default: str | None, required: bool = True) -> str:
        return self.src.get_enum(self._config_key(key), options, default, required)

    def _get_bool(self, key: str, default: bool | None) -> bool:
        return self.src.get_bool(self._config_key(key), default)

    def _get_list(self, key: str, default: list[Any] | None) -> list[Any]:
        return self.src.get_list(self._config_key(key), default)

    def _get_dict(self, key: str, default: dict[str, Any] | None) -> dict[str, Any]:
        return self.src.get_dict(self._config_key(key), default)

    def _get_int(self, key: str, default: int | None) -> int:
        return self.src.get_int(self._config_key(key), default)

    def _get_float(self, key: str, default: float | None) -> float:
        return self.src.get_float(self._config_key(key), default)

    def _get_path(self, key: str, default: str | None) -> str:
        return self.src.get_path(self._config_key(key), default)


class RoleConfig(ModuleConfig):
    """A role's config: named after its file (`echo.py` reads `echo.*`), with TaskWeaver's experience and example switches."""

    @injectable
    def __init__(self, src: AppConfigSource) -> None:
        self.src = src
        self.name = os.path.basename(inspect.getfile(type(self))).split(".")[0]
        base = Path(src.app_base_path)
        self.use_experience = self._get_bool("use_experience", False)
        self.experience_dir = self._get_path("experience_dir", str(base / "experience"))
        self.dynamic_experience_sub_path = self._get_bool("dynamic_experience_sub_path", False)
        self.use_example = self._get_bool("use_example", False)
        self.example_base_path = self._get_path("example_base_path", str(base / "examples" / f"{self.name}_examples"))
        self.dynamic_example_sub_path = self._get_bool("dynamic_example_sub_path", False)
        self._configure()


@dataclass
class RoleEntry:
    """A role as its file declares it: name (the folder's), alias, class and intro."""

    name: str
    alias: str
    module: type
    intro: str


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

    def update_attachment(
        self, message: str, type: AttachmentType | None = None, extra: Any = None, id: str | None = None, is_end: bool = True
    ) -> Attachment:
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


class Role:
    """The base of a TaskWeaver role class: its config, logger, tracing, event emitter and entry; `reply(memory)` answers."""

    @injectable
    def __init__(
        self,
        config: ModuleConfig,
        logger: TelemetryLogger,
        tracing: Tracing,
        event_emitter: SessionEventEmitter,
        role_entry: RoleEntry | None = None,
    ) -> None:
        self.config: Any = config
        self.logger = logger
        self.tracing = tracing
        self.event_emitter = event_emitter
        self.role_entry = role_entry
        self.name = config.name
        if role_entry is not None and self.name != role_entry.name:
            raise ValueError(f"the role's config is named {self.name!r} (after its file) but its folder is {role_entry.name!r}: name them alike")
        self.alias = role_entry.alias if role_entry else ""
        self.intro = role_entry.intro if role_entry else ""
        self.experiences: list[Any] = []
        self.examples: list[Any] = []

    def get_intro(self) -> str:
        """The role's intro."""
        return self.intro

    def get_alias(self) -> str:
        """The role's alias."""
        return self.alias

    def set_alias(self, alias: str) -> None:
        """Change the alias."""
        self.alias = alias

    def reply(self, memory: Memory, **kwargs: Any) -> Post:
        """Every role class overrides this."""
        raise NotImplementedError("a TaskWeaver role class defines reply(self, memory, **kwargs)")

    def close(self) -> None:
        """Nothing to release."""

    def format_experience(self, template: str) -> str:
        """'' (experience for a custom role is not loaded here)."""
        if getattr(self.config, "use_experience", False):
            raise NotProvided("Role.format_experience (experience for a custom role)")
        return ""

    def role_load_experience(self, query: str, memory: Memory | None = None) -> None:
        """Nothing when experience is off; NotProvided when a role turns it on."""
        if getattr(self.config, "use_experience", False):
            raise NotProvided("Role.role_load_experience (experience for a custom role)")

    def role_load_example(self, role_set: set[str], memory: Memory | None = None) -> None:
        """Nothing when examples are off; NotProvided when a role turns them on."""
        if getattr(self.config, "use_example", False):
            raise NotProvided("Role.role_load_example (few-shot examples for a custom role)")
