"""The prompt-cache claims checked against llama.cpp's own server (`pytest -m llama`).

`.ci/llama-server.sh` builds `llama-server` from the llama-cpp-python source distribution (it
vendors llama.cpp) and keeps GPT-2's vocabulary file from the same tree beside it. The tests write
a tiny model with random weights and that vocabulary (the `gguf` package), start the server on
127.0.0.1, and run a real session with `llm.prompt_cache: auto` through the scripted server: the
scripted model writes every reply (a random model cannot write our JSON) while each request, as
the client sent it, goes to llama-server too, whose `usage` and `timings` come back to the client.
Nothing is downloaded; without the built server the tests skip, saying how to build it.
"""

from __future__ import annotations

import importlib.util
import json
import socket
import sqlite3
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from soak_session import SoakModel, open_soak_session, user_request, wait_for_folds

from taskweaver_lite.llm.counting import ServerTokens, model_tokenizer
from taskweaver_lite.llm.tokens import get_tokenizer
from taskweaver_lite.testing.llama_server import built_server, gpt2_vocabulary, server_path
from taskweaver_lite.testing.scripted_server import ScriptedRequest, ScriptedServer, detect_role

# A session of 24 requests per fold schedule against a CPU-bound server, each prompt also counted by it:
# a minute per session on a loaded machine.
pytestmark = [pytest.mark.llama, pytest.mark.timeout(300)]

SLOTS = 4
SLOT_CONTEXT = 16_384  # tokens per slot: an 8k-window prompt in GPT-2's tokens, with room
ROUNDS = 24
WINDOW = 8000  # llm.context_window: a local model's, counted in its own (GPT-2's) tokens
EMBED, FFN, HEADS = 64, 128, 2
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def built() -> tuple[Path, Path]:
    """The server binary and the vocabulary file, or a skip saying how to build them."""
    binary, vocab = built_server(), gpt2_vocabulary()
    if binary is None or not vocab.is_file():
        pytest.skip(f"llama-server is not built at {server_path()}: run .ci/llama-server.sh (it builds once, CPU only, and caches it)")
    return binary, vocab


def write_tiny_model(path: Path, vocab: Path) -> None:
    """A one-layer llama with random weights and GPT-2's vocabulary and merges: a few MB, written in a second."""
    import gguf
    import numpy as np

    reader = gguf.GGUFReader(vocab)
    tokens = [bytes(reader.fields["tokenizer.ggml.tokens"].parts[i]) for i in reader.fields["tokenizer.ggml.tokens"].data]
    merges = [bytes(reader.fields["tokenizer.ggml.merges"].parts[i]).decode() for i in reader.fields["tokenizer.ggml.merges"].data]
    types = [int(reader.fields["tokenizer.ggml.token_type"].parts[i][0]) for i in reader.fields["tokenizer.ggml.token_type"].data]
    eos = int(reader.fields["tokenizer.ggml.eos_token_id"].parts[-1][0])
    writer = gguf.GGUFWriter(str(path), "llama")
    for add, value in (
        (writer.add_block_count, 1),
        (writer.add_context_length, SLOT_CONTEXT),
        (writer.add_embedding_length, EMBED),
        (writer.add_feed_forward_length, FFN),
        (writer.add_head_count, HEADS),
        (writer.add_head_count_kv, HEADS),
        (writer.add_rope_dimension_count, EMBED // HEADS),
        (writer.add_bos_token_id, eos),
        (writer.add_eos_token_id, eos),
    ):
        add(value)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt-2")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    writer.add_chat_template(CHATML)
    rng = np.random.default_rng(0)
    shapes = {"token_embd.weight": (len(tokens), EMBED), "output_norm.weight": (EMBED,), "blk.0.attn_norm.weight": (EMBED,)}
    shapes |= {f"blk.0.attn_{p}.weight": (EMBED, EMBED) for p in ("q", "k", "v", "output")}
    shapes |= {"blk.0.ffn_norm.weight": (EMBED,), "blk.0.ffn_gate.weight": (FFN, EMBED), "blk.0.ffn_up.weight": (FFN, EMBED)}
    shapes |= {"blk.0.ffn_down.weight": (EMBED, FFN)}
    for name, shape in shapes.items():
        writer.add_tensor(name, (rng.standard_normal(shape) * 0.02).astype(np.float32) if len(shape) > 1 else np.ones(shape, np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def post(url: str, body: dict[str, Any]) -> dict[str, Any]:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as response:
        data: dict[str, Any] = json.loads(response.read())
    return data


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """llama-server on the tiny model, on a free port of 127.0.0.1, with SLOTS slots; stopped after the module."""
    binary, vocab = built()
    model = tmp_path_factory.mktemp("llama") / "tiny.gguf"
    write_tiny_model(model, vocab)
    port = free_port()
    command = [str(binary), "-m", str(model), "--host", "127.0.0.1", "--port", str(port), "-c", str(SLOTS * SLOT_CONTEXT), "-np", str(SLOTS), "-t", "1"]
    log = (model.parent / "server.log").open("w")
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(f"{base}/health", timeout=2) as response:
                    if response.status == 200:
                        break
            except (urllib.error.URLError, OSError):
                pass
            if process.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"llama-server did not start: see {log.name}")
            time.sleep(0.2)
        yield base
    finally:
        process.terminate()
        process.wait(timeout=30)
        log.close()


@dataclass
class Forwarder:
    """Sends each request to llama-server as the client sent it (its hints included), one token of reply."""

    base: str
    bodies: list[dict[str, Any]] = field(default_factory=list)
    timings: list[dict[str, Any]] = field(default_factory=list)
    usages: list[dict[str, Any]] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)

    def __call__(self, body: dict[str, Any]) -> dict[str, Any]:
        sent = {k: v for k, v in body.items() if k not in ("stream", "stream_options", "response_format", "max_tokens", "max_completion_tokens")}
        try:
            reply = post(f"{self.base}/v1/chat/completions", {**sent, "max_tokens": 1, "stream": False})
        except urllib.error.HTTPError as exc:
            self.refused.append(f"HTTP {exc.code}: {exc.read()[:300]!r}")
            return {}
        self.bodies.append(body)
        self.timings.append(reply["timings"])
        self.usages.append(reply["usage"])
        return {"usage": reply["usage"], "timings": reply["timings"]}


@dataclass(frozen=True)
class LlamaRun:
    requests: tuple[ScriptedRequest, ...]
    forwarded: Forwarder
    stored: tuple[tuple[str, int], ...]  # (purpose, cached_tokens) per call, as the store keeps them


@pytest.fixture(scope="module", params=["rounds", "pressure"])
def run(llama: str, tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> LlamaRun:
    """A real session at an 8k window with `llm.prompt_cache: auto` under each fold schedule, every request also sent to llama-server."""
    forwarded = Forwarder(llama)
    # The client counts its prompts with llama-server's own tokenizer (GPT-2's) through the scripted server.
    with ScriptedServer(server_kind="llama.cpp", slots=SLOTS, forward=forwarded, counts_at=llama) as server:
        SoakModel().install(server)
        role = {"fold_schedule": request.param}
        settings = {"llm": {"prompt_cache": "auto", "reply_reserve": None}, "planner": role, "code_generator": role}
        with open_soak_session(tmp_path_factory.mktemp("session"), server, window=WINDOW, settings=settings) as session:
            for n in range(1, ROUNDS + 1):
                assert session.ask(user_request(n)).state == "finished"
                wait_for_folds(session, after_round=n)
            session_id, store_path = session.id, session.config.store_path
        requests = tuple(server.requests)
    with sqlite3.connect(store_path) as db:
        stored = db.execute("SELECT purpose, cached_tokens FROM model_calls WHERE session_id = ? ORDER BY rowid", (session_id,)).fetchall()
    return LlamaRun(requests, forwarded, tuple((str(p), int(c)) for p, c in stored))


def test_the_server_takes_every_hint_we_send(run: LlamaRun) -> None:
    assert not run.forwarded.refused, f"llama-server refused requests: {run.forwarded.refused[:3]}"
    hinted = run.forwarded.bodies[1:]  # the first reply's timings tell the client the server's kind
    assert hinted and all(body.get("cache_prompt") is True for body in hinted), "a request went without cache_prompt"
    assert all("id_slot" in b for b in hinted), "a request went without id_slot though the server has slots"
    by_slot: dict[int, set[str]] = {}
    for body in hinted:
        by_slot.setdefault(int(body["id_slot"]), set()).add(purpose_of(body["messages"]))
    assert set(by_slot) <= set(range(SLOTS)), f"a slot the server does not have: {sorted(by_slot)}"
    assert by_slot.get(0, set()) - {"planner", "compression_planner"} == set(), f"slot 0 is the Planner's and its folds': {by_slot[0]}"
    assert by_slot.get(1, set()) - {"code_generator", "compression_code_generator"} == set(), f"slot 1 is the CodeGenerator's: {by_slot[1]}"
    folds = [b for b in hinted if purpose_of(b["messages"]).startswith("compression_")]
    assert folds, "precondition: the session folded"
    for body in folds:
        shared = body["id_slot"] in (0, 1)
        opens_as_role = "ConversationSummary" not in str(body["messages"][0]["content"])
        assert shared == opens_as_role, "a fold takes its role's slot exactly when it opens with the role's prompt"


def test_every_request_folds_included_is_counted_as_llama_server_counts_it_and_fits_the_window(run: LlamaRun, llama: str) -> None:
    assert len(run.forwarded.usages) == len(run.requests), "every request went to llama-server too"
    counter = model_tokenizer(tokenizer="o200k_base", api_base=f"{llama}/v1", model="tiny", server_kind="llama.cpp", counting="auto")
    counter.use_server(ServerTokens("llama.cpp", api_base=f"{llama}/v1", api_key="", model="tiny"))
    over, off = [], []
    try:
        for body, usage in zip(run.forwarded.bodies, run.forwarded.usages, strict=True):
            served, reply = int(usage["prompt_tokens"]), int(body["max_tokens"])
            ours = counter.count_messages(body["messages"])
            if not served <= ours <= served + 2:
                off.append(f"{purpose_of(body['messages'])}: we count {ours:,}, llama-server {served:,}")
            if served + reply > WINDOW:
                over.append(f"{purpose_of(body['messages'])}: {served:,} prompt tokens + max_tokens {reply:,} > {WINDOW:,}")
    finally:
        counter.close()
    assert not off, off[:5]
    assert not over, over
    assert any(purpose_of(b["messages"]).startswith("compression_") for b in run.forwarded.bodies), "precondition: the session folded"
    o200k = get_tokenizer()
    assert sum(int(u["prompt_tokens"]) for u in run.forwarded.usages) > 1.05 * sum(o200k.count_messages(b["messages"]) for b in run.forwarded.bodies), (
        "precondition: this model makes more tokens than o200k"
    )


def purpose_of(messages: list[dict[str, Any]]) -> str:
    """A request's purpose as the store names it: a fold's role is named in its instruction (its last message)."""
    role = detect_role(messages)
    if role != "compression":
        return role
    return "compression_code_generator" if "CodeGenerator" in str(messages[-1]["content"]) else "compression_planner"


def test_the_cached_tokens_stored_per_call_are_the_servers_cache_n(run: LlamaRun) -> None:
    # Per purpose, in order: the two roles' folds run at once, so the calls of different purposes interleave.
    server_said: dict[str, list[int]] = {}
    for body, timings in zip(run.forwarded.bodies, run.forwarded.timings, strict=True):
        server_said.setdefault(purpose_of(body["messages"]), []).append(int(timings["cache_n"]))
    stored: dict[str, list[int]] = {}
    for purpose, cached in run.stored:
        stored.setdefault(purpose, []).append(cached)
    assert sum(map(sum, server_said.values())) > 0, "precondition: the server reused cached prompts"
    assert stored == server_said


def bench_ledger() -> Any:
    """bench/prefix_ledger.py, the bench's own count of what a cache can reuse (bench/ is no package)."""
    path = Path(__file__).resolve().parent.parent / "bench" / "prefix_ledger.py"
    spec = importlib.util.spec_from_file_location("prefix_ledger", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("prefix_ledger", module)  # its dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


def test_the_reuse_the_server_reports_is_the_bench_prediction_within_3_points(run: LlamaRun) -> None:
    ledger = bench_ledger().PrefixLedger(get_tokenizer())
    assert len(run.requests) == len(run.forwarded.bodies), "every request went to llama-server too"
    for request in run.requests:
        purpose = purpose_of(request.messages)
        # Whose previous request shares the slot it went to: its role's, or, for a fold on the separate
        # prompt (a slot of its own), its own.
        slot = {0: "planner", 1: "code_generator"}.get(request.body.get("id_slot", -1), purpose.removeprefix("compression_"))
        slot = slot if request.body.get("id_slot", 0) in (0, 1) else purpose
        ledger.add(purpose, bench_ledger().as_messages(request.messages), slot=slot)
    predicted = sum(t.shared_previous for name, t in ledger.tallies.items() if name != "all requests") / ledger.tallies["all requests"].prompt
    cached = sum(int(t["cache_n"]) for t in run.forwarded.timings)
    computed = sum(int(t["prompt_n"]) for t in run.forwarded.timings)
    reported = cached / (cached + computed)
    assert abs(reported - predicted) <= 0.03, f"llama-server reused {reported:.1%} of the prompt tokens; the bench predicts {predicted:.1%}"
