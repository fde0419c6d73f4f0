"""The error tree: every `str()` here is written for the person at the prompt.

`TaskWeaverError` and its subclasses are shown to the user as they are. Fatal ones (bad config,
an LLM that cannot be reached) end the CLI with a non-zero exit; recoverable ones (a reply that
breaks the schema, code that fails) are recorded on the round and sent back to the model.
"""

from __future__ import annotations


class TaskWeaverError(Exception):
    """Base class: the message is meant for the user."""


class ConfigError(TaskWeaverError):
    """The configuration file or a `--set` override is wrong."""


class LLMError(TaskWeaverError):
    """A model call failed, after the client's own retries (llm.max_retries; the SDK's are off)."""


class LLMAuthError(LLMError):
    """The endpoint refused the API key."""


class LLMUnreachableError(LLMError):
    """The endpoint could not be reached (connection refused, DNS, timeout)."""


class LLMModelNotFoundError(LLMError):
    """The endpoint does not serve the configured model."""


class LLMRateLimitError(LLMError):
    """The endpoint kept answering 429 after the retries."""


class LLMContextTooLongError(LLMError):
    """The endpoint rejected the prompt as longer than the model's context."""


class ReplyFormatError(TaskWeaverError):
    """A model reply could not be read as the JSON its role must answer in."""


class RoundFailedError(TaskWeaverError):
    """A round could not be finished; the session goes on without it."""


class ContextOverflowError(TaskWeaverError):
    """Even the current round alone does not fit the model's context window."""


class KernelError(TaskWeaverError):
    """The Jupyter kernel could not be started or reached."""


class GatewayError(KernelError):
    """A Jupyter Kernel/Enterprise Gateway refused a request; the message names its address."""


class GatewayUnreachableError(GatewayError):
    """The gateway could not be reached at the configured address."""


class GatewayAuthError(GatewayError):
    """The gateway refused the token."""


class GatewayConnectionLost(GatewayError):
    """The WebSocket to the kernel closed."""


class KernelLimitReached(GatewayError):
    """The gateway will not start another kernel for this user (gateway.max_kernels_per_user); the message is the gateway's, naming the setting."""


class StoreError(TaskWeaverError):
    """The session store is unreadable, locked, or from a newer version."""


class StoreUnavailable(StoreError):
    """The store cannot be reached now (PostgreSQL down or every connection busy); what it holds is kept (HTTP 503)."""


class SessionBusyError(StoreError):
    """Another process has this session open."""


class SessionLimitReached(StoreError):
    """The user already has as many sessions as the limit allows (serve.max_sessions_per_user); `unused`: their newest one never asked anything."""

    def __init__(self, count: int, limit: int, *, unused: str | None) -> None:
        super().__init__(f"the user has {count} sessions, the most serve.max_sessions_per_user ({limit}) allows")
        self.count, self.limit, self.unused = count, limit, unused


class AmbiguousSessionError(StoreError):
    """A start of a session id that more than one stored session begins with; the message lists some and asks for more."""


class UnknownSessionError(StoreError):
    """No stored session has this id; the message says how to list them (the CLI adds its -p)."""

    def __init__(self, ref: str, *, store: str, listing: str = "taskweaver-lite sessions") -> None:
        super().__init__(f"no session '{ref}' in {store}; run `{listing}` to see the ids")
        self.ref = ref
        self.store = store

    def listed_with(self, listing: str) -> UnknownSessionError:
        """The same error, pointing at the listing command that finds this store."""
        return UnknownSessionError(self.ref, store=self.store, listing=listing)


class SearchUnavailableError(TaskWeaverError):
    """A search (the documents, the experience tips) cannot run here; the message says why."""


class ExperienceError(TaskWeaverError):
    """A handcrafted tip file is broken, or a session could not be distilled into tips; nothing stored was lost."""
