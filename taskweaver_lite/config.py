"""The typed configuration: one object, loaded once from `PROJECT_DIR/taskweaver_config.yaml`.

Every key has a default, so an empty file is a valid project. `--set a.b=value` overrides are
parsed as YAML and applied before validation, so they are checked exactly like the file.
Errors name the file, the key and what was expected, on one line.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, model_validator

from taskweaver_lite.errors import ConfigError

CONFIG_FILE_NAME = "taskweaver_config.yaml"

MIN_PROMPT_TOKENS = 256  # below this not even a short system prompt and one request fit
# One cell's output gets an eighth of a role's prompt budget: at an 8k window (3,648-token budget)
# 456 tokens, enough for an error, its last frames and the output's head and tail.
OUTPUT_SHARE = 8
MIN_OUTPUT_TOKENS = 256
MAX_OUTPUT_TOKENS = 2_000

Strategy = Literal["round_compression", "sliding_window", "summary_buffer", "none"]


# No model accepts more than this; a bigger number is a typo (1e20) that would reach the wire as max_tokens.
MAX_CONTEXT_WINDOW = 10_000_000


class _Section(BaseModel):
    # inf and nan pass `gt=0` checks but make every timeout and budget meaningless.
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


class LLMConfig(_Section):
    """Where and how the chat model is called."""

    api_base: str | None = None
    api_key: SecretStr | None = None
    model: str = "gpt-4o-mini"
    context_window: int = Field(128_000, gt=256, le=MAX_CONTEXT_WINDOW)
    reply_reserve: int = Field(4_096, ge=16, lt=MAX_CONTEXT_WINDOW, description="tokens kept free for the model's reply (sent as max_tokens)")
    margin: int = Field(256, ge=0, lt=MAX_CONTEXT_WINDOW, description="tokens kept free for counting differences")
    json_mode: bool = Field(True, description="send response_format=json_object")
    timeout: float = Field(120.0, gt=0)
    max_retries: int = Field(2, ge=0)
    tokenizer: Literal["o200k_base", "cl100k_base"] = "o200k_base"

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


class RoleConfig(_Section):
    """Per-role prompt history settings."""

    prompt_compression: bool = True
    strategy: Strategy = "round_compression"
    examples: Literal["until_history", "always"] = Field(
        "until_history",
        description="few-shot examples in every prompt, or only until the prompt shows a round of the role's own (which shows the reply format as well)",
    )


class RoundCompressorConfig(_Section):
    """When and how old rounds fold into a summary."""

    rounds_to_compress: int = Field(2, ge=1)
    rounds_to_retain: int = Field(3, ge=0)
    fold_token_trigger: int = Field(
        24_000, ge=0, description="fold early when unfolded rounds exceed this many tokens (0: off)"
    )
    summary_placement: Literal["system", "first_user"] = "system"
    retry_backoff: float = Field(30.0, ge=0, description="seconds before a failed fold is retried")
    summary_buffer_rounds: int = Field(10, ge=1, description="rounds kept verbatim by summary_buffer")
    max_summary_tokens: int = Field(1_500, ge=64)


class SessionConfig(_Section):
    """One user turn."""

    max_internal_hops: int = Field(10, ge=1)
    max_repair_attempts: int = Field(3, ge=0, description="repair turns per round for bad replies")
    max_upload_bytes: int = Field(
        256 * 1024 * 1024, ge=1, description="largest file /load copies into the working folder; larger ones are refused"
    )


class CodeInterpreterConfig(_Section):
    """Code writing and its retries."""

    max_retry_count: int = Field(3, ge=0)


class ExecutionConfig(_Section):
    """The Jupyter kernel that runs generated code."""

    timeout: float = Field(120.0, gt=0)
    output_tokens: int | None = Field(
        None, ge=64, description="tokens of one cell's output kept for prompts (null: an eighth of the prompt budget, 256-2000)"
    )
    allowed_env: list[str] = Field(default_factory=list, description="secret-looking env vars to pass")
    kernel_start_timeout: float = Field(60.0, gt=0)

    @model_validator(mode="before")
    @classmethod
    def _renamed_keys(cls, data: Any) -> Any:
        if isinstance(data, dict) and "output_budget" in data:
            raise ValueError(
                "output_budget (characters per output field) was replaced by output_tokens (tokens per cell, all "
                "fields together; leave it out to scale it with llm.context_window): rename or remove the key"
            )
        return data


class StoreConfig(_Section):
    """Where sessions are kept."""

    path: str = "sessions.db"
    record_prompts: bool = False


class Config(_Section):
    """Everything a session needs, validated."""

    llm: LLMConfig = Field(default_factory=LLMConfig)
    planner: RoleConfig = Field(default_factory=RoleConfig)
    code_generator: RoleConfig = Field(default_factory=RoleConfig)
    round_compressor: RoundCompressorConfig = Field(default_factory=RoundCompressorConfig)
    session: SessionConfig = Field(default_factory=SessionConfig)
    code_interpreter: CodeInterpreterConfig = Field(default_factory=CodeInterpreterConfig)
    execution: ExecutionConfig = Field(default_factory=ExecutionConfig)
    store: StoreConfig = Field(default_factory=StoreConfig)
    # Not a YAML key: where the project lives, filled in by load_config.
    project_dir: Path = Field(default=Path("project"), exclude=True)

    @model_validator(mode="after")
    def _parts_fit_the_prompt(self) -> Config:
        # (the summary's cap needs no check: its share of the budget is bounded where prompts are built)
        budget, value, key = self.prompt_budget, self.execution.output_tokens, "execution.output_tokens"
        if value is not None and value > budget // 2:
            raise ValueError(
                f"{key} is {value} tokens, more than half of the prompt budget ({budget} = llm.context_window "
                f"{self.llm.context_window} - reply_reserve {self.llm.reply_reserve} - margin {self.llm.margin}); "
                f"lower {key} or raise llm.context_window"
            )
        return self

    @property
    def prompt_budget(self) -> int:
        """Tokens a role's prompt may use: the context window minus the reply reserve and the margin."""
        return self.llm.context_window - self.llm.reply_reserve - self.llm.margin

    @property
    def cell_output_tokens(self) -> int:
        """Tokens one cell's output may take in a prompt: execution.output_tokens, or scaled to the budget."""
        if self.execution.output_tokens is not None:
            return self.execution.output_tokens
        return min(max(self.prompt_budget // OUTPUT_SHARE, MIN_OUTPUT_TOKENS), MAX_OUTPUT_TOKENS)

    @property
    def sessions_dir(self) -> Path:
        """Folder holding one working folder per session."""
        return self.project_dir / "sessions"

    @property
    def store_path(self) -> Path:
        """The SQLite file, relative paths taken from the project folder."""
        path = Path(self.store.path).expanduser()
        return path if path.is_absolute() else self.project_dir / path


def load_config(project_dir: str | Path = "project", overrides: list[str] | None = None) -> Config:
    """Read the project's YAML, apply `KEY=VALUE` overrides, and validate once."""
    project = Path(project_dir)
    path = project / CONFIG_FILE_NAME
    if not project.is_dir():
        raise ConfigError(f"{project}: project folder not found (pass -p PROJECT_DIR)")
    data: dict[str, Any] = {}
    if path.exists():
        try:
            loaded = yaml.safe_load(_read_text(path))
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f" line {mark.line + 1}" if mark is not None else ""
            raise ConfigError(f"{path}:{where} is not valid YAML ({_first_line(exc)}); fix the syntax") from None
        if loaded is not None and not isinstance(loaded, dict):
            raise ConfigError(f"{path}: expected a mapping of sections (llm:, planner:, ...) at the top")
        data = loaded or {}
    for item in overrides or []:
        _apply_override(data, item)
    try:
        config = Config.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_describe(exc, path, overrides or [])) from None
    config.project_dir = project
    return config


def _read_text(path: Path) -> str:
    """The config file's text; ConfigError naming the encoding problem if it is not UTF-8."""
    raw = path.read_bytes()
    if raw.startswith((b"\xff\xfe", b"\xfe\xff")):
        raise ConfigError(f"{path}: the file is UTF-16 encoded; save it as UTF-8")
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise ConfigError(
            f"{path}: line {line} is not UTF-8 (byte 0x{raw[exc.start]:02x} at offset {exc.start}, perhaps Latin-1); save the file as UTF-8"
        ) from None


def _apply_override(data: dict[str, Any], item: str) -> None:
    key, sep, raw = item.partition("=")
    key = key.strip()
    if not sep or not key:
        raise ConfigError(f"--set {item}: expected KEY=VALUE, for example --set llm.model=gpt-4o")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    parts = key.split(".")
    node: Any = Config
    for part in parts:
        fields = getattr(node, "model_fields", None)
        if fields is None or part not in fields or part == "project_dir":
            raise ConfigError(f"--set {key}: unknown config key '{part}'; known here: {_known(node)}")
        node = fields[part].annotation
    target = data
    for part in parts[:-1]:
        child = target.get(part)
        if not isinstance(child, dict):
            child = {}
            target[part] = child
        target = child
    target[parts[-1]] = value


def _known(node: Any) -> str:
    fields = getattr(node, "model_fields", {})
    return ", ".join(name for name in fields if name != "project_dir") or "(none: this is a value)"


def _describe(exc: ValidationError, path: Path, overrides: list[str]) -> str:
    err = exc.errors()[0]
    key = ".".join(str(p) for p in err["loc"])
    if not key:  # a check across sections: its message names the keys
        touched = [o for o in overrides if o.split("=", 1)[0].strip() in err["msg"]]
        source = ", ".join(f"--set {_masked(o)}" for o in touched) if touched else str(path)
        return f"{source}: {err['msg'].removeprefix('Value error, ')}"
    touched = [o for o in overrides if (k := o.split("=", 1)[0].strip()) == key or k.startswith(key + ".")]
    source = ", ".join(f"--set {_masked(o)}" for o in touched) if touched else str(path)
    if err["type"] == "extra_forbidden":
        parent: type[BaseModel] = Config
        for part in err["loc"][:-1]:
            section = parent.model_fields[str(part)].annotation
            if not (isinstance(section, type) and issubclass(section, BaseModel)):
                break
            parent = section
        return f"{source}: unknown key '{key}'; known keys here: {_known(parent)}"
    got = err.get("input")
    # Only scalars are echoed: a whole section could hold the API key.
    shown = "" if "api_key" in key or isinstance(got, (dict, list)) else f", got {got!r}"
    return f"{source}: key '{key}': {err['msg'].lower()}{shown}"


def _masked(override: str) -> str:
    key, sep, value = override.partition("=")
    return f"{key}{sep}***" if "api_key" in key and value else override


def _first_line(exc: Exception) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
