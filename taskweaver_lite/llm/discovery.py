"""Local models found without configuration: OpenAI-compatible servers on this machine's usual ports.

With no API key and no `llm.api_base`, the chat looks for Ollama, LM Studio, a llama.cpp server or
vLLM on their default ports and uses the first that answers, saying so. All ports are asked at
once, each with a short timeout, so a machine with none of them waits a few milliseconds (refused
connections come back at once) and never more than `WAIT` in all. `taskweaver-lite models` lists
what is reachable and which models each serves.
"""

from __future__ import annotations

import json
import os
import urllib.request
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any

from taskweaver_lite.config.settings import Config, LLMConfig

# (server, port): their defaults, in the order a found one is preferred.
LLAMA_CPP = "llama.cpp server"
VLLM = "vLLM"
KNOWN_SERVERS: tuple[tuple[str, int], ...] = (("Ollama", 11434), ("LM Studio", 1234), (LLAMA_CPP, 8080), (VLLM, 8000))
PROBE_TIMEOUT = 0.15  # seconds per port: a local server answers /v1/models in milliseconds
WAIT = 0.2  # seconds start-up may be delayed in all


@dataclass(frozen=True)
class LocalServer:
    """An OpenAI-compatible server that answered on this machine, and the models it serves."""

    name: str
    api_base: str
    models: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        """JSON shape: name, api_base, models."""
        return {"name": self.name, "api_base": self.api_base, "models": list(self.models)}


def probe(name: str, port: int, *, host: str = "127.0.0.1", timeout: float = PROBE_TIMEOUT) -> LocalServer | None:
    """The server on `port` if it answers GET /v1/models like an OpenAI-compatible one, else None."""
    api_base = f"http://{host}:{port}/v1"
    # No proxy: a local address asked through a proxy would be the proxy's machine.
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(f"{api_base}/models", timeout=timeout) as response:
            data = json.loads(response.read(1_000_000))
    except (OSError, ValueError):
        return None
    entries = data.get("data") if isinstance(data, dict) else None
    if not isinstance(entries, list):
        return None  # something else listens there (a web app on 8080, say)
    models = tuple(str(e["id"]) for e in entries if isinstance(e, dict) and isinstance(e.get("id"), str))
    return LocalServer(name=name, api_base=api_base, models=models)


def discover(candidates: Sequence[tuple[str, int]] = KNOWN_SERVERS, *, wait_at_most: float = WAIT) -> list[LocalServer]:
    """The servers among `candidates` that answer within `wait_at_most` seconds, in the order of `candidates`."""
    pool = ThreadPoolExecutor(max_workers=max(1, len(candidates)), thread_name_prefix="discovery")
    futures = [pool.submit(probe, name, port, timeout=min(PROBE_TIMEOUT, wait_at_most)) for name, port in candidates]
    wait(futures, timeout=wait_at_most)
    pool.shutdown(wait=False, cancel_futures=True)  # a slow probe finishes on its own; start-up does not wait for it
    return [found for f in futures if f.done() and not f.cancelled() and (found := f.result()) is not None]


def needs_discovery(config: Config) -> bool:
    """True when nothing says where the model is: no key and no address in the config or the environment."""
    llm = config.llm
    has_key = (llm.api_key is not None and bool(llm.api_key.get_secret_value())) or bool(os.environ.get("OPENAI_API_KEY"))
    return not has_key and llm.api_base is None and not os.environ.get("OPENAI_BASE_URL")


def use_local_server(config: Config, servers: Sequence[LocalServer]) -> str | None:
    """Point `config.llm` at the first server found (its first model unless `llm.model` names another); what to tell the user."""
    # The default model (also written in new projects' configs) is OpenAI's: no local server has it.
    wanted = None if config.llm.model == LLMConfig.model_fields["model"].default else config.llm.model
    for server in servers:
        chosen = wanted or (server.models[0] if server.models else None)
        if chosen is None or chosen not in server.models:
            continue
        config.llm.api_base = server.api_base
        config.llm.model = chosen
        # Which cache hints it takes, and whether it counts prompts with the model's tokenizer.
        config.llm.server_kind = "llama.cpp" if server.name == LLAMA_CPP else "vllm" if server.name == VLLM else "other"
        return (
            f"No API key or llm.api_base set: using {server.name} at {server.api_base} with model {chosen}. "
            "Set llm.context_window to the model's context size so prompts fit."
        )
    return None


def no_model_found(config: Config, servers: Sequence[LocalServer], *, tried: Sequence[tuple[str, int]] = KNOWN_SERVERS) -> str:
    """The error when nothing says where the model is and no local server fits: what was tried, and the ways on."""
    ports = ", ".join(f"{name} :{port}" for name, port in tried)
    if servers:
        served = "; ".join(f"{s.name} at {s.api_base} serves {', '.join(s.models) or 'no model'}" for s in servers)
        found = f"the local servers found do not serve llm.model {config.llm.model!r} ({served})"
    else:
        found = f"no local model server answered on 127.0.0.1 (tried {ports})"
    return (
        f"No model to talk to: no API key (llm.api_key, OPENAI_API_KEY), no address (llm.api_base, OPENAI_BASE_URL), and {found}. "
        "Set one of those (e.g. --set llm.api_base=http://localhost:11434/v1 --set llm.model=NAME), start a local server "
        "(`taskweaver-lite models` lists the reachable ones), or try it without a model: `taskweaver-lite demo --chat`."
    )
