"""Prompt counting on a real model's tokenizer: the server's count against the budget's, old counting and new, in one run.

SmolLM2-135M-Instruct on llama.cpp's own server (`.ci/llama-server.sh`, `.ci/smollm2.sh`) counts. The
long scripted session of the soak (`tests/soak_session.py`: real Session, kernel and openai client,
an 8k window, a quarter of it for replies, rounds folded once the unfolded ones pass 90% of the budget,
so that prompts fill it) runs three times against the scripted server, whose replies report the
real server's count of each request as their usage and which passes llama.cpp's `/tokenize` and
`/apply-template` on to it:

- old: every prompt counted with o200k (`llm.token_counting: tokenizer`), the counting before this;
- calibrated: o200k times the worst ratio the replies' usage showed (`llm.token_counting: calibrated`,
  what Ollama and other servers that cannot count get);
- new: the server's own tokenizer (`llm.token_counting: auto` on llama.cpp).

For each run, over every request (folds included): the server's count against what the budget guard
counted (mean and worst), the worst share of the window a request takes by the server's count
(prompt + max_tokens), and the requests over the window. Then the cost of exact counting: the
session's prompts counted again in order, as a session counts them, by the server (its texts
remembered) against o200k, in milliseconds and round trips per request.

Run: .venv/bin/python bench/tokenizer_bench.py [--rounds 40]   (several minutes; needs a kernel)
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, cast

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from taskweaver_lite.llm.counting import ModelTokenizer, ServerTokens, model_tokenizer
from taskweaver_lite.llm.tokens import get_tokenizer
from taskweaver_lite.records.model_calls import Message
from taskweaver_lite.testing.llama_server import LlamaServer, built_server, llama_server, missing, smollm2

WINDOW = 8000
MODES = ("tokenizer", "calibrated", "auto")
LABELS = {"tokenizer": "old: o200k", "calibrated": "calibrated o200k", "auto": "new: server's tokenizer"}


def server_count(server: LlamaServer, messages: list[dict[str, Any]]) -> int:
    """The prompt's tokens as llama-server feeds them to the model: its chat template, then its tokenizer."""
    listed = [{"role": m["role"], "content": m["content"]} for m in messages]
    prompt = server.post("/apply-template", {"messages": listed})["prompt"]
    return len(server.post("/tokenize", {"content": prompt, "add_special": True, "parse_special": True})["tokens"])


def run(server: LlamaServer, mode: str, rounds: int) -> dict[str, Any]:
    """The soak with prompts counted by `mode`: per reply the server's count and the budget guard's; per request its share of the window."""
    import soak_session as soak  # from tests/, put on sys.path above

    counted: list[tuple[int, int]] = []  # (the server's count, ours) per reply, as the client sets one against the other
    observe = ModelTokenizer.observe

    def recording(self: ModelTokenizer, messages: Any, *, server_tokens: int, allowed: int, what: str) -> Any:
        counted.append((server_tokens, self.count_messages(messages)))  # before this reply moves the ratio
        return observe(self, messages, server_tokens=server_tokens, allowed=allowed, what=what)

    ModelTokenizer.observe = recording  # type: ignore[method-assign]
    try:
        with tempfile.TemporaryDirectory() as root:
            done = soak.run_soak(
                Path(root),
                rounds=rounds,
                window=WINDOW,
                settings={
                    "llm": {"token_counting": mode, "model": "smollm2", "reply_reserve": None},
                    # Rounds fold once the unfolded ones pass 90% of the budget: prompts fill it, folds still come.
                    "planner": {"fold_schedule": "pressure"},
                    "code_generator": {"fold_schedule": "pressure"},
                    "round_compressor": {"fold_token_trigger": 0.9},
                },
                server_options={"server_kind": "llama.cpp", "counts_at": server.base},
            )
    finally:
        ModelTokenizer.observe = observe  # type: ignore[method-assign]
    shares = [(server_count(server, r.messages) + int(r.body["max_tokens"])) / WINDOW for r in done.requests]
    return {"counted": counted, "shares": shares, "failed": len(done.failed_rounds), "requests": done.requests, "seconds": done.seconds}


def cost(server: LlamaServer, requests: Any) -> dict[str, float]:
    """Per request, counting the session's prompts in order (texts remembered) by the server and by o200k:
    milliseconds of wall time and of this thread's CPU, and the server's round trips."""
    o200k = get_tokenizer("o200k_base")
    fresh_o200k = type(o200k)(o200k.name, backend=o200k._bpe)  # its own cache, empty, as a new session's
    tokens = ServerTokens("llama.cpp", api_base=f"{server.base}/v1", api_key="", model="smollm2")
    exact = model_tokenizer(tokenizer="o200k_base", api_base=f"{server.base}/v1", model="smollm2", server_kind="llama.cpp", counting="auto")
    exact.use_server(tokens)
    timings = {}
    for name, counter in (("server", exact), ("o200k", fresh_o200k)):
        started, cpu = time.perf_counter(), time.thread_time()
        for request in requests:
            counter.count_messages(cast("list[Message]", request.messages))
        timings[name] = (time.perf_counter() - started) / len(requests) * 1000
        timings[f"{name} cpu"] = (time.thread_time() - cpu) / len(requests) * 1000
    exact.close()
    return {**timings, "trips": tokens.requests / len(requests)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=40, help="requests in the session (each makes a few model calls)")
    args = parser.parse_args()
    binary, model = built_server(), smollm2()
    if binary is None or model is None:
        sys.exit(missing())
    with llama_server(binary, model, slots=1) as server:
        print(f"SmolLM2-135M-Instruct on llama-server; the soak, {args.rounds} requests, llm.context_window {WINDOW:,}\n")
        head = f"{'counting':<26}{'requests':>9}{'server/budget mean':>20}{'worst':>8}{'worst of window':>17}{'over window':>13}"
        print(f"{head}{'failed rounds':>15}{'session s':>11}")
        results = {}
        for mode in MODES:
            result = results[mode] = run(server, mode, args.rounds)
            ratios = [served / ours for served, ours in result["counted"]]
            shares = result["shares"]
            over = sum(1 for share in shares if share > 1.0)
            print(
                f"{LABELS[mode]:<26}{len(shares):>9}{statistics.fmean(ratios):>20.3f}{max(ratios):>8.3f}{max(shares):>17.3f}{over:>13}"
                f"{result['failed']:>15}{result['seconds']:>11.1f}"
            )
        spent = cost(server, results["auto"]["requests"])
        print(
            f"\ncounting a prompt, in the session's order: {spent['server']:.2f} ms by the server's tokenizer against {spent['o200k']:.2f} ms "
            f"by o200k ({spent['server'] / max(spent['o200k'], 1e-9):.1f}x), {spent['trips']:.1f} round trips to the server per request; "
            f"CPU of ours {spent['server cpu']:.2f} ms against {spent['o200k cpu']:.2f} ms"
        )
        assert max(results["auto"]["shares"]) <= 1.0, "a request over the window with the new counting"


if __name__ == "__main__":
    main()
