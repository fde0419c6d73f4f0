"""The typed configuration: one object of typed sections, validated once (config/file.py reads it).

Every key has a default, so an empty file is a valid project. Settings that cannot hold together
(a gateway with a local sandbox, a role's window too small for its reserve) are refused here, with
the keys and the fix on one line.
"""

from __future__ import annotations

import hashlib
import ipaddress
import keyword
import math
import os
import tempfile
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

import yaml
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, SecretStr, ValidationError, field_validator, model_validator
from pydantic_core import ErrorDetails

from taskweaver_lite.config.sources import ConfigSources
from taskweaver_lite.errors import ConfigError

# Bounds on any YAML file of a project (config, examples, plugin specs): far above real ones.

MIN_PROMPT_TOKENS = 256  # below this not even a short system prompt and one request fit
# The reply reserve unless set: a quarter of the window, at most 4,096 (a plan or a cell's code) and
# at least 256. A fixed 4,096 gave an 8k model's replies half its window and made a 4k window unusable.
REPLY_RESERVE_SHARE = 4
MAX_DEFAULT_REPLY_RESERVE = 4_096
MIN_DEFAULT_REPLY_RESERVE = 256
# One cell's output gets an eighth of a role's prompt budget: at an 8k window (5,744-token budget)
# 718 tokens, enough for an error, its last frames and the output's head and tail.
OUTPUT_SHARE = 8
MIN_OUTPUT_TOKENS = 256
MAX_OUTPUT_TOKENS = 2_000

Strategy = Literal["round_compression", "sliding_window", "summary_buffer", "observation_masking", "none"]
FoldSchedule = Literal["rounds", "pressure"]
Structured = Literal["auto", "json_schema", "json_object", "off"]  # llm.structured (llm/structured.py says what each sends)
FoldPrompt = Literal["role", "separate"]


# No model accepts more than this; a bigger number is a typo (1e20) that would reach the wire as max_tokens.
MAX_CONTEXT_WINDOW = 10_000_000


class _Section(BaseModel):
    # inf and nan pass `gt=0` checks but make every timeout and budget meaningless.
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


class LLMConfig(_Section):
    """Where and how the chat model is called."""

    api_base: str | None = Field(None, description="the OpenAI-compatible endpoint (null: OPENAI_BASE_URL, a local server on 127.0.0.1, or api.openai.com)")
    api_key: SecretStr | None = Field(None, description="the key (null: OPENAI_API_KEY; a local endpoint needs none); never printed, logged or stored")
    model: str = Field("gpt-4o-mini", description="the model name the endpoint serves")
    context_window: int = Field(128_000, gt=256, le=MAX_CONTEXT_WINDOW, description="tokens the model really accepts: every prompt is budgeted against it")
    reply_reserve: int = Field(
        MAX_DEFAULT_REPLY_RESERVE,
        ge=16,
        lt=MAX_CONTEXT_WINDOW,
        description="tokens kept free for the model's reply (sent as max_tokens); unset: a quarter of context_window, at most 4,096",
    )
    margin: int = Field(256, ge=0, lt=MAX_CONTEXT_WINDOW, description="tokens kept free for counting differences (a template's seams, a ratio's spread)")
    structured: Structured = Field(
        "auto",
        description="replies constrained to each role's schema: auto (json_schema, stepping down to json_object, then to none, "
        "where the endpoint refuses), json_schema, json_object or off; json_mode is its older name (true: auto, false: off)",
    )
    # Read into `structured` before validation (`read_structured`): a key the files and --set still take, never kept or shown.
    json_mode: bool | None = Field(None, exclude=True, description="the older name of structured: true is auto, false is off")
    timeout: float = Field(120.0, gt=0, description="seconds a model call may take")
    max_retries: int = Field(2, ge=0, description="retries of a call that failed on the way (connection, 429, 5xx, a cut-off stream)")
    tokenizer: Literal["o200k_base", "cl100k_base"] = Field(
        "o200k_base", description="the offline tokenizer: OpenAI's models are counted with it, others with it times a calibrated ratio"
    )
    stream: bool = Field(True, description="stream replies (stream=true); false for endpoints that cannot")
    show_reasoning: bool = Field(True, description="show a model's reasoning (<think>, reasoning_content) dimmed while it streams")
    prompt_cache: Literal["auto", "off"] = Field(
        "auto", description="cache hints: prompt_cache_key, or llama.cpp's cache_prompt and id_slot; never a field the server refuses"
    )
    server_kind: Literal["auto", "openai", "llama.cpp", "vllm", "other"] = Field(
        "auto",
        description="the server's kind: which cache hints it takes and whether it counts prompts (auto: from the address, "
        "local discovery, its GET /props, or its replies)",
    )
    token_counting: Literal["auto", "calibrated", "tokenizer"] = Field(
        "auto",
        description="how prompts are counted: auto: by the server's tokenizer where it tells (llama.cpp, vLLM), else llm.tokenizer "
        "calibrated on the server's usage (OpenAI's models: llm.tokenizer); calibrated: never ask the server; tokenizer: llm.tokenizer alone",
    )
    vision: bool = Field(False, description="the model reads images: roles that require vision are off without it")

    @model_validator(mode="before")
    @classmethod
    def _json_mode_is_structured(cls, data: Any) -> Any:
        return read_structured(data)

    @model_validator(mode="before")
    @classmethod
    def _reserve_follows_the_window(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("reply_reserve") is None:
            window = data.get("context_window", cls.model_fields["context_window"].default)
            if isinstance(window, int) and not isinstance(window, bool):
                return {**data, "reply_reserve": default_reply_reserve(window)}
            return {key: value for key, value in data.items() if key != "reply_reserve"}  # a bad window: its own error
        return data

    @field_validator("api_base")
    @classmethod
    def _a_web_address(cls, value: str | None) -> str | None:
        # Caught here, a typo is a config error naming the key, not a connection failure minutes later.
        if value is not None and not value.startswith(("http://", "https://")):
            raise ValueError("expected an http:// or https:// address such as http://localhost:11434/v1")
        return value

    @model_validator(mode="after")
    def _room_for_a_prompt(self) -> LLMConfig:
        room = self.context_window - self.reply_reserve - self.margin
        if room < MIN_PROMPT_TOKENS:
            raise ValueError(
                f"context_window {self.context_window} leaves {room} tokens for the prompt after reply_reserve "
                f"{self.reply_reserve} and margin {self.margin}; it needs at least {MIN_PROMPT_TOKENS}: "
                "raise llm.context_window or lower llm.reply_reserve"
            )
        return self


class LLMOverrides(_Section):
    """A partial `llm` mapping for one role (`planner.llm`...): the keys given replace the top-level ones."""

    api_base: str | None = None
    api_key: SecretStr | None = None
    model: str | None = None
    context_window: int | None = None
    reply_reserve: int | None = None
    margin: int | None = None
    structured: Structured | None = None
    json_mode: bool | None = Field(None, exclude=True, description="the older name of structured: true is auto, false is off")
    timeout: float | None = None
    max_retries: int | None = None
    tokenizer: Literal["o200k_base", "cl100k_base"] | None = None
    stream: bool | None = None
    prompt_cache: Literal["auto", "off"] | None = None
    server_kind: Literal["auto", "openai", "llama.cpp", "vllm", "other"] | None = None
    token_counting: Literal["auto", "calibrated", "tokenizer"] | None = None
    vision: bool | None = None

    @model_validator(mode="before")
    @classmethod
    def _json_mode_is_structured(cls, data: Any) -> Any:
        return read_structured(data)


def read_structured(data: Any) -> Any:
    """An `llm` mapping with `structured: off` as YAML reads it (false) taken for "off", and the older `json_mode`
    read as `structured` (true: auto, false: off); both given must agree."""
    if not isinstance(data, dict):
        return data
    if isinstance(data.get("structured"), bool):
        data = {**data, "structured": "auto" if data["structured"] else "off"}  # YAML 1.1 reads a bare off (and on) as a boolean
    if "json_mode" not in data:
        return data
    data = dict(data)
    json_mode = data.pop("json_mode")
    if json_mode is None:
        return data
    if not isinstance(json_mode, bool):
        raise ValueError(f"json_mode must be true or false (it is the older name of structured: true is auto, false is off); got {json_mode!r}")
    wanted = "auto" if json_mode else "off"
    given = data.get("structured")
    if given is None:
        data["structured"] = wanted
    elif (given == "off") != (wanted == "off"):
        raise ValueError(
            f"json_mode: {str(json_mode).lower()} and structured: {given} disagree (json_mode is the older name of structured: "
            "true is auto, false is off); keep structured alone"
        )
    return data


# The part of a session that folds rounds; every role's section (`planner`, `code_generator`, a
# project role's) has its own `llm` overrides too.
FOLDER = "round_compressor"
# The part that distils a session into experience tips (/save), with its own `llm` overrides too.
DISTILLER = "experience"


def default_reply_reserve(context_window: int) -> int:
    """`llm.reply_reserve` when the config does not set it: a quarter of the window, within 256-4,096."""
    return max(MIN_DEFAULT_REPLY_RESERVE, min(MAX_DEFAULT_REPLY_RESERVE, context_window // REPLY_RESERVE_SHARE))


def merged_llm(base: LLMConfig, overrides: LLMOverrides) -> LLMConfig:
    """`base` with the keys `overrides` sets (checked as a whole, like the top-level `llm`).

    A role that sets its own context_window but no reply_reserve gets its window's default reserve
    when the top-level one was the default too."""
    given = overrides.model_dump(exclude_unset=True, exclude_none=True)
    if not given:
        return base
    data = base.model_dump()
    if "reply_reserve" not in given and base.reply_reserve == default_reply_reserve(base.context_window):
        del data["reply_reserve"]
    return LLMConfig.model_validate({**data, **given})


class RoleConfig(_Section):
    """One role's section: its model and its prompt history (strategy, compression, fold cadence)."""

    llm: LLMOverrides = Field(default_factory=LLMOverrides, description="this role's model: keys that replace llm's")
    rounds_to_compress: int | None = Field(None, ge=1, description="this role's round_compressor.rounds_to_compress (null: round_compressor's)")
    rounds_to_retain: int | None = Field(None, ge=0, description="this role's round_compressor.rounds_to_retain (null: round_compressor's)")

    prompt_compression: bool = Field(True, description="fold this role's older rounds by its strategy (false: its whole history, within its budget)")
    strategy: Strategy = Field(
        "round_compression",
        description="round_compression: older rounds folded into a summary; sliding_window: the latest rounds only; "
        "summary_buffer: a summary plus summary_buffer_rounds rounds; observation_masking: older rounds' outputs cut; none: every round",
    )
    fold_schedule: FoldSchedule = Field(
        "rounds",
        description="rounds: fold as rounds_to_compress + rounds_to_retain rounds gather (TaskWeaver's rule); "
        "pressure: fold all but the latest rounds_to_retain at once, only when the unfolded rounds pass fold_token_trigger",
    )
    fold_prompt: FoldPrompt = Field(
        "role",
        description="role: a fold call is the role's own prompt as last sent, cut after the rounds it folds, with the "
        "summary asked for in its last message (a server's prefix cache serves the rest); separate: a prompt of its own "
        "(compression_<role>.yaml), for a model that summarises better so; folds on another model than the role's are separate",
    )
    examples: Literal["until_history", "always"] = Field(
        "until_history",
        description="few-shot examples in every prompt, or only until the prompt shows a round of the role's own (which shows the reply format as well)",
    )


class RoleSectionConfig(RoleConfig):
    """The section of a role with no field of its own here (`echo:`, a project role's): ours keys, and the role's own.

    A key that is not one of ours is the role's own setting (TaskWeaver's `echo.decorator`): kept,
    and handed to the role with its file's options (`tools.options`, a TaskWeaver role's config).
    """

    model_config = ConfigDict(extra="allow", validate_assignment=True, allow_inf_nan=False)


class CodeGeneratorConfig(RoleConfig):
    """The CodeGenerator's settings: its prompt history, and which plugins its prompt shows."""

    auto_plugin_selection: bool = Field(False, description="show only the plugins most relevant to the current step (and those used before), not all")
    auto_plugin_selection_topk: int = Field(3, ge=1, description="how many plugins auto_plugin_selection shows")


class DocumentRetrieverConfig(RoleConfig):
    """The document_retriever role: which folder it searches and how much of it a reply quotes."""

    folder: str = Field("docs", description="the documents folder, relative to the project (or absolute)")
    top_k: int = Field(4, ge=1, le=50, description="the most passages a reply quotes")
    max_tokens: int = Field(700, ge=64, description="tokens a reply may take (also at most a sixth of the Planner's budget)")


class RoundCompressorConfig(_Section):
    """When and how old rounds fold into a summary."""

    rounds_to_compress: int = Field(2, ge=1, description="rounds folded into the summary at once")
    rounds_to_retain: int = Field(3, ge=0, description="the latest rounds kept as they were")
    fold_token_trigger: float = Field(
        0.6,
        ge=0,
        description="a share of the role's prompt budget (0-1; above 1: tokens): unfolded rounds past it fold early "
        "(rounds schedule, which uses at most 0.5) or fold at all (pressure schedule); 0: off",
    )
    summary_placement: Literal["system", "first_user"] = Field(
        "first_user",
        description="first_user: the summary and the variables in a user message after the examples, so a fold leaves "
        "the instructions cached; system: inside the system message",
    )
    retry_backoff: float = Field(30.0, ge=0, description="seconds before a failed fold is retried")
    summary_buffer_rounds: int = Field(10, ge=1, description="rounds kept verbatim by summary_buffer")
    max_summary_tokens: int = Field(1_500, ge=64, description="tokens a role's summary may take before a fold merges it into a shorter one")
    llm: LLMOverrides = Field(default_factory=LLMOverrides, description="the model that folds rounds: keys that replace llm's")


class SessionConfig(_Section):
    """One user turn, and the roles that take part in it."""

    roles: list[str] = Field(
        default_factory=lambda: ["planner", "code_interpreter"],
        description="the enabled roles by name: built-in ones, PROJECT_DIR/roles/<name>/, installed packages' (taskweaver-lite roles lists them)",
    )
    max_internal_hops: int = Field(10, ge=1, description="steps the Planner may delegate per request, to whichever role")
    max_repair_attempts: int = Field(3, ge=0, description="repair turns per round for bad replies")
    max_upload_bytes: int = Field(256 * 1024 * 1024, ge=1, description="largest file /load copies into the working folder; larger ones are refused")
    suggested_requests: list[str] = Field(
        default_factory=list,
        description="requests offered to a new session (the page lists them; the chat and the page take a request's number for it)",
    )
    state_dir: str | None = Field(
        None,
        description=(
            "where the program writes: sessions/ (each session's working folder), the SQLite store, caches (relative to the project); "
            "null: the project folder, or $XDG_STATE_HOME/taskweaver-lite/<project> when the project folder is read-only"
        ),
    )


# Code verification's defaults (safety/verification.py applies them): the analysis libraries and the standard
# library's harmless modules; the names that run code, open files or start processes.
DEFAULT_ALLOWED_MODULES = (
    "pandas", "numpy", "matplotlib", "scipy", "sklearn", "seaborn", "statsmodels", "math", "statistics", "datetime",
    "time", "json", "csv", "re", "collections", "itertools", "functools", "operator", "typing", "random", "decimal",
    "fractions", "string", "textwrap", "dataclasses", "enum", "warnings", "calendar", "zoneinfo", "io",
)  # fmt: skip
DEFAULT_BLOCKED_FUNCTIONS = (
    "eval", "exec", "execfile", "compile", "open", "input", "breakpoint", "globals", "locals", "vars", "__import__",
    "system", "popen", "Popen", "fork", "setsid",
)  # fmt: skip


class CodeInterpreterConfig(_Section):
    """Code writing, its retries, and the static check each cell passes before it runs (verification.py)."""

    max_retry_count: int = Field(3, ge=0, description="times the CodeGenerator revises a cell that failed before the Planner is told")
    code_verification_on: bool = Field(False, description="check each cell's syntax tree before it runs; a cell that breaks a rule is not run")
    allowed_modules: list[str] | None = Field(
        default_factory=lambda: list(DEFAULT_ALLOWED_MODULES), description="modules code may import ([]: none; null: any)"
    )
    blocked_functions: list[str] = Field(
        default_factory=lambda: list(DEFAULT_BLOCKED_FUNCTIONS), description="names code may not use, as a call, an alias or an attribute"
    )


class KernelGatewayConfig(_Section):
    """A Jupyter Kernel Gateway or Enterprise Gateway that runs the session's kernel instead of this machine."""

    url: str = Field(description="the gateway's base address, e.g. http://bigbox:8888")
    token: SecretStr | None = Field(
        None, description="the gateway's auth token, sent as `Authorization: token ...` (null: the KG_AUTH_TOKEN environment variable, as the gateway reads it)"
    )
    kernel_name: str | None = Field(None, description="the kernelspec to start (null: the gateway's default)")
    headers: dict[str, str] = Field(default_factory=dict, description="extra HTTP headers on every request (a proxy's auth)")
    validate_cert: bool = Field(True, description="check the gateway's TLS certificate (https:// and wss://)")
    connect_timeout: float = Field(20.0, gt=0, description="seconds to connect to the gateway and for each REST call")
    env: dict[str, str] = Field(default_factory=dict, description="KERNEL_* variables sent with the start request (KERNEL_WORKING_DIR, KERNEL_NAMESPACE, ...)")

    @field_validator("url")
    @classmethod
    def _a_web_address(cls, value: str) -> str:
        if not value.startswith(("http://", "https://")):
            raise ValueError("expected an http:// or https:// address such as http://bigbox:8888")
        return value.rstrip("/")

    def request_headers(self) -> dict[str, str]:
        """Every request's headers: `headers`, and the token (`token`, else KG_AUTH_TOKEN from the environment) when there is one."""
        token = self.token.get_secret_value() if self.token is not None else os.environ.get("KG_AUTH_TOKEN", "")
        return {**self.headers, "Authorization": f"token {token}"} if token else dict(self.headers)


class MountConfig(_Section):
    """A folder of this machine that the local kernel sees at its own path."""

    path: str = Field(description="an absolute path (~ is expanded) of a folder or file that exists")
    mode: Literal["ro", "rw"] = Field("ro", description="ro: the kernel reads it; rw: it may write there too")

    @field_validator("path")
    @classmethod
    def _an_existing_absolute_path(cls, value: str) -> str:
        path = os.path.expanduser(value)
        if not os.path.isabs(path):
            raise ValueError(f"{value!r} is not an absolute path: write it from the root, such as /data/sales or ~/Downloads")
        if not os.path.exists(path):
            raise ValueError(f"{path} does not exist on this machine")
        return os.path.normpath(path)


class ExecutionConfig(_Section):
    """The Jupyter kernel that runs generated code."""

    timeout: float = Field(120.0, gt=0, description="seconds a cell may run before it is interrupted (the kernel and its variables stay)")
    output_tokens: int | None = Field(None, ge=64, description="tokens of one cell's output kept for prompts (null: an eighth of the prompt budget, 256-2000)")
    allowed_env: list[str] = Field(default_factory=list, description="secret-looking env vars to pass")
    kernel_start_timeout: float = Field(60.0, gt=0, description="seconds the kernel may take to start and answer")
    display_width: int | None = Field(
        None, ge=40, description="characters per line for pandas in the kernel (null: the chat's terminal width, else pandas' 80)"
    )
    kernel_gateway: KernelGatewayConfig | None = Field(None, description="run the kernel on a Jupyter Kernel/Enterprise Gateway (null: locally)")
    sandbox: Literal["none", "bubblewrap", "auto"] = Field("auto", description="run the local kernel inside bubblewrap (auto: where bwrap is installed)")
    network: bool = Field(False, description="let the sandboxed kernel reach the network")
    memory_limit: int | str | None = Field(
        "50%",
        description="memory the kernel may use, all its processes together where it has a cgroup (each process's address space too): "
        "bytes, '4GB', '512MB', or a share of this machine's memory ('50%'); null: none",
    )
    cpu_limit: float | None = Field(None, gt=0, description="CPU cores the kernel may use, all its processes together (needs its cgroup); null: no cap")
    max_processes: int = Field(256, ge=8, description="processes and threads the kernel may run at once (in its cgroup; per uid in the sandbox)")
    cgroup: Literal["auto", "off"] = Field(
        "auto", description="give each kernel a cgroup of its own where this program may make one (root, or a delegated cgroup v2); off: never"
    )
    confirm: bool = Field(False, description="show each cell and wait for run / edit / skip (the chat on a terminal; an editor over ACP asks run / skip)")
    kernel: str | None = Field(
        None,
        description="the Python the local kernel runs on: null (this program's), an installed Jupyter kernelspec's name, "
        "or a Python interpreter's path (a conda env's or venv's bin/python with ipykernel)",
    )
    mounts: list[MountConfig] = Field(
        default_factory=list, description="folders the sandboxed kernel sees at their own path: paths (read-only), or {path, mode: ro|rw}"
    )
    syscall_filter: Literal["default", "off"] = Field(
        "default", description="the sandboxed kernel's seccomp filter (default: refuse namespaces, mounts, keyrings, bpf...; off: none)"
    )
    disk_limit: int | str | None = Field(
        None, description="what a session's cells may keep in its working folder in total: bytes, '100MB', '2GB'; null: no limit"
    )
    display_per_cell: int | str | None = Field(
        "20MB", description="images one cell may keep (plots and other displays, saved and stored): bytes, '20MB'; null: no cap"
    )
    display_per_session: int | str | None = Field("500MB", description="images a session's cells may keep in all: bytes, '500MB'; null: no cap")
    disk_limit_files: int | None = Field(
        100_000, ge=100, description="with disk_limit: the most files and folders a session's cells may keep, however small; null: no cap"
    )

    @field_validator("mounts", mode="before")
    @classmethod
    def _paths_or_mappings(cls, value: Any) -> Any:
        # A bare path is the common case: read-only.
        return [{"path": item} if isinstance(item, str) else item for item in value] if isinstance(value, list) else value

    @field_validator("memory_limit")
    @classmethod
    def _a_size(cls, value: int | str | None) -> int | str | None:
        if value is not None:
            size_in_bytes(value)  # raises ValueError with the accepted forms
        return value

    def memory_limit_bytes(self) -> int | None:
        """`memory_limit` in bytes (None: no limit)."""
        return None if self.memory_limit is None else size_in_bytes(self.memory_limit)

    @field_validator("disk_limit", "display_per_cell", "display_per_session")
    @classmethod
    def _a_disk_size(cls, value: int | str | None) -> int | str | None:
        if value is not None:
            disk_bytes(value)  # raises ValueError with the accepted forms
        return value

    def disk_limit_bytes(self) -> int | None:
        """`disk_limit` in bytes (None: no limit)."""
        return None if self.disk_limit is None else disk_bytes(self.disk_limit)

    def display_caps(self) -> tuple[int | None, int | None]:
        """`display_per_cell` and `display_per_session` in bytes (None: no cap)."""
        cell, session = (None if value is None else disk_bytes(value) for value in (self.display_per_cell, self.display_per_session))
        return cell, session

    @model_validator(mode="before")
    @classmethod
    def _renamed_keys(cls, data: Any) -> Any:
        if isinstance(data, dict) and "output_budget" in data:
            raise ValueError(
                "output_budget (characters per output field) was replaced by output_tokens (tokens per cell, all "
                "fields together; leave it out to scale it with llm.context_window): rename or remove the key"
            )
        return data


_UNITS = {"": 1, "B": 1, "KB": 1024, "MB": 1024**2, "GB": 1024**3, "TB": 1024**4}
MIN_MEMORY_LIMIT = 256 * 1024**2  # below this not even Python with pandas starts


def size_in_bytes(value: int | str) -> int:
    """Bytes from 4294967296, '4GB', '512 MB' or '50%' (of this machine's memory); ValueError otherwise."""
    text = str(value).strip().upper()
    if text.endswith("%"):
        share = float(text[:-1])
        if not 0 < share <= 100:
            raise ValueError("a share of memory must be between 0% and 100%, such as 50%")
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        size = int(total * share / 100)
    else:
        size = _bytes(text, expected="a size such as 4GB, 512MB, a number of bytes, or a share such as 50%")
    if size < MIN_MEMORY_LIMIT:
        raise ValueError("at least 256MB: below that the kernel cannot start (null for no limit)")
    return size


MIN_DISK_LIMIT = 1024**2  # below a megabyte not even a plot fits


def disk_bytes(value: int | str) -> int:
    """Bytes from 104857600, '100MB' or '2GB' (a disk has no share of memory); ValueError otherwise."""
    size = _bytes(str(value).strip().upper(), expected="a size such as 100MB, 2GB or a number of bytes")
    if size < MIN_DISK_LIMIT:
        raise ValueError("at least 1MB (null for no limit)")
    return size


def _bytes(text: str, *, expected: str) -> int:
    """`text` (upper case) as bytes: a number with an optional unit (KB, MB, GB, TB: powers of 1024)."""
    number = text.rstrip("KMGTB ").strip()
    unit = text[len(number) :].strip()
    if unit not in _UNITS or not number.replace(".", "", 1).isdigit():
        raise ValueError(f"expected {expected}")
    return int(float(number) * _UNITS[unit])


class StoreConfig(_Section):
    """Where sessions are kept: the project's SQLite file, or a PostgreSQL database for a team (`url`)."""

    path: str = Field("sessions.db", description="the SQLite store, relative to the project (or absolute)")
    url: SecretStr | None = Field(
        None, description="postgresql://USER:PASSWORD@HOST:PORT/DB keeps everything there, for several servers (null: the SQLite file at path)"
    )
    pool_size: int = Field(10, ge=1, le=200, description="connections each server keeps open to the PostgreSQL store at most")
    record_prompts: bool = Field(False, description="also store each model call's whole prompt and reply (large; for studying prompts)")

    @field_validator("url")
    @classmethod
    def _a_postgresql_url(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and not value.get_secret_value().startswith(("postgresql://", "postgres://")):
            raise ValueError("expected a postgresql://USER:PASSWORD@HOST:PORT/DB address (or null for the project's SQLite file)")
        return value


class ExperienceConfig(_Section):
    """Tips from earlier sessions (`/save`) and handcrafted ones (`PROJECT_DIR/experience/*.yaml`), shown to the Planner and the CodeGenerator."""

    enabled: bool = Field(True, description="show the tips that fit each request (false: none are retrieved; /save and /experience still work)")
    top_k: int = Field(3, ge=1, le=20, description="the most tips a prompt shows")
    max_tokens: int = Field(400, ge=32, description="tokens the tips may take in a prompt (also at most an eighth of the role's budget)")
    llm: LLMOverrides = Field(default_factory=LLMOverrides, description="the model that distils a session into tips (/save): keys that replace llm's")


class EvalModelConfig(_Section):
    """A model `taskweaver-lite eval` calls besides the agent's: its `llm` keys replace the project's."""

    llm: LLMOverrides = Field(default_factory=LLMOverrides, description="keys that replace llm's (default: the project's model)")


class EvalConfig(_Section):
    """`taskweaver-lite eval`: the examiner that plays the user, the judge that marks scoring points."""

    examiner: EvalModelConfig = Field(default_factory=EvalModelConfig)
    judge: EvalModelConfig = Field(default_factory=EvalModelConfig)
    max_rounds: int = Field(60, ge=1, description="user requests per case at most, unless the case sets max_rounds")


class OidcConfig(_Section):
    """Sign-in with an OpenID Connect provider (`serve.oidc`): authorization code with PKCE; a first allowed sign-in adds the user."""

    issuer: str = Field(description="the provider's issuer URL (its /.well-known/openid-configuration is read), e.g. https://accounts.google.com")
    client_id: str = Field(min_length=1, description="this service's client id at the provider")
    client_secret: SecretStr | None = Field(None, description="its client secret (null: a public client, PKCE alone)")
    allowed_domains: list[str] = Field(
        default_factory=list, description="email domains that may sign in (the verified `email` claim's part after @); empty: any"
    )
    allowed_groups: list[str] = Field(default_factory=list, description="groups (the `groups` claim) of which a user must be in one to sign in; empty: any")
    admin_groups: list[str] = Field(
        default_factory=list,
        description="groups whose members are admins (checked at each sign-in: promoted or demoted to match); empty: admins are set by hand",
    )
    scopes: list[str] = Field(
        default_factory=lambda: ["openid", "email", "profile"], description="the scopes asked for (add the one your provider sends groups with)"
    )
    groups_claim: str = Field("groups", description="the claim that lists the user's groups")
    name_claim: str = Field("email", description="the claim whose value is the user's name here (email, preferred_username)")
    redirect_url: str | None = Field(
        None, description="the callback's address as the browser reaches it (https://HOST/oidc/callback); null: made from the request"
    )
    label: str = Field("single sign-on", description="what the sign-in page's button names, e.g. Google or Okta")

    @field_validator("issuer")
    @classmethod
    def _a_url(cls, value: str) -> str:
        if not value.startswith(("https://", "http://")):
            raise ValueError("expected the provider's issuer URL, such as https://accounts.example.org")
        return value.rstrip("/")


class ServeConfig(_Section):
    """`taskweaver-lite serve` as one of several replicas on one PostgreSQL store (see docs/team.md)."""

    single_replica: bool = Field(
        False, description="true: this is the only serve on its PostgreSQL store, so its kernels may run on this machine (no execution.kernel_gateway)"
    )
    lease_timeout: float = Field(
        15.0, ge=1, le=30, description="seconds a replica that stopped answering (killed, cut off) keeps its running sessions before another takes them"
    )
    lease_wait: float = Field(30.0, ge=0, description="seconds a request waits for the previous one of its session to finish its bookkeeping (folds)")
    drain_timeout: float = Field(60.0, ge=0, description="on SIGTERM: seconds running requests get to finish before they are cut short")
    hot_sessions: int = Field(
        100, ge=1, description="sessions a replica keeps in memory between requests at most (the least recently used idle one goes first)"
    )
    hot_session_idle: float = Field(
        300.0,
        ge=1,
        description="seconds a replica keeps a session unused in memory, and its kernel's connection open; then it lets go (the gateway may cull the kernel)",
    )
    max_sessions_per_user: int | None = Field(
        None, description="sessions each user may have in the store, counted as made; past it, New hands back their unused one, else 429; null: no limit"
    )
    trusted_user_header: str | None = Field(
        None, description="a single sign-on proxy's header naming the user (X-Forwarded-User for oauth2-proxy); null: no header is believed"
    )
    trusted_proxies: list[str] = Field(
        default_factory=list,
        description=(
            "the addresses or networks (CIDR) of the TCP peer itself that X-Forwarded-Proto, X-Forwarded-For and trusted_user_header are "
            "believed from: your TLS proxy's; empty: none, until set (behind TLS the sign-in cookie is then not Secure)"
        ),
    )
    max_request_bytes: int = Field(
        1_000_000, ge=1024, description="the largest request body in bytes other than a file upload (session.max_upload_bytes); a larger one gets 413"
    )
    header_timeout: float = Field(10.0, gt=0, description="seconds a client gets to send a request's headers; a slower one is disconnected")
    max_streams_per_user: int = Field(20, ge=1, description="event streams one user may hold open on one server at once; one more gets 429")
    failed_token_limit: int = Field(
        10, ge=1, description="tokens refused per client address in a minute before its requests get 429 (with Retry-After) for the rest of it"
    )
    sign_in_hours: float = Field(12.0, gt=0, description="hours a sign-in on the page lasts (its cookie); the user's token itself is never the cookie")
    sign_in_key_file: str | None = Field(
        None,
        description=(
            "the file holding the key that signs the page's sign-in cookies (32 bytes or more; never in the store): every replica "
            "must read the same one; null: sign-in.key in the state folder, made at first start"
        ),
    )
    oidc: OidcConfig | None = Field(None, description="sign-in with an OpenID Connect provider (see OidcConfig); null: tokens only")
    auto_add_users: bool = Field(
        False,
        description=(
            "with trusted_user_header: a user the proxy names who is not known yet is added (if allowed_groups lets them), "
            "unless they were removed; admin_groups decides who is an admin"
        ),
    )
    trusted_groups_header: str | None = Field(
        None,
        description="the proxy's header listing the user's groups, comma-separated (X-Forwarded-Groups for oauth2-proxy); believed as trusted_user_header is",
    )
    allowed_groups: list[str] = Field(default_factory=list, description="with auto_add_users: groups of which a new user must be in one; empty: any")
    admin_groups: list[str] = Field(
        default_factory=list, description="with trusted_groups_header: groups whose members are admins; empty: admins are set by hand"
    )
    metrics_token: SecretStr | None = Field(
        None, description="a token good for GET /metrics alone (a Prometheus scraper's), answered even while the store is down; null: a user's token"
    )

    @field_validator("trusted_proxies")
    @classmethod
    def _addresses_or_networks(cls, value: list[str]) -> list[str]:
        for entry in value:
            try:
                ipaddress.ip_network(entry.strip(), strict=False)
            except ValueError:
                raise ValueError(f"{entry!r} is not an IP address or a network (such as 10.0.0.5 or 172.28.0.0/24)") from None
        return [entry.strip() for entry in value]

    @field_validator("max_sessions_per_user", mode="before")
    @classmethod
    def _a_count_or_null(cls, value: Any) -> Any:
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ValueError("expected a whole number of sessions, 1 or more, or null for no limit")
        return value


class McpServerConfig(_Section):
    """One MCP server whose tools a session's cells call (`mcp.servers.NAME`); it runs inside the kernel, as its child."""

    command: list[str] = Field(min_length=1, description="the program and its arguments, e.g. [mcp-server-time] or [npx, -y, some-server]")
    env: dict[str, str] = Field(
        default_factory=dict, description="environment variables it gets besides the kernel's (secrets too: the kernel's code can read them)"
    )
    network: bool = Field(False, description="it needs the network: refused (shown as not started) while the kernel's sandbox has none (execution.network)")
    start_timeout: float = Field(60.0, gt=0, description="seconds it may take to start and list its tools")
    call_timeout: float = Field(120.0, gt=0, description="seconds one tool call may take (a cell's own timeout still applies)")

    @field_validator("command")
    @classmethod
    def _a_program(cls, value: list[str]) -> list[str]:
        if not value[0].strip():
            raise ValueError("the first item must name the program to run")
        return value


class McpConfig(_Section):
    """The Model Context Protocol: the MCP servers whose tools the CodeGenerator's code may call."""

    servers: dict[str, McpServerConfig] = Field(default_factory=dict, description="NAME: {command: [ARGV...], env: {...}}; a cell calls tool T as NAME.T(...)")
    session_idle_timeout: float = Field(
        300.0,
        ge=0,
        description=(
            "seconds `taskweaver-lite mcp` keeps a session open that no request uses; then it closes it (it stays stored), so that "
            "`chat --resume` or another host may open it, and its next ask resumes it; 0: kept until the host leaves"
        ),
    )
    max_open_sessions: int = Field(
        4,
        ge=1,
        le=64,
        description=(
            "sessions `taskweaver-lite mcp` keeps open at once, each with its kernel; to open another it closes the one used least "
            "recently (it stays stored), and while all are answering, an ask that needs another waits for one to finish"
        ),
    )

    @field_validator("servers")
    @classmethod
    def _python_names(cls, value: dict[str, McpServerConfig]) -> dict[str, McpServerConfig]:
        for name in value:
            if not name.isidentifier() or keyword.iskeyword(name):
                raise ValueError(f"{name!r} is not a Python name: a cell calls the server's tools as NAME.tool(...), so use letters, digits and _")
        return value


class TracingConfig(_Section):
    """Tracing with OpenTelemetry (the `tracing` extra): each request's model calls, cells and folds as spans, sent over OTLP/HTTP."""

    enabled: bool = Field(False, description="send a trace of every request (a chat message, an API message, an eval case's turn) to endpoint")
    endpoint: str | None = Field(
        None, description="the OTLP/HTTP receiver's base address, such as http://127.0.0.1:4318 (null: OTEL_EXPORTER_OTLP_ENDPOINT, else localhost:4318)"
    )
    content: bool = Field(False, description="also record prompts, replies, code and cell output in spans (off: names, token counts, outcomes, timings)")
    service_name: str | None = Field(None, description="the service.name spans carry (null: OTEL_SERVICE_NAME, else taskweaver-lite)")

    @field_validator("endpoint")
    @classmethod
    def _an_http_url(cls, value: str | None) -> str | None:
        if value is not None and not (value.startswith(("http://", "https://")) and urlsplit(value).hostname):
            raise ValueError("expected an http:// or https:// address such as http://127.0.0.1:4318, or null to read it from the environment")
        return value


class GatewayConfig(_Section):
    """`taskweaver-lite gateway`: the kernel gateway whose kernels run in this project's sandbox (see docs/team.md)."""

    root: str | None = Field(None, description="the folder holding the sessions' folders on the gateway's machine (null: PROJECT_DIR/gateway)")
    cull_idle_timeout: int = Field(
        3600, ge=0, description="seconds a kernel may sit idle before the gateway ends it (its session replays its cells next time); 0: never"
    )
    cull_interval: int = Field(60, ge=1, description="seconds between the gateway's looks for idle kernels")
    max_kernels_per_user: int | None = Field(
        8, ge=1, description="kernels the gateway runs at once for one user (KERNEL_USERNAME, sent by serve); one more is refused; null: no limit"
    )
    eviction_grace: float = Field(
        10.0,
        ge=0,
        description="seconds a kernel nobody holds must have been quiet before the gateway may end it to make room for its user's next one "
        "(max_kernels_per_user): a replica attaching to a kernel opens its channels within it",
    )


class AcpConfig(_Section):
    """`taskweaver-lite acp`: the agent an editor starts (see docs/editor.md)."""

    max_open_sessions: int = Field(
        4,
        ge=1,
        le=64,
        description=(
            "sessions `taskweaver-lite acp` keeps open at once, each with its kernel; to open another it closes the one idle longest "
            "(it stays stored and reopens when prompted), and while all are answering a session/new or session/load is refused"
        ),
    )


class Config(_Section):
    """Everything a session needs, validated."""

    llm: LLMConfig = Field(default_factory=LLMConfig)
    planner: RoleConfig = Field(default_factory=RoleConfig)
    code_generator: CodeGeneratorConfig = Field(default_factory=CodeGeneratorConfig)
    round_compressor: RoundCompressorConfig = Field(default_factory=RoundCompressorConfig)
    session: SessionConfig = Field(default_factory=SessionConfig)
    code_interpreter: CodeInterpreterConfig = Field(default_factory=CodeInterpreterConfig)
    execution: ExecutionConfig = Field(default_factory=ExecutionConfig)
    store: StoreConfig = Field(default_factory=StoreConfig)
    experience: ExperienceConfig = Field(default_factory=ExperienceConfig)
    document_retriever: DocumentRetrieverConfig = Field(default_factory=DocumentRetrieverConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    serve: ServeConfig = Field(default_factory=ServeConfig)
    mcp: McpConfig = Field(default_factory=McpConfig)
    acp: AcpConfig = Field(default_factory=AcpConfig)
    tracing: TracingConfig = Field(default_factory=TracingConfig)
    gateway: GatewayConfig = Field(default_factory=GatewayConfig)
    # The sections of roles that have no field here (`echo:`, a project role's), written at the top
    # level like `planner:`; load_config moves them here. Not a YAML key of its own.
    role_sections: dict[str, RoleSectionConfig] = Field(default_factory=dict, exclude=True)
    # Not a YAML key: where the project lives, filled in by load_config.
    project_dir: Path = Field(default=Path("project"), exclude=True)
    _notices: list[str] = PrivateAttr(default_factory=list)
    _sources: ConfigSources = PrivateAttr(default_factory=ConfigSources)
    _state_dir: Path | None = PrivateAttr(default=None)  # decided once: whether the project folder may be written

    @property
    def notices(self) -> list[str]:
        """What loading said besides errors (TaskWeaver keys that have no effect here), for the user once."""
        return self._notices

    @property
    def sources(self) -> ConfigSources:
        """Where the settings were read from, and each one's origin (set by load_config)."""
        return self._sources

    @sources.setter
    def sources(self, value: ConfigSources) -> None:
        self._sources = value

    @model_validator(mode="after")
    def _role_models_are_whole(self) -> Config:
        # Checked here, so a bad merge is reported against its section, not at the first call.
        sections = [name for name, info in type(self).model_fields.items() if _has_llm(info.annotation)]
        for user in (*sections, *self.role_sections):
            try:
                self.llm_for(user)
            except ValidationError as exc:
                problems = "; ".join(_merge_problem(e) for e in exc.errors())
                # The fix belongs in the role's section: point the message's key names there.
                problems = problems.replace(" llm.", f" {user}.llm.")
                raise ValueError(f"{user}.llm (over llm): {problems}") from None
        return self

    def role_section(self, key: str) -> RoleConfig:
        """The section of the role whose config key is `key` (`planner`, `code_generator`, `echo`); empty if not written."""
        section = getattr(self, key, None) if key in type(self).model_fields else None
        if isinstance(section, RoleConfig):
            return section
        return self.role_sections.get(key) or RoleSectionConfig()

    @model_validator(mode="after")
    def _no_conflicting_settings(self) -> Config:
        # Two settings that cannot both hold are refused, rather than one of them silently ignored.
        conflict = next(iter(settings_conflicts(self)), None)
        if conflict is not None:
            raise ValueError(conflict)
        return self

    def llm_for(self, user: str) -> LLMConfig:
        """The model settings `user` (a role's config key, round_compressor or experience) calls with: its `llm` overrides over `llm`."""
        if user in (FOLDER, DISTILLER):
            overrides = self.round_compressor.llm if user == FOLDER else self.experience.llm
        else:
            overrides = self.role_section(user).llm
        return merged_llm(self.llm, overrides)

    def role_budget(self, user: str) -> int:
        """Tokens `user`'s prompts may use: its model's window minus its reply reserve and margin."""
        llm = self.llm_for(user)
        return llm.context_window - llm.reply_reserve - llm.margin

    @model_validator(mode="after")
    def _parts_fit_the_prompt(self) -> Config:
        # (the summary's cap needs no check: its share of the budget is bounded where prompts are built)
        # Whole cell outputs go into the CodeGenerator's prompts: its model's window is the one to fit.
        value, key = self.execution.output_tokens, "execution.output_tokens"
        llm, budget = self.llm_for("code_generator"), self.role_budget("code_generator")
        section = "code_generator.llm" if self.code_generator.llm.context_window is not None else "llm"
        if value is not None and value > budget // 2:
            raise ValueError(
                f"{key} is {value} tokens, more than half of the CodeGenerator's prompt budget ({budget} = {section}.context_window "
                f"{llm.context_window} - reply_reserve {llm.reply_reserve} - margin {llm.margin}); "
                f"lower {key} or raise {section}.context_window"
            )
        return self

    @property
    def prompt_budget(self) -> int:
        """Tokens a role's prompt may use: the context window minus the reply reserve and the margin."""
        return self.llm.context_window - self.llm.reply_reserve - self.llm.margin

    @property
    def cell_output_tokens(self) -> int:
        """Tokens one cell's output may take in a prompt: execution.output_tokens, or scaled to the CodeGenerator's budget.

        The CodeGenerator's model (`code_generator.llm` over `llm`) is the one that reads whole cell outputs.
        """
        if self.execution.output_tokens is not None:
            return self.execution.output_tokens
        return min(max(self.role_budget("code_generator") // OUTPUT_SHARE, MIN_OUTPUT_TOKENS), MAX_OUTPUT_TOKENS)

    @property
    def state_dir(self) -> Path:
        """Where this program writes (session folders, the SQLite file, caches): session.state_dir, else the project or, read-only, a folder of the user's."""
        if self.session.state_dir:
            path = Path(self.session.state_dir).expanduser()
            return path if path.is_absolute() else self.project_dir / path
        if self._state_dir is None:
            self._state_dir = self.project_dir if os.access(self.project_dir, os.W_OK) else read_only_state_dir(self.project_dir)
        return self._state_dir

    @property
    def sign_in_key_path(self) -> Path:
        """The file of the key that signs the page's sign-ins: serve.sign_in_key_file (relative: to the project), else sign-in.key in the state folder."""
        if self.serve.sign_in_key_file:
            path = Path(self.serve.sign_in_key_file).expanduser()
            return path if path.is_absolute() else self.project_dir / path
        return self.state_dir / "sign-in.key"

    @property
    def sessions_dir(self) -> Path:
        """Folder holding one working folder per session."""
        return self.state_dir / "sessions"

    @property
    def gateway_root(self) -> Path:
        """Where `taskweaver-lite gateway` keeps its kernels' session folders, relative paths taken from the project folder."""
        path = Path(self.gateway.root or "gateway").expanduser()
        return path if path.is_absolute() else self.project_dir / path

    @property
    def experience_dir(self) -> Path:
        """Folder of handcrafted tips (TaskWeaver's `experience/`)."""
        return self.project_dir / "experience"

    @property
    def store_path(self) -> Path:
        """The SQLite file, relative paths taken from the state folder; a read-only project's own file is read where it is."""
        path = Path(self.store.path).expanduser()
        if path.is_absolute():
            return path
        if self.state_dir != self.project_dir and (self.project_dir / path).is_file():
            return self.project_dir / path  # its sessions stay listed and exportable; writing them fails, saying the file is read-only
        return self.state_dir / path


def read_only_state_dir(project: Path) -> Path:
    """Where a read-only project's sessions go: $XDG_STATE_HOME (or ~/.local/state)/taskweaver-lite/<name>-<hash of its path>.

    The hash keeps two projects of one name apart; a home that cannot be written either falls back to the temporary folder.
    """
    resolved = project.resolve()
    name = f"{resolved.name}-{hashlib.sha256(str(resolved).encode()).hexdigest()[:8]}"
    home = Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state")
    for base in (home / "taskweaver-lite", Path(tempfile.gettempdir()) / f"taskweaver-lite-{os.getuid()}"):
        try:
            (base / name).mkdir(parents=True, exist_ok=True, mode=0o700)
        except OSError:
            continue
        return base / name
    raise ConfigError(f"{project} is read-only and no folder to write sessions in could be made: set session.state_dir to a writable folder")


def _has_llm(annotation: Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, (RoleConfig, RoundCompressorConfig, ExperienceConfig))


# Settings that shape the local kernel; a kernel on a gateway runs on the gateway's machine, under its rules.
_LOCAL_ONLY = {
    "sandbox": "the sandbox wraps a kernel started on this machine",
    "network": "it opens the local sandbox's network",
    "memory_limit": "limits are set on a kernel started on this machine",
    "max_processes": "limits are set on a kernel started on this machine",
    "cpu_limit": "limits are set on a kernel started on this machine",
    "cgroup": "a cgroup holds a kernel started on this machine",
    "disk_limit": "the limit is kept on a kernel started on this machine; a gateway's disk is the gateway's to limit",
    "disk_limit_files": "the limit is kept on a kernel started on this machine; a gateway's disk is the gateway's to limit",
}


def settings_conflicts(config: Config) -> list[str]:
    """One line per pair of settings given together that cannot both hold, naming both and the fix."""
    found = _gateway_conflicts(config.execution)
    if config.execution.mounts and config.execution.sandbox == "none":
        found.append(
            "execution.mounts and execution.sandbox: none conflict (without the sandbox the kernel sees every folder and "
            "read-only cannot be kept); remove the mounts, or set execution.sandbox: auto"
        )
    if config.mcp.servers and config.execution.kernel_gateway is not None:
        found.append(
            "mcp.servers and execution.kernel_gateway conflict (the servers run beside the kernel, as its children, and a "
            "gateway's kernel runs on the gateway's machine); remove one of them"
        )
    for user in ("planner", "code_generator"):
        role: RoleConfig = getattr(config, user)
        # The summarising strategies (compression.py turns them into sliding_window without compression).
        if not role.prompt_compression and "strategy" in role.model_fields_set and role.strategy in ("round_compression", "summary_buffer"):
            found.append(
                f"{user}.prompt_compression: false and {user}.strategy: {role.strategy} conflict (without compression "
                f"the history is a sliding window); remove one of them"
            )
    return found


def _gateway_conflicts(execution: ExecutionConfig) -> list[str]:
    """Settings of a kernel on this machine given together with a gateway, whose kernel runs on its own machine."""
    if execution.kernel_gateway is None:
        return []
    # `sandbox: auto` (the default, written out) means "where possible": no conflict.
    given = [key for key in _LOCAL_ONLY if key in execution.model_fields_set and not (key == "sandbox" and execution.sandbox != "bubblewrap")]
    found = [
        f"execution.{key}: {yaml_text(getattr(execution, key))} and execution.kernel_gateway conflict ({_LOCAL_ONLY[key]}, and with a "
        f"gateway the kernel runs on the gateway's machine); remove one of them"
        for key in given
    ]
    if execution.kernel:
        found.append(
            "execution.kernel and execution.kernel_gateway conflict (it picks the Python of a kernel on this machine; a gateway's "
            "kernel is its kernel_gateway.kernel_name); remove one of them"
        )
    if execution.mounts:
        found.append(
            "execution.mounts and execution.kernel_gateway conflict (they are folders of this machine, and with a gateway the "
            "kernel runs on the gateway's machine); remove one of them"
        )
    return found


def yaml_text(value: Any) -> str:
    """A setting's value as it is written in YAML (true, null, 50%)."""
    # On one line however long (a mapping of servers), in the order the settings are declared.
    return yaml.safe_dump(value, default_flow_style=True, width=math.inf, sort_keys=False).strip().removesuffix("...").strip()


def _merge_problem(err: ErrorDetails) -> str:
    key = ".".join(map(str, err["loc"]))
    message = err["msg"].removeprefix("Value error, ")
    return f"key '{key}': {message.lower()}" if key else message
