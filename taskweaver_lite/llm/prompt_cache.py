"""Cache hints: the request fields that tell a server which earlier prompt a new one extends.

Servers keep the prompts they have seen and skip the prefix a new prompt shares with one of them.
Some can be told where to look (`llm.prompt_cache: auto`, the default; `off` sends nothing):

- OpenAI's API (and the servers that copy it) takes `prompt_cache_key`: requests with the same key
  go to the same cache. The key names the session and the call's purpose (a role, or a role's
  folds), so each role's prompts meet their own earlier prompts. A role's folds that open with the
  role's own prompt (`<role>.fold_prompt: role`) share the role's key (`share`).
- llama.cpp's server keeps one prompt per slot: `cache_prompt: true` asks it to reuse it, and
  `id_slot` gives each purpose its own slot once the server has said it has enough of them
  (`GET /props`, `total_slots`); an `id_slot` the server does not have would wait forever there.
  A purpose shared with a role takes the role's slot: the slot holds the role's prompt, the start
  of the fold's.

A shared purpose goes to its role's key or slot only when its request opens with the system message
the role last sent: a fold that fell back to its own prompt shares nothing with the role's, and in
the role's llama.cpp slot it would only evict the role's prefix, so it keeps a key and slot of its own.

The server's kind comes from `llm.server_kind` (local discovery fills it in), from the address
(api.openai.com), or from a reply that carries llama.cpp's `timings`. A field a server refuses
(HTTP 400 naming it) is dropped for the rest of the client's life and the request sent again.
"""

from __future__ import annotations

import json
import threading
import urllib.request
from collections.abc import Callable
from typing import Any, Literal
from urllib.parse import urlsplit

ServerKind = Literal["auto", "openai", "llama.cpp", "vllm", "other"]
OPENAI_HOST = "api.openai.com"
PROPS_TIMEOUT = 2.0  # seconds: /props is answered from memory
# Purposes in the order they get llama.cpp slots: the roles' own calls first, then their folds.
SLOT_ORDER = ("planner", "code_generator")

PropsReader = Callable[[str], dict[str, Any] | None]


def read_props(api_base: str, *, api_key: str = "", timeout: float = PROPS_TIMEOUT) -> dict[str, Any] | None:
    """llama.cpp's `GET /props` (at the server's root, beside /v1) as JSON, or None when it does not answer."""
    root = api_base.rstrip("/").removesuffix("/v1")
    request = urllib.request.Request(f"{root}/props", headers={"Authorization": f"Bearer {api_key}"} if api_key else {})
    local = urlsplit(root).hostname in ("127.0.0.1", "localhost")
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({} if local else None))  # a local address is never proxied
    try:
        with opener.open(request, timeout=timeout) as response:
            data = json.loads(response.read(1_000_000))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


class PromptCache:
    """The cache hints one client sends, learned as its server answers. Safe to use from several threads."""

    def __init__(self, *, mode: Literal["auto", "off"], kind: ServerKind, api_base: str, props: PropsReader | None = None) -> None:
        self._on = mode == "auto"
        self._kind: ServerKind = kind if kind != "auto" else ("openai" if urlsplit(api_base).hostname == OPENAI_HOST else "auto")
        self._api_base = api_base
        self._props = props if props is not None else read_props
        self._lock = threading.Lock()
        self._scope = "session"
        self._refused: set[str] = set()
        self._slots: int | None = None  # llama.cpp's slot count, once asked
        self._slot_of: dict[str, int] = {}
        self._owner: dict[str, str] = {}  # purpose -> the purpose whose key and slot it uses
        self._opening: dict[str, int] = {}  # purpose -> hash of the system message it last sent

    @property
    def kind(self) -> ServerKind:
        """The server's kind as known so far ("auto": not known yet)."""
        with self._lock:
            return self._kind

    def scope(self, name: str) -> None:
        """Name the session the keys belong to (one key per session and purpose)."""
        with self._lock:
            self._scope = name

    def hints(self, purpose: str, *, opening: str = "") -> dict[str, Any]:
        """The fields to add to a request for `purpose` whose first message is `opening`: none when off,
        only those the server takes. A shared purpose uses its owner's key or slot when it opens as the
        owner last did, its own otherwise."""
        if not self._on:
            return {}
        if self.kind == "llama.cpp" and self._slots is None:
            self._ask_slots()  # once, outside the lock: the other threads' hints need not wait for it
        with self._lock:
            owner = self._owner.get(purpose)
            if owner is None:
                self._opening[purpose] = hash(opening)
            elif self._opening.get(owner) == hash(opening):
                purpose = owner
            fields: dict[str, Any] = {}
            if self._kind == "llama.cpp":
                fields["cache_prompt"] = True
                slot = self._slot(purpose)
                if slot is not None:
                    fields["id_slot"] = slot
            else:
                fields["prompt_cache_key"] = f"taskweaver-lite/{self._scope}/{purpose}"
            return {name: value for name, value in fields.items() if name not in self._refused}

    def share(self, purpose: str, owner: str) -> None:
        """Send `purpose`'s requests with `owner`'s key and slot (a fold whose prompt opens with its role's)."""
        with self._lock:
            self._owner[purpose] = owner

    def refuse(self, field: str) -> None:
        """The server answered 400 naming `field`: never send it again."""
        with self._lock:
            self._refused.add(field)

    def learn(self, *, llama_timings: bool) -> None:
        """After a reply: one with llama.cpp's `timings` makes the server llama.cpp's (its slots are asked once)."""
        if not self._on or not llama_timings:
            return
        with self._lock:
            if self._kind not in ("auto", "other"):
                return
            self._kind = "llama.cpp"
        self._ask_slots()

    def _ask_slots(self) -> None:
        props = self._props(self._api_base)
        slots = props.get("total_slots") if props else None
        with self._lock:
            self._slots = slots if isinstance(slots, int) and slots > 0 else 0

    def _slot(self, purpose: str) -> int | None:
        """This purpose's llama.cpp slot, or None (the lock is held): the roles take the first slots, other purposes the next in the order first seen."""
        if purpose not in self._slot_of:
            taken = [p for p in self._slot_of if p not in SLOT_ORDER]
            self._slot_of[purpose] = SLOT_ORDER.index(purpose) if purpose in SLOT_ORDER else len(SLOT_ORDER) + len(taken)
        slot, slots = self._slot_of[purpose], self._slots or 0
        # One slot is the server's default: naming it changes nothing. A purpose past the last slot gets
        # none rather than another purpose's (it would evict that role's prompt).
        return slot if slots > 1 and slot < slots else None
