"""How a session is put together: its id, its models, its executor, and the guard that undoes a failed opening.

`Session.open` and `Session.resume` (session.py) use these; what remains in session.py is the session
itself, the turn loop and what it does between turns.
"""

from __future__ import annotations

import functools
import json
import time
import uuid
from collections.abc import Sequence

from taskweaver_lite.config import DISTILLER, FOLDER, Config, LLMConfig, merged_llm
from taskweaver_lite.errors import ConfigError
from taskweaver_lite.execution import Executor, ExecutorFactory
from taskweaver_lite.llm.client import ChatModel
from taskweaver_lite.plugins.catalog import PluginSpec
from taskweaver_lite.roles.registry import RoleSpec
from taskweaver_lite.store.interface import SessionClaim, Store


def new_session_id() -> str:
    """A sortable, readable session id: date, time, and a short random suffix."""
    return time.strftime("%Y%m%d-%H%M%S") + "-" + uuid.uuid4().hex[:6]


def role_models(config: Config, *, roles: Sequence[RoleSpec]) -> ChatModel:
    """The openai-SDK clients a session calls: one per distinct role model (`<role>.llm`), shared when equal."""
    from taskweaver_lite.llm.client import OpenAIChatModel, RoutedModel

    clients: dict[str, OpenAIChatModel] = {}

    def client(llm: LLMConfig) -> OpenAIChatModel:
        secret = llm.api_key.get_secret_value() if llm.api_key is not None else None
        key = json.dumps([llm.model_dump(mode="json", exclude={"api_key"}), secret], sort_keys=True)
        if key not in clients:
            clients[key] = OpenAIChatModel(llm)
        return clients[key]

    folder = client(config.llm_for(FOLDER))
    by_purpose: dict[str, ChatModel] = {}
    for spec in roles:
        by_purpose[spec.key] = client(merged_llm(config.llm, spec.section(config.role_section(spec.key)).llm))
        by_purpose[f"compression_{spec.key}"] = folder
    by_purpose[DISTILLER] = client(config.llm_for(DISTILLER))
    return RoutedModel(by_purpose, default=client(config.llm))


def default_executor(config: Config, *, plugins: Sequence[PluginSpec] = ()) -> ExecutorFactory:
    """A Jupyter kernel per session, started in the background, with `plugins` loaded in it: local, or on `execution.kernel_gateway`."""
    from taskweaver_lite.kernel.executor import KernelExecutor

    gateway = config.execution.kernel_gateway
    if gateway is not None:
        try:
            from taskweaver_lite.kernel.remote import GatewayExecutor
        except ImportError as exc:
            raise ConfigError(
                f"execution.kernel_gateway needs {exc.name}: pip install 'taskweaver-lite[gateway]'"
            ) from exc
        return functools.partial(GatewayExecutor, config=config.execution, gateway=gateway, output_tokens=config.cell_output_tokens, plugins=tuple(plugins))
    # A sandboxed kernel sees neither the project folder nor the store (wherever store.path puts it).
    hidden = (config.project_dir, config.store_path.parent)
    return functools.partial(KernelExecutor, config=config.execution, output_tokens=config.cell_output_tokens, plugins=tuple(plugins), hidden=hidden)


def kept_variables(executor: Executor) -> bool:
    """Whether the executor came with the session's variables: a kernel on a gateway attached by its stored id (waits for it)."""
    from taskweaver_lite.kernel.remote import GatewayExecutor  # as in default_executor: only with the gateway extra

    return isinstance(executor, GatewayExecutor) and executor.kept_variables()


class OpeningGuard:
    """Closes the store, and releases the session lock once taken, if opening a session fails."""

    def __init__(self, store: Store, *, owned: bool) -> None:
        self.store = store
        self.owned = owned
        self.lock: SessionClaim | None = None

    def __enter__(self) -> OpeningGuard:
        return self

    def __exit__(self, kind: type[BaseException] | None, *rest: object) -> None:
        if kind is not None:
            if self.lock is not None:
                self.lock.release()
            if self.owned:
                self.store.close()
