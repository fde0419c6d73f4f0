"""A long session's every request fits a real model's window by that model's own count (`pytest -m real`).

The scripted model writes the replies (a 135M model cannot hold a long analysis together), while the
client counts its prompts with SmolLM2's tokenizer on llama.cpp's own server and every reply's usage is
that server's count of the request: the session runs at an 8k window as a local model's would, folds
included, and each request is checked against the server's `/apply-template` and `/tokenize`.
"""

from __future__ import annotations

from typing import Any

import pytest
from soak_session import SoakRun, run_soak, summary_gaps

from taskweaver_lite.testing.llama_server import LlamaServer

pytestmark = pytest.mark.real

WINDOW = 8000
ROUNDS = 30
# A quarter of the window for replies, and rounds folded only once the unfolded ones pass 90% of the
# budget: prompts fill what is left, and folds still come.
SETTINGS: dict[str, dict[str, Any]] = {
    "llm": {"reply_reserve": None},
    "planner": {"fold_schedule": "pressure"},
    "code_generator": {"fold_schedule": "pressure"},
    "round_compressor": {"fold_token_trigger": 0.9},
}


def server_count(server: LlamaServer, messages: list[dict[str, str]]) -> int:
    """The prompt's tokens as the server feeds them to the model: its chat template, then its tokenizer."""
    prompt = server.post("/apply-template", {"messages": [{"role": m["role"], "content": m["content"]} for m in messages]})["prompt"]
    return len(server.post("/tokenize", {"content": prompt, "add_special": True, "parse_special": True})["tokens"])


@pytest.fixture(scope="module")
def soak(smollm2_server: LlamaServer, tmp_path_factory: pytest.TempPathFactory) -> SoakRun:
    options = {"server_kind": "llama.cpp", "counts_at": smollm2_server.base}
    return run_soak(tmp_path_factory.mktemp("real-soak"), rounds=ROUNDS, window=WINDOW, settings=SETTINGS, server_options=options)


def test_every_request_folds_included_fits_the_window_by_the_real_models_count(soak: SoakRun, smollm2_server: LlamaServer) -> None:
    assert not soak.failed_rounds, soak.failed_rounds[:3]
    over, fullest = [], 0.0
    for number, request in enumerate(soak.requests):
        prompt, reply = server_count(smollm2_server, request.messages), int(request.body["max_tokens"])
        fullest = max(fullest, prompt / (WINDOW - reply))
        if prompt + reply > WINDOW:
            over.append(f"request {number} ({request.role}): {prompt:,} + max_tokens {reply:,} > {WINDOW:,}")
    assert not over, over
    assert any(r.role == "compression" for r in soak.requests), "precondition: the session folded"
    assert fullest > 0.9, f"precondition: prompts come near the window (at most {fullest:.0%} of the room max_tokens leaves)"


def test_compression_keeps_its_promises_when_counted_in_the_models_tokens(soak: SoakRun) -> None:
    assert not summary_gaps(soak)
