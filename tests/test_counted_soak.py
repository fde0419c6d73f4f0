"""The soak at an 8k window on a model whose tokenizer makes 1.3 times o200k's tokens (`pytest -m soak`).

The scripted server counts every prompt as such a model would and reports it in each reply's usage:
as a server that can tell its count beforehand (llama.cpp's `/tokenize`), and as one that says it only
afterwards (Ollama, LM Studio...), where the client calibrates on the replies. Either way every
request, folds included, fits the window by the server's count; counted with o200k alone, as before,
the same session goes over it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest
from soak_session import SoakRun, run_soak, summary_gaps

from taskweaver_lite.testing.scripted_server import ScriptedServer

pytestmark = pytest.mark.soak

WINDOW = 8000
ROUNDS = 40
RATIO = 1.3
KINDS = {"exact": {"server_kind": "llama.cpp"}, "calibrated": {"server_kind": "openai"}}
RESERVE = {"reply_reserve": None}  # the default: a quarter of the window, so prompts may take the rest
# Rounds fold only once the unfolded ones pass 90% of the budget: prompts fill it, and folds still come.
PRESSURE: dict[str, dict[str, Any]] = {
    "planner": {"fold_schedule": "pressure"},
    "code_generator": {"fold_schedule": "pressure"},
    "round_compressor": {"fold_token_trigger": 0.9},
}


def fullest(run: SoakRun, server: Mapping[str, Any]) -> float:
    """The largest share of the room its max_tokens leaves in the window that a request's prompt takes, by the server's count."""
    counter = ScriptedServer(token_ratio=RATIO, **server)
    return max(counter.prompt_tokens(r.messages) / (WINDOW - int(r.body["max_tokens"])) for r in run.requests)


def over_the_window(run: SoakRun, server: Mapping[str, Any]) -> list[str]:
    """Requests whose prompt, as the server counts it, plus max_tokens pass the window."""
    counter = ScriptedServer(token_ratio=RATIO, **server)  # counts as the session's server did (not started)
    found = []
    for number, request in enumerate(run.requests):
        prompt, reply = counter.prompt_tokens(request.messages), int(request.body["max_tokens"])
        if prompt + reply > WINDOW:
            found.append(f"request {number} ({request.role}): {prompt:,} + max_tokens {reply:,} > {WINDOW:,}")
    return found


@pytest.fixture(scope="module", params=sorted(KINDS))
def counted(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, SoakRun]:
    options = {**KINDS[request.param], "token_ratio": RATIO}
    settings: dict[str, dict[str, Any]] = {"llm": RESERVE, **PRESSURE}
    return request.param, run_soak(tmp_path_factory.mktemp("counted"), rounds=ROUNDS, window=WINDOW, settings=settings, server_options=options)


def test_every_request_folds_included_fits_the_window_by_the_servers_count(counted: tuple[str, SoakRun]) -> None:
    kind, run = counted
    assert not run.failed_rounds, run.failed_rounds[:3]
    assert any(r.role == "compression" for r in run.requests), "precondition: the session folded"
    assert not over_the_window(run, KINDS[kind]), over_the_window(run, KINDS[kind])[:5]
    assert not summary_gaps(run)
    assert fullest(run, KINDS[kind]) > 0.9, "precondition: prompts come near the window"


def test_counted_with_o200k_alone_the_same_session_goes_over(tmp_path_factory: pytest.TempPathFactory) -> None:
    server = KINDS["calibrated"]
    settings: dict[str, dict[str, Any]] = {"llm": {"token_counting": "tokenizer", **RESERVE}, **PRESSURE}
    run = run_soak(tmp_path_factory.mktemp("old"), rounds=ROUNDS, window=WINDOW, settings=settings, server_options={**server, "token_ratio": RATIO})
    assert over_the_window(run, server), "the test above would hold without counting in the model's tokens"
