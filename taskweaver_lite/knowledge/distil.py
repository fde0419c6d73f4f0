"""A session distilled into tips by the model (`/save`, `POST /api/sessions/{id}/experience`).

The call sees the session's record as text (requests, steps, code, errors, answers), newest
requests kept first when it must shrink to fit the window, and answers with TaskWeaver's two kinds
of tip: error resolutions and user preferences. The reply is read as tolerantly as a role's; one
that cannot be read is an ExperienceError, and nothing is stored.
"""

from __future__ import annotations

from collections.abc import Sequence

from taskweaver_lite.config.settings import DISTILLER, LLMConfig
from taskweaver_lite.errors import ExperienceError, ReplyFormatError
from taskweaver_lite.llm.client import ChatModel
from taskweaver_lite.llm.replies import FieldSpec, ReplySchema, parse_reply
from taskweaver_lite.llm.templates import load_prompt
from taskweaver_lite.llm.tokens import Tokenizer
from taskweaver_lite.records.conversation import Post, Round
from taskweaver_lite.records.model_calls import Message
from taskweaver_lite.records.tips import DISTILLED_KINDS, TipKind

PURPOSE = DISTILLER  # the model call's purpose: routed to experience.llm
REPLY_TOKENS = 800  # a handful of one- or two-sentence tips
PIECE_SHARE = 12  # one message, code or output in the record: at most this fraction of the room
MIN_PIECE_TOKENS = 48

DISTIL_SCHEMA = ReplySchema(
    name="Experience",
    wrapper=None,
    fields={"tips": FieldSpec(kind="list", items={"kind": FieldSpec(choices=DISTILLED_KINDS), "text": FieldSpec()})},
)


def distil(rounds: Sequence[Round], *, model: ChatModel, tokenizer: Tokenizer, llm: LLMConfig) -> list[tuple[TipKind, str]]:
    """The tips the model draws from `rounds`; ExperienceError when there is nothing to read or its reply is unusable."""
    done = [r for r in rounds if r.state != "running" and r.posts]
    if not done:
        raise ExperienceError("this session has no requests yet, so there is nothing to learn from")
    template = load_prompt("experience")
    system = template.render("distil")
    reply_tokens = min(REPLY_TOKENS, llm.reply_reserve)
    room = llm.context_window - reply_tokens - llm.margin - tokenizer.count(system) - MIN_PIECE_TOKENS
    if room < MIN_PIECE_TOKENS * 4:
        raise ExperienceError(f"llm.context_window {llm.context_window} leaves no room to show the model the session; raise it to distil tips")
    record, shown = session_record(done, tokenizer=tokenizer, max_tokens=room)
    messages = [Message(role="system", content=system), Message(role="user", content=template.render("transcript", shown=shown, record=record))]
    completion = model.complete(messages, purpose=PURPOSE, max_tokens=reply_tokens, schema=DISTIL_SCHEMA)
    try:
        if completion.finish_reason == "length":
            raise ReplyFormatError("the reply was cut off at its length limit")
        fields = parse_reply(completion.text, DISTIL_SCHEMA)
    except ReplyFormatError as exc:
        raise ExperienceError(f"the model's tips could not be read ({exc}); nothing was saved and the session is unchanged: try again") from None
    return [(item["kind"], " ".join(item["text"].split())) for item in fields["tips"] if item["text"].strip()]


def session_record(rounds: Sequence[Round], *, tokenizer: Tokenizer, max_tokens: int) -> tuple[str, str]:
    """The rounds as text within `max_tokens` (newest kept when some must go), and which requests it shows."""
    piece = max(MIN_PIECE_TOKENS, max_tokens // PIECE_SHARE)
    kept: list[str] = []
    used = 0
    for rnd in reversed(rounds):
        text = _round_text(rnd, tokenizer=tokenizer, piece_tokens=piece)
        cost = tokenizer.count(text) + 2
        if used + cost > max_tokens:
            if not kept:  # the newest request, cut to fit, rather than nothing
                kept.append(tokenizer.truncate_middle(text, max(max_tokens, MIN_PIECE_TOKENS)))
            break
        kept.append(text)
        used += cost
    first, last = rounds[-len(kept)].index, rounds[-1].index
    shown = f"requests {first}-{last}" if first != last else f"request {last}"
    if len(kept) < len(rounds):
        shown += f"; {len(rounds) - len(kept)} earlier ones left out to fit"
    return "\n\n".join(reversed(kept)), shown


def _round_text(rnd: Round, *, tokenizer: Tokenizer, piece_tokens: int) -> str:
    outcome = "" if rnd.state == "finished" else f" [failed: {rnd.error}]"
    lines = [f"## Request {rnd.index}{outcome}"]
    for post in rnd.posts:
        lines.append(_post_text(post, tokenizer=tokenizer, piece_tokens=piece_tokens))
    return "\n".join(lines)


def _post_text(post: Post, *, tokenizer: Tokenizer, piece_tokens: int) -> str:
    def cut(text: str) -> str:
        return tokenizer.truncate_middle(text.strip(), piece_tokens)

    if post.code is None or post.execution is None:
        return f"{post.send_from} to {post.send_to}: {cut(post.message)}"
    return f"{post.send_from} ran:\n{cut(post.code)}\nResult:\n{cut(post.execution.prompt_text(marked=False))}"
