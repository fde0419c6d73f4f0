"""A scripted model for the shipped evaluation cases: agent, examiner and judge, offline.

`taskweaver-lite eval --scripted` and the tests point every model at a `ScriptedServer` answered by
these responders. They read what they are sent, as the demo's script does: the Planner delegates
each request to code and answers from what the code printed; the CodeGenerator writes code for the
instructions the shipped cases lead to; the examiner plays a case's brief (a running sum over N
rounds, or one request and the column it is asked for); the judge checks that the numbers (else the
quoted words, else the names) of a statement appear in what the agent said, and says no to anything
it cannot check that way. The scores are therefore earned by
code that really ran; what changes between settings is what the prompts cost (the scripted server
reports cached prompt tokens as a server's prefix cache would). What it cannot play (a request
outside its script, a statement it cannot check) it says with `CANNOT_PLAY`, and the run is
reported as not played rather than scored.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from taskweaver_lite.eval.outcome import CANNOT_PLAY
from taskweaver_lite.testing.scripted_server import ScriptedServer, code_reply, last_user_text, planner_reply, summary_reply, text_reply

STOP_WORD = "TASK_FINISHED"
_REPORT = "CodeInterpreter:"
_RETRIEVED = "DocumentRetriever:"
_RETRIEVER_INTRO = "## The DocumentRetriever"  # the Planner's prompt has a section per enabled role
_CODER_INTRO = "## The CodeInterpreter"
_EXAMINER_MARK = "You are testing a data-analysis assistant"
_JUDGE_MARK = "You mark an assistant's work"


def scripted_eval_server() -> ScriptedServer:
    """A started scripted server answering the agent's roles, the folds, the examiner and the judge."""
    server = ScriptedServer()
    server.set_default("planner", planner)
    server.set_default("code_generator", code_generator)
    server.set_default("compression", fold)
    server.set_default("other", examiner_or_judge)
    return server.start()


def planner(messages: list[dict[str, Any]]) -> str:
    """Delegate a new request to code (to the DocumentRetriever where it is the only helper); answer the user from the report."""
    text = last_user_text(messages)
    if text.startswith(_RETRIEVED):
        found = text.removeprefix(_RETRIEVED).strip() or "The documents say nothing about it."
        return planner_reply(found, send_to="User", plan="1. Report what the documents say")
    if text.startswith(_REPORT):
        output = _between(text, "<data>", "</data>")
        answers = [line.removeprefix("answer:").strip() for line in output.splitlines() if line.startswith("answer:")]
        message = "\n".join(answers) or (output.strip() or "The code ran, and printed nothing.")
        return planner_reply(message, send_to="User", plan="1. Report the result")
    # The Planner's request message may carry a bracketed note on the working folder's files after the user's words.
    lines = [line for line in text.strip().splitlines() if line.strip() and not line.startswith("[")]
    request = lines[-1] if lines else ""
    system = str(messages[0].get("content", "")) if messages else ""
    if _RETRIEVER_INTRO in system and _CODER_INTRO not in system:
        return planner_reply(request, send_to="DocumentRetriever", plan="1. Find what the documents say\n2. Report it")
    return planner_reply(f"Write and run code for this request: {request}", plan="1. Run code for the request\n2. Report the result")


def code_generator(messages: list[dict[str, Any]]) -> str:
    """Code for the instructions the shipped cases lead to; a plain text reply for anything else."""
    instruction = last_user_text(messages)
    for pattern, build in _CODE:
        match = re.search(pattern, instruction, re.I)
        if match:
            return code_reply(build(match))
    return text_reply(f"{CANNOT_PLAY}: the request is outside what the scripted model knows.")


_CODE: list[tuple[str, Any]] = [
    (
        r"add (\d+) to the (?:total|running) sum",
        lambda m: f"total = globals().get('total', 0) + {int(m.group(1))}\nprint('answer: The total sum is now', total)",
    ),
    (
        r"mean value of \.?/?([\w.\-]+\.csv)",
        lambda m: (
            f"import pandas as pd\ndata = pd.read_csv({m.group(1)!r})\n"
            "for column, value in data.mean(numeric_only=True).items():\n    print(f'answer: The mean of {column} is {value:.2f}')"
        ),
    ),
    (r'echo the word "([^"]+)"', lambda m: f"print({'answer: ' + m.group(1)!r})"),
    (r"load `?inputs/([\w.\-]+)`? into a variable called `?(\w+)`?", lambda m: f"import pandas as pd\n{m.group(2)} = pd.read_csv('inputs/{m.group(1)}')"),
    (r"how many rows", lambda m: "len(sales)"),
    (r"total (\w+) per (\w+)", lambda m: f"sales.groupby({m.group(2)!r})[{m.group(1)!r}].sum()"),
]


def fold(messages: list[dict[str, Any]]) -> str:
    """A short summary of the rounds folded; the CodeGenerator's form lists no variables (the kernel's list is used)."""
    system = "\n".join(str(m.get("content", "")) for m in messages if m.get("role") == "system")
    summary = "The user asked for running-total updates and data summaries; each was computed in code and reported."
    return summary_reply(summary, [] if "Variables" in system else None)


def examiner_or_judge(messages: list[dict[str, Any]]) -> str:
    """The examiner's next request, or the judge's verdict, told apart by their instructions."""
    system = "\n".join(str(m.get("content", "")) for m in messages if m.get("role") == "system")
    if _JUDGE_MARK in system:
        return judge(last_user_text(messages))
    if _EXAMINER_MARK in system:
        return examiner(_between(system, "----- brief -----", "----- end of brief -----"), messages)
    return "I only play the examiner and the judge."


def examiner(brief: str, messages: Sequence[Mapping[str, Any]]) -> str:
    """The next request for `brief`: round n of a running sum, or the task and then the column asked for."""
    asked = sum(1 for m in messages if m.get("role") == "assistant")
    rounds = re.search(r"round 1 to round (\d+)", brief, re.I)
    if rounds:
        number = asked + 1
        return f"Round {number}: add {number} to the total sum and tell me the sum." if number <= int(rounds.group(1)) else STOP_WORD
    if asked == 0:
        first = re.split(r"(?<=[.!?])\s", brief.strip(), maxsplit=1)[0]
        return "Please " + re.sub(r"^(the task is to|you should)\s+", "", first, flags=re.I)
    said = last_user_text(messages)
    column = re.search(r"column name: '([^']+)'", brief)
    if column and "column" in said.lower() and "?" in said:
        return f"The column is '{column.group(1)}'."
    return STOP_WORD


def judge(prompt: str) -> str:
    """Yes when the statement's numbers (else its quoted phrases, else its names) all appear in the agent's messages.

    A statement with none of these cannot be checked by text alone: the answer is no, saying so.
    """
    statement = prompt.rpartition("Statement:")[2].strip()
    conversation = _between(prompt, "Conversation:", "Statement:")
    try:
        said = " ".join(m["text"] for m in json.loads(conversation) if m.get("speaker") == "agent")
    except (ValueError, TypeError, KeyError):
        said = conversation
    # "after 20 rounds ... the sum 210": the rounds say when, the other numbers are the claim.
    numbers = re.findall(r"\d[\d,]*(?:\.\d+)?(?!\s*rounds?\b)(?![\d,]|\.\d)", statement)
    names = [w for w in re.findall(r"(?<!^)(?<![.!?]\s)\b[A-Z][\w.-]+", statement) if w not in ("Agent", "The", "A", "I")]
    quoted = [phrase.strip("\\ ") for phrase in re.findall(r'"([^"]+)"', statement)]  # TaskWeaver's YAML keeps \" as is
    quoted += re.findall(r"(?<!\w)'([^']+)'(?!\w)", statement)  # 'local' and 'container' (an apostrophe, as in agent's, is no quote)
    wanted = numbers or quoted or names
    if not wanted:
        reason = f"{CANNOT_PLAY}: the scripted judge checks numbers, quoted phrases and names only; this statement has none"
        return json.dumps({"reason": reason, "is_hit": "no"})
    plain = said.replace(",", "")
    missing = [w for w in wanted if not re.search(rf"(?<![\d.\w]){re.escape(w.replace(',', ''))}(?![\d\w])", plain)]
    if missing:
        return json.dumps({"reason": f"the agent never said {', '.join(missing)}", "is_hit": "no"})
    return json.dumps({"reason": "the agent said it", "is_hit": "yes"})


def _between(text: str, start: str, end: str) -> str:
    head = text.partition(start)[2]
    return head.partition(end)[0] if end in head else head
