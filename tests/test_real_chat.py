"""A chat of three requests on the bundled sample data, every reply written by a real model (`pytest -m real`).

SmolLM2-135M-Instruct on llama.cpp's server, through the real Session, the real client and a real
kernel, with `llm.structured: auto`: each reply is held to its role's schema by the server's grammar.
What is checked is the plumbing, not the answers (a 135M model's numbers are mostly made up): no
request fails on its format, code reaches the kernel, and the session is stored and resumes with its
cells replayed. A request whose replies keep running past the output limit (the model rambling inside
a string, which no schema forbids) is a length failure, not a format one: it is allowed here, and the
bench counts it (`bench/structured_bench.py`).

The project is the bundled one without the Planner's few-shot transcript: with the schema sent it is
not needed to show the format, and this model copies it (its file, its numbers, its final answer to
the user) instead of delegating. Measured on this model, the first Planner reply with the example:
2 of 12 delegated and 5 of 12 rambled to the length limit; without it, 3 of 6 and none. The
CodeGenerator keeps an example: without one, its replies rambled to the length limit. Its example is
the bundled one's on the sample data's own file and columns (tests/data/real_chat): this model copies
its example more often than it writes code, and a copy of the bundled one read a file that is not
there, so no cell of the chat ever succeeded and the resumed session had nothing to replay. A copy
of this one runs, so the check that a resume rebuilds the kernel from the stored cells has a cell.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
from real_chat import REQUESTS, run_chat, sample_project

from taskweaver_lite.session.assembly import resume_session
from taskweaver_lite.testing.llama_server import LlamaServer

pytestmark = pytest.mark.real

CODER_EXAMPLE = Path(__file__).parent / "data" / "real_chat" / "01_load_and_summarize.yaml"

# The first request names the role that runs code: asked for a total, this model mostly answers with the
# file list instead of delegating (none of three requests ran code in two runs of the bench's requests).
# What reaches the kernel is the plumbing under test, not the model's judgement.
ASKED = ("Ask the CodeInterpreter to print the total revenue in sales.csv.", *REQUESTS[1:])
# One repair turn per request, not the default three: with the schema sent no reply here broke the format,
# and what the repair turns were spent on was replies cut off at the output limit (8 of 9 cut-off replies in
# a run with three), each 256 tokens of generation that cannot change the outcome. One is still a turn
# that a reply in a broken format would have to get right, so a format failure shows sooner, not later.
# The server's kind is named, so that the first request already goes to the Planner's slot (asked to
# detect it, the client learns it from the first reply, whose prompt the CodeGenerator then overwrites).
SETTINGS: dict[str, dict[str, Any]] = {"session": {"max_repair_attempts": 1}, "llm": {"server_kind": "llama.cpp"}}


@pytest.mark.timeout(1800)  # three requests of a real model on two shared cores: 12.5 minutes at a load average of 16
def test_three_requests_on_the_sample_data_none_failing_on_format_with_code_run_stored_and_resumed(smollm2_server: LlamaServer, tmp_path: Path) -> None:
    project = sample_project(tmp_path, smollm2_server, structured="auto", planner_examples=False, settings=SETTINGS)
    shutil.copy(CODER_EXAMPLE, project / "examples" / "code_generator" / CODER_EXAMPLE.name)
    chat = run_chat(project, ASKED)
    assert len(chat.rounds) == len(ASKED)
    assert not chat.format_failures, f"requests failed on their format with the schema sent: {[r.error for r in chat.format_failures]}"
    assert chat.cells >= 1, f"no code reached the kernel in {len(ASKED)} requests: {[r.answer for r in chat.rounds]}"
    session, report = resume_session(chat.config, chat.session_id)
    with session:
        assert report.rounds == len(ASKED), "the stored session lost requests"
        ran = sum(1 for r in chat.rounds for p in r.posts if p.execution is not None and p.execution.success)
        assert ran >= 1, f"no cell of the chat succeeded, so the resume had nothing to replay: {[r.answer for r in chat.rounds]}"
        assert (report.replayed, report.replay_failures) == (ran, 0), "the kernel was not rebuilt from the stored cells"
        assert [r.user_query for r in session.conversation.rounds][-len(ASKED) :] == list(ASKED)
