"""The typed configuration: one object, loaded once from `PROJECT_DIR/taskweaver_config.yaml`.

Every key has a default, so an empty file is a valid project. `--set a.b=value` overrides are
parsed as YAML and applied before validation, so they are checked exactly like the file.
Errors name the file, the key and what was expected, on one line.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal, get_args

import yaml
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, SecretStr, ValidationError, field_validator, model_validator
from pydantic_core import ErrorDetails

from taskweaver_lite.errors import ConfigError
from taskweaver_lite.taskweaver_json import JSON_FILE_NAME, read_taskweaver_json
from taskweaver_lite.verification import DEFAULT_ALLOWED_MODULES, DEFAULT_BLOCKED_FUNCTIONS

CONFIG_FILE_NAME = "taskweaver_config.yaml"
# Bounds on any YAML file of a project (config, examples, plugin specs): far above real ones.
YAML_MAX_CHARS = 1_000_000
YAML_MAX_DEPTH = 64
YAML_MAX_NODES = 200_000  # values once every alias is expanded

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
    reply_reserve: int = Field(
        MAX_DEFAULT_REPLY_RESERVE,
        ge=16,
        lt=MAX_CONTEXT_WINDOW,
        description="tokens kept free for the model's reply (sent as max_tokens); unset: a quarter of context_window, at most 4,096",
    )
    margin: int = Field(256, ge=0, lt=MAX_CONTEXT_WINDOW, description="tokens kept free for counting differences")
    json_mode: bool = Field(True, description="send response_format=json_object")
    timeout: float = Field(120.0, gt=0)
    max_retries: int = Field(2, ge=0)
    tokenizer: Literal["o200k_base", "cl100k_base"] = "o200k_base"
    stream: bool = Field(True, description="stream replies (stream=true); false for endpoints that cannot")
    show_reasoning: bool = Field(True, description="show a model's reasoning (<think>, reasoning_content) dimmed while it streams")
    prompt_cache: Literal["auto", "off"] = Field(
        "auto", description="cache hints: prompt_cache_key, or llama.cpp's cache_prompt and id_slot; never a field the server refuses"
    )
    server_kind: Literal["auto", "openai", "llama.cpp", "other"] = Field(
        "auto", description="which cache hints the server takes (auto: from the address, local discovery, or its replies)"
    )
    vision: bool = Field(False, description="the model reads images: roles that require vision are off without it")

    @model_validator(mode="before")
    @classmethod
    def _reserve_follows_the_window(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("reply_reserve") is None:
            window = data.get("context_window", 128_000)
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
    json_mode: bool | None = None
    timeout: float | None = None
    max_retries: int | None = None
    tokenizer: Literal["o200k_base", "cl100k_base"] | None = None
    stream: bool | None = None
    prompt_cache: Literal["auto", "off"] | None = None
    server_kind: Literal["auto", "openai", "llama.cpp", "other"] | None = None
    vision: bool | None = None


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

    prompt_compression: bool = True
    strategy: Strategy = "round_compression"
    fold_schedule: FoldSchedule = Field(
        "rounds",
        description="rounds: fold as rounds_to_compress + rounds_to_retain rounds gather (TaskWeaver's rule); "
        "pressure: fold all but the latest rounds_to_retain at once, only when the unfolded rounds pass fold_token_trigger",
    )
    examples: Literal["until_history", "always"] = Field(
        "until_history",
        description="few-shot examples in every prompt, or only until the prompt shows a round of the role's own (which shows the reply format as well)",
    )


class CodeGeneratorConfig(RoleConfig):
    """The CodeGenerator's settings: its prompt history, and which plugins its prompt shows."""

    auto_plugin_selection: bool = Field(
        False, description="show only the plugins most relevant to the current step (and those used before), not all"
    )
    auto_plugin_selection_topk: int = Field(3, ge=1, description="how many plugins auto_plugin_selection shows")


class DocumentRetrieverConfig(RoleConfig):
    """The document_retriever role: which folder it searches and how much of it a reply quotes."""

    folder: str = Field("docs", description="the documents folder, relative to the project (or absolute)")
    top_k: int = Field(4, ge=1, le=50, description="the most passages a reply quotes")
    max_tokens: int = Field(700, ge=64, description="tokens a reply may take (also at most a sixth of the Planner's budget)")


class RoundCompressorConfig(_Section):
    """When and how old rounds fold into a summary."""

    rounds_to_compress: int = Field(2, ge=1)
    rounds_to_retain: int = Field(3, ge=0)
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
    max_summary_tokens: int = Field(1_500, ge=64)
    llm: LLMOverrides = Field(default_factory=LLMOverrides, description="the model that folds rounds: keys that replace llm's")


class SessionConfig(_Section):
    """One user turn, and the roles that take part in it."""

    roles: list[str] = Field(
        default_factory=lambda: ["planner", "code_interpreter"],
        description="the enabled roles by name: built-in ones, PROJECT_DIR/roles/<name>/, installed packages' (taskweaver-lite roles lists them)",
    )
    max_internal_hops: int = Field(10, ge=1)
    max_repair_attempts: int = Field(3, ge=0, description="repair turns per round for bad replies")
    max_upload_bytes: int = Field(
        256 * 1024 * 1024, ge=1, description="largest file /load copies into the working folder; larger ones are refused"
    )


class CodeInterpreterConfig(_Section):
    """Code writing, its retries, and the static check each cell passes before it runs (verification.py)."""

    max_retry_count: int = Field(3, ge=0)
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
    token: SecretStr | None = Field(None, description="the gateway's auth token (KG_AUTH_TOKEN), sent as `Authorization: token ...`")
    kernel_name: str | None = Field(None, description="the kernelspec to start (null: the gateway's default)")
    headers: dict[str, str] = Field(default_factory=dict, description="extra HTTP headers on every request (a proxy's auth)")
    validate_cert: bool = Field(True, description="check the gateway's TLS certificate (https:// and wss://)")
    connect_timeout: float = Field(20.0, gt=0, description="seconds to connect to the gateway and for each REST call")
    env: dict[str, str] = Field(
        default_factory=dict, description="KERNEL_* variables sent with the start request (KERNEL_WORKING_DIR, KERNEL_NAMESPACE, ...)"
    )

    @field_validator("url")
    @classmethod
    def _a_web_address(cls, value: str) -> str:
        if not value.startswith(("http://", "https://")):
            raise ValueError("expected an http:// or https:// address such as http://bigbox:8888")
        return value.rstrip("/")


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

    timeout: float = Field(120.0, gt=0)
    output_tokens: int | None = Field(
        None, ge=64, description="tokens of one cell's output kept for prompts (null: an eighth of the prompt budget, 256-2000)"
    )
    allowed_env: list[str] = Field(default_factory=list, description="secret-looking env vars to pass")
    kernel_start_timeout: float = Field(60.0, gt=0)
    display_width: int | None = Field(
        None, ge=40, description="characters per line for pandas in the kernel (null: the chat's terminal width, else pandas' 80)"
    )
    kernel_gateway: KernelGatewayConfig | None = Field(None, description="run the kernel on a Jupyter Kernel/Enterprise Gateway (null: locally)")
    sandbox: Literal["none", "bubblewrap", "auto"] = Field("auto", description="run the local kernel inside bubblewrap (auto: where bwrap is installed)")
    network: bool = Field(False, description="let the sandboxed kernel reach the network")
    memory_limit: int | str | None = Field(
        "50%", description="address space each kernel process may use: bytes, '4GB', '512MB', or a share of this machine's memory ('50%'); null: none"
    )
    max_processes: int = Field(256, ge=8, description="processes and threads the sandboxed kernel may run at once")
    confirm: bool = Field(False, description="show each cell and wait for run / edit / skip (interactive chat only)")
    kernel: str | None = Field(
        None,
        description="the Python the local kernel runs on: null (this program's), an installed Jupyter kernelspec's name, "
        "or a Python interpreter's path (a conda env's or venv's bin/python with ipykernel)",
    )
    mounts: list[MountConfig] = Field(
        default_factory=list, description="folders the sandboxed kernel sees at their own path: paths (read-only), or {path, mode: ro|rw}"
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
        number = text.rstrip("KMGTB ").strip()
        unit = text[len(number) :].strip()
        if unit not in _UNITS or not number.replace(".", "", 1).isdigit():
            raise ValueError("expected a size such as 4GB, 512MB, a number of bytes, or a share such as 50%")
        size = int(float(number) * _UNITS[unit])
    if size < MIN_MEMORY_LIMIT:
        raise ValueError("at least 256MB: below that the kernel cannot start (null for no limit)")
    return size


class StoreConfig(_Section):
    """Where sessions are kept."""

    path: str = "sessions.db"
    record_prompts: bool = False


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
    # The sections of roles that have no field here (`echo:`, a project role's), written at the top
    # level like `planner:`; load_config moves them here. Not a YAML key of its own.
    role_sections: dict[str, RoleConfig] = Field(default_factory=dict, exclude=True)
    # Not a YAML key: where the project lives, filled in by load_config.
    project_dir: Path = Field(default=Path("project"), exclude=True)
    _notices: list[str] = PrivateAttr(default_factory=list)

    @property
    def notices(self) -> list[str]:
        """What loading said besides errors (TaskWeaver keys that have no effect here), for the user once."""
        return self._notices

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
        return self.role_sections.get(key) or RoleConfig()

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
    def sessions_dir(self) -> Path:
        """Folder holding one working folder per session."""
        return self.project_dir / "sessions"

    @property
    def experience_dir(self) -> Path:
        """Folder of handcrafted tips (TaskWeaver's `experience/`)."""
        return self.project_dir / "experience"

    @property
    def store_path(self) -> Path:
        """The SQLite file, relative paths taken from the project folder."""
        path = Path(self.store.path).expanduser()
        return path if path.is_absolute() else self.project_dir / path


def _has_llm(annotation: Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, (RoleConfig, RoundCompressorConfig, ExperienceConfig))


ROLES_FOLDER = "roles"
_ROLE_SECTIONS = "role_sections"


def role_names(project: Path, data: dict[str, Any]) -> set[str]:
    """Names whose top-level section is a role's: the project's role folders and the roles `session.roles` lists."""
    folder = project / ROLES_FOLDER
    names = {p.name for p in folder.iterdir() if p.is_dir()} if folder.is_dir() else set()
    listed = data.get("session", {}).get("roles") if isinstance(data.get("session"), dict) else None
    if isinstance(listed, list):
        names.update(str(name) for name in listed)
    return names - set(Config.model_fields)


# Settings that shape the local kernel; a kernel on a gateway runs on the gateway's machine, under its rules.
_LOCAL_ONLY = {
    "sandbox": "the sandbox wraps a kernel started on this machine",
    "network": "it opens the local sandbox's network",
    "memory_limit": "limits are set on a kernel started on this machine",
    "max_processes": "limits are set on a kernel started on this machine",
}


def settings_conflicts(config: Config) -> list[str]:
    """One line per pair of settings given together that cannot both hold, naming both and the fix."""
    found = _gateway_conflicts(config.execution)
    if config.execution.mounts and config.execution.sandbox == "none":
        found.append(
            "execution.mounts and execution.sandbox: none conflict (without the sandbox the kernel sees every folder and "
            "read-only cannot be kept); remove the mounts, or set execution.sandbox: auto"
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
    return yaml.safe_dump(value, default_flow_style=True).strip().removesuffix("...").strip()


def load_config(project_dir: str | Path = "project", overrides: list[str] | None = None) -> Config:
    """Read the project's YAML, apply `KEY=VALUE` overrides, and validate once."""
    project = Path(project_dir)
    path = project / CONFIG_FILE_NAME
    if not project.is_dir():
        raise ConfigError(f"{project}: project folder not found; create one with `taskweaver-lite init {project}`")
    data: dict[str, Any] = {}
    notices: list[str] = []
    if not path.exists() and (project / JSON_FILE_NAME).exists():
        path, data, notices = _taskweaver_json(project / JSON_FILE_NAME)
    elif path.exists():
        text = _read_text(path)
        try:
            loaded = load_yaml(text, source=path)
        except yaml.YAMLError as exc:
            raise ConfigError(missing_colon(path, text, exc) or f"{path}: not valid YAML: {_yaml_problem(exc)}; fix the syntax") from None
        if loaded is not None and not isinstance(loaded, dict):
            raise ConfigError(f"{path}: expected a mapping of sections (llm:, planner:, ...) at the top")
        data = loaded or {}
    data.pop(_ROLE_SECTIONS, None)  # not a key of the file: role sections are written at the top level
    for item in overrides or []:  # `--set session.roles=[...]` first: it decides which sections are roles'
        if item.partition("=")[0].strip() == "session.roles":
            _apply_override(data, item, roles=set())
    roles = role_names(project, data)
    unknown = [problem for item in overrides or [] if (problem := _apply_override(data, item, roles=roles))]
    if unknown:
        raise ConfigError("; ".join(unknown))
    data[_ROLE_SECTIONS] = {name: data.pop(name) for name in sorted(roles) if name in data}
    try:
        config = Config.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_describe(exc, path, overrides or [])) from None
    config.project_dir = project
    config.notices.extend(notices)
    return config


def _taskweaver_json(path: Path) -> tuple[Path, dict[str, Any], list[str]]:
    """TaskWeaver's JSON config, mapped to our keys; errors from here on name that file."""
    settings = read_taskweaver_json(path, known=is_config_key)
    notice = settings.notice(path)
    return path, settings.data, [notice] if notice else []


def is_config_key(dotted: str) -> bool:
    """Whether `dotted` (`llm.model`, `execution.kernel_gateway.url`) names one of our settings."""
    node: Any = Config
    for part in dotted.split("."):
        fields = getattr(node, "model_fields", None)
        if fields is None or part not in fields or part in _NOT_KEYS:
            return False
        node = section_type(fields[part].annotation)
    return True


def _merge_problem(err: ErrorDetails) -> str:
    key = ".".join(map(str, err["loc"]))
    message = err["msg"].removeprefix("Value error, ")
    return f"key '{key}': {message.lower()}" if key else message


def load_yaml(text: str, *, source: Path | str, max_chars: int = YAML_MAX_CHARS) -> Any:
    """`yaml.safe_load` of a project's file within bounds: ConfigError naming `source` if it is too big, too deep or alias-heavy.

    PyYAML builds nested values recursively (10,000 levels end in a RecursionError) and an alias
    bomb is small on disk but explodes once the values are walked: the events are counted first,
    without recursion, and only a file within the bounds is loaded.
    """
    problem = yaml_bounds_problem(text, max_chars=max_chars)
    if problem is not None:
        raise ConfigError(f"{source}: {problem}; nothing was loaded")
    return yaml.safe_load(text)


def yaml_bounds_problem(text: str, *, max_chars: int = YAML_MAX_CHARS) -> str | None:
    """What makes `text` too big, too deep or too alias-heavy to load (None: within the bounds), read without recursion."""
    if len(text) > max_chars:
        return f"{len(text):,} characters, more than the {max_chars:,} a taskweaver-lite YAML file may have"
    sizes: dict[str, int] = {}  # an anchor's value, in values once expanded
    open_counts = [0]  # values in each collection being read, outermost first
    anchors: list[str | None] = [None]
    for event in yaml.parse(text, Loader=yaml.SafeLoader):
        if isinstance(event, yaml.CollectionStartEvent):
            open_counts.append(0)
            anchors.append(event.anchor)
            if len(open_counts) > YAML_MAX_DEPTH + 1:
                return f"nested more than {YAML_MAX_DEPTH} levels deep: flatten it"
            continue
        if isinstance(event, yaml.CollectionEndEvent):
            added, anchor = open_counts.pop() + 1, anchors.pop()
        elif isinstance(event, yaml.ScalarEvent):
            added, anchor = 1, event.anchor
        elif isinstance(event, yaml.AliasEvent):
            added, anchor = sizes.get(event.anchor or "", 1), None
        else:
            continue
        if anchor is not None:
            sizes[anchor] = added
        open_counts[-1] += added
        if open_counts[-1] > YAML_MAX_NODES:
            return f"its aliases (*name) expand to more than {YAML_MAX_NODES:,} values: write the values out"
    return None


def _read_text(path: Path) -> str:
    """The config file's text; ConfigError naming the encoding problem if it is not UTF-8."""
    if path.stat().st_size > YAML_MAX_CHARS * 4:  # never read a huge file whole
        raise ConfigError(f"{path}: {path.stat().st_size:,} bytes, more than a taskweaver-lite YAML file may have; nothing was loaded")
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


def _apply_override(data: dict[str, Any], item: str, *, roles: set[str]) -> str | None:
    """Put one `KEY=VALUE` into `data`; returns the problem when the key is unknown (all are reported together).

    A first part naming a role in `roles` is that role's section (`--set echo.llm.model=...`).
    """
    key, sep, raw = item.partition("=")
    key = key.strip()
    if not sep or not key:
        raise ConfigError(f"--set {item}: expected KEY=VALUE, for example --set llm.model=gpt-4o")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as exc:
        # Taking the raw text instead would pass `[x` on as an address and fail later as a network error.
        raise ConfigError(f"--set {_masked(item)}: the value is not valid YAML ({_yaml_problem(exc)}); quote it: --set '{key}=\"...\"'") from None
    parts = key.split(".")
    node: Any = Config
    for number, part in enumerate(parts):
        fields = getattr(node, "model_fields", None)
        if number == 0 and part in roles:
            node = RoleConfig
            continue
        if fields is None or part not in fields or part in _NOT_KEYS:
            return f"--set {key}: unknown config key '{part}'; known here: {_known(node)}"
        node = section_type(fields[part].annotation)
    target = data
    for part in parts[:-1]:
        child = target.get(part)
        if not isinstance(child, dict):
            child = {}
            target[part] = child
        target = child
    target[parts[-1]] = value
    return None


def section_type(annotation: Any) -> Any:
    """The settings class inside an optional section's type (`KernelGatewayConfig | None`), else the type itself."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    sections = [arg for arg in get_args(annotation) if isinstance(arg, type) and issubclass(arg, BaseModel)]
    return sections[0] if len(sections) == 1 else annotation


_NOT_KEYS = ("project_dir", _ROLE_SECTIONS)


def _known(node: Any) -> str:
    fields = getattr(node, "model_fields", {})
    return ", ".join(name for name in fields if name not in _NOT_KEYS) or "(none: this is a value)"


def _describe(exc: ValidationError, path: Path, overrides: list[str]) -> str:
    """Every problem pydantic found on one line: unknown keys grouped by section, then wrong values."""
    unknown: dict[tuple[str, str], list[tuple[str, ...]]] = {}  # (source, section) -> where the unknown keys are
    problems: list[str] = []
    for err in exc.errors():
        if err["loc"][:1] == (_ROLE_SECTIONS,):  # a role's section is written at the top level: name it so
            err["loc"] = err["loc"][1:]
        key = ".".join(str(p) for p in err["loc"])
        if not key:  # a check across keys of a section: its message names them
            touched = [o for o in overrides if o.split("=", 1)[0].strip() in err["msg"]]
            source = ", ".join(f"--set {_masked(o)}" for o in touched) if touched else str(path)
            problems.append(f"{source}: {err['msg'].removeprefix('Value error, ')}")
            continue
        loc = tuple(str(p) for p in err["loc"])
        if err["type"] == "extra_forbidden":
            unknown.setdefault((_setters(loc, overrides) or str(path), ".".join(loc[:-1])), []).append(loc)
        else:
            problems.append(f"{_source(loc, path, overrides, missing=err['type'] == 'missing')}: {_wrong_value(err, key)}")
    named = [
        f"{_with_lines(source, locs, path)}: unknown key {' and '.join(repr('.'.join(loc)) for loc in locs)}; "
        f"known keys {f'in {section}' if len(unknown) > 1 else 'here'}: " + _known(_section(section))
        for (source, section), locs in unknown.items()
    ]
    if any("." in str(err["loc"][-1]) for err in exc.errors() if err["type"] == "extra_forbidden" and err["loc"]):
        named.append("in the file keys nest, one per line (`llm:` then `  model: gpt-4o` below it); dotted keys are for --set")
    return "; ".join(dict.fromkeys(named + problems))


def _source(loc: tuple[str, ...], path: Path, overrides: list[str], *, missing: bool = False) -> str:
    """Who set the key at `loc`: the --set values that wrote it (or, for a missing key, its section), else the file with the key's line.

    Keys are compared part by part: a dotted key written in the file (`llm.model:`) is one
    part, so it is the file's, not that of a valid `--set llm.model=...`.
    """
    scope = loc[:-1] if missing else loc
    setters = _setters(scope, overrides)
    if setters:
        return setters
    line = key_line(path, scope)
    return f"{path}, line {line}" if line is not None else str(path)


def _setters(scope: tuple[str, ...], overrides: list[str]) -> str | None:
    """The --set values that wrote the key at `scope` or inside it, compared part by part."""
    touched = [o for o in overrides if tuple(o.split("=", 1)[0].strip().split("."))[: len(scope)] == scope]
    return ", ".join(f"--set {_masked(o)}" for o in touched) or None


def _with_lines(source: str, locs: list[tuple[str, ...]], path: Path) -> str:
    """The file named with the lines of the keys at `locs`; --set sources as they are."""
    if source != str(path):
        return source
    lines = sorted({n for loc in locs if (n := key_line(path, loc)) is not None})
    if not lines:
        return source
    return f"{source}, line{'s' if len(lines) > 1 else ''} {' and '.join(map(str, lines))}"


def _section(dotted: str) -> type[BaseModel]:
    parent: type[BaseModel] = Config
    for part in filter(None, dotted.split(".")):
        if part not in parent.model_fields:  # a role's section (`echo`), written at the top level
            parent = RoleConfig
            continue
        section = section_type(parent.model_fields[part].annotation)
        if not (isinstance(section, type) and issubclass(section, BaseModel)):
            break
        parent = section
    return parent


def _wrong_value(err: ErrorDetails, key: str) -> str:
    got = err.get("input")
    # Only scalars are echoed: a whole section could hold the API key.
    shown = "" if "api_key" in key or isinstance(got, (dict, list)) else f", got {got!r}"
    return f"key '{key}': {err['msg'].lower()}{shown}"


def _masked(override: str) -> str:
    key, sep, value = override.partition("=")
    return f"{key}{sep}***" if ("api_key" in key or key.strip().endswith("token")) and value else override


COLON_PROBLEMS = ("mapping values are not allowed here", "could not find expected ':'")


def missing_colon(path: Path, text: str, exc: yaml.YAMLError) -> str | None:
    """The line whose key lacks its colon, said plainly, when that is what PyYAML tripped on (it names a later line)."""
    if not isinstance(exc, yaml.MarkedYAMLError) or exc.problem_mark is None or exc.problem not in COLON_PROBLEMS:
        return None
    lines = text.splitlines()
    last = exc.context_mark.line if exc.context_mark is not None else exc.problem_mark.line - 1
    for number in range(min(last, len(lines) - 1), -1, -1):
        line = lines[number].strip()
        if not line or line.startswith(("#", "-")):
            continue
        if ":" in line.split(" #")[0]:
            return None  # the nearest key has its colon: some other slip, PyYAML's words say it better
        key, _, rest = line.partition(" ")
        fixed = f"{key}: {rest.strip()}" if rest.strip() else f"{key}:"
        return f"{path}, line {number + 1}: `{line}` has no colon after its key; write `{fixed}`"
    return None


def key_line(path: Path, loc: tuple[str, ...]) -> int | None:
    """The line of the file where the key at `loc` is written (1-based), if the file has it."""
    try:
        node = yaml.compose(path.read_text(encoding="utf-8-sig"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return None
    line = None
    for part in loc:
        if not isinstance(node, yaml.MappingNode):
            break
        match = next(((k, v) for k, v in node.value if isinstance(k, yaml.ScalarNode) and k.value == part), None)
        if match is None:
            break
        line, node = match[0].start_mark.line + 1, match[1]
    return line


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """PyYAML's own explanation with the line it points at, and where the enclosing construct began."""
    if not isinstance(exc, yaml.MarkedYAMLError) or exc.problem_mark is None:
        return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    mark = exc.problem_mark
    text = f"line {mark.line + 1}, column {mark.column + 1}: {exc.problem}"
    if exc.context and exc.context_mark is not None:
        text += f" ({exc.context} on line {exc.context_mark.line + 1})"
    return text
