"""Round compression, measured: prompt sizes, latency added to the user, Variables accuracy, tokenizer speed.

One run, the real `OpenAIChatModel` talking HTTP to the scripted OpenAI-compatible server, whose
summary responder stands in for the model. Each claim is printed beside a baseline from the same run:

1. A 200-round session with mixed round sizes (every 15th round and the next print 20k tokens), in a
   32k window: the largest prompt per role with our compression, against compression off (every round
   verbatim) and against our code folding by TaskWeaver's rule (by round count only, no token budget).
   Every prompt of every row is built by `RoleContext` as it would be sent and its messages counted.
2. The latency compression adds before the next answer when a summary takes 2 s: our background folds
   against a synchronous fold before the next prompt (TaskWeaver's way, one role after the other).
3. Variables accuracy after 50 rounds: the share of live kernel variables that appear with the right
   type in the CodeGenerator's prompt, merged with the kernel, against the model's own list. That
   baseline is modelled, not measured: the scripted summariser omits, invents and keeps stale types at
   rates the bench chose (printed so), to show what the merge repairs.
4. Tokenizer speed, and the error of the chars/4 estimate it replaces.
5. The soak (`tests/soak_session.py`, the session `tests/test_soak.py` asserts on): 160
   requests through the real Session, kernel and openai client at (1, 1), at an 8k and a 32k window,
   against the same session with compression off: requests over the window, rounds lost, the share
   of prompts carrying the summary, total prompt tokens (roles and folds together), fold calls.

6. Prefix reuse: the same soak per strategy and fold schedule; for each role, the share of
   its prompt tokens that its previous request (one cache slot per role) or any earlier request (a
   prefix cache) began with, uncached and total prompt tokens, fold calls, requests over the window,
   rounds lost, the summary's presence, live names named while the kernel holds at most 200, and the
   earlier variables each round's code reads named in its first CodeGenerator prompt. "P/C +reply": the
   Planner's / CodeGenerator's reuse for a slot that also keeps the reply it generated (llama.cpp's).

Run: .venv/bin/python bench/compression_bench.py [sizes latency variables tokenizer soak reuse]   (a few minutes)
     reuse: round_compression (1,1), both schedules and both fold prompts, at 8k and 32k (about 5 minutes)
     reuse --full: every strategy and schedule as well (about 10 minutes)
     reuse --before 70a6a8a: also the same soaks on that commit's code, and each row's uncached tokens against it
     reuse --breaks: under each row, the uncached tokens by where each request first parts from its role's previous one
     reuse --reserve 4096: the sessions with the reply reserve the soak test uses (the default is a quarter of the window)
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from taskweaver_lite.config.settings import Config
from taskweaver_lite.errors import ContextOverflowError
from taskweaver_lite.llm.client import OpenAIChatModel
from taskweaver_lite.llm.tokens import get_tokenizer
from taskweaver_lite.memory.compression import ContextSettings, RoleContext
from taskweaver_lite.memory.variables import LiveVariables, expand_names
from taskweaver_lite.records.conversation import RoundMessages
from taskweaver_lite.records.execution import FoldPiece, Variable
from taskweaver_lite.records.model_calls import Message
from taskweaver_lite.testing.scripted_server import Reply, ScriptedServer

# The soak's session driver lives with the tests that assert on it: one implementation for both.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

ROUNDS = 200
SOAK_ROUNDS = 160
SOAK_WINDOWS = (8_000, 32_000)
VARIABLE_ROUNDS = 50
LATENCY_ROUNDS = 12
ROUND_WORK_SECONDS = 0.3  # the rest of a round (the roles' own calls, the kernel) in the latency run
SUMMARY_SECONDS = 2.0
WINDOW = 32_000
BIG_OUTPUT_EVERY = 15
BIG_OUTPUT_TOKENS = 20_000
TOKENIZER = get_tokenizer()
WORDS = [
    "sales",
    "region",
    "month",
    "revenue",
    "margin",
    "customer",
    "order",
    "total",
    "mean",
    "median",
    "growth",
    "quarter",
    "product",
    "price",
    "cost",
    "units",
    "store",
    "share",
    "trend",
    "north",
    "south",
    "east",
    "west",
    "value",
    "count",
    "rows",
    "column",
    "index",
]
SYSTEM = {role: f"You are the {role} of a data-analysis assistant. " + " ".join(WORDS * 12) for role in ("planner", "code_generator")}
EXAMPLES = (Message(role="user", content="Example: " + " ".join(WORDS * 6)), Message(role="assistant", content=" ".join(WORDS * 8)))


def words(rng: random.Random, count: int) -> str:
    return " ".join(rng.choices(WORDS, k=count))


@dataclass
class Kernel:
    """The kernel's truth in the simulation: variables come, change type, go, and vanish in a restart."""

    rng: random.Random
    variables: dict[str, Variable] = field(default_factory=dict)
    lost: list[str] = field(default_factory=list)

    def run_round(self, index: int) -> None:
        kinds = [("pandas.DataFrame", "DataFrame 1200 rows x 6 columns"), ("float", "a number"), ("pandas.Series", "Series of 12"), ("dict", "dict of 4 keys")]
        for k in range(self.rng.randint(0, 2)):
            kind, description = self.rng.choice(kinds)
            self.variables[f"v{index}_{k}"] = Variable(f"v{index}_{k}", kind, description)
        if self.variables and self.rng.random() < 0.25:  # a variable reassigned to another type
            name = self.rng.choice(list(self.variables))
            self.variables[name] = Variable(name, "list", "list of 12 numbers")
        if self.variables and self.rng.random() < 0.15:
            del self.variables[self.rng.choice(list(self.variables))]
        if index == 30:  # the kernel dies: everything is lost until recomputed
            self.lost, self.variables = list(self.variables), {}
        if index == 32:  # half of it is recomputed
            for name in self.lost[::2]:
                self.variables[name] = Variable(name, "pandas.DataFrame", "DataFrame 1200 rows x 6 columns")

    def live(self) -> LiveVariables:
        names = set(self.variables)
        return LiveVariables(variables=tuple(self.variables.values()), lost=tuple(n for n in self.lost if n not in names))


class SummaryResponder:
    """The scripted summary model: bounded summaries; Variables that omit, invent and keep stale types (modelled rates).

    Fold prompts carry rounds, not the kernel's variables, so the simulated model reads them from the
    simulated `kernel`, as a real one would recall them from the rounds (with the same slips).
    """

    def __init__(self, *, delay: float = 0.0, kernel: Kernel | None = None) -> None:
        self.delay = delay
        self.kernel = kernel
        self.rng = random.Random(7)
        self.last_variables: list[dict[str, str]] = []

    def __call__(self, messages: list[dict[str, Any]]) -> Reply:
        # The rounds a fold sends: its own user message, or (a fold that opens with its role's prompt) all after the system message.
        request = "\n".join(str(m["content"]) for m in messages[1:])
        covered = sorted({int(n) for n in re.findall(r"ROUND-(\d+)\b", request)})
        lines = [f"Round {n}: looked at {words(self.rng, 6)}." for n in covered[-60:]]
        data: dict[str, Any] = {"ConversationSummary": "\n".join(lines)}
        asks = messages[-1]["content"] if "ConversationSummary" in messages[-1]["content"] else messages[0]["content"]
        if "Variables:" in asks and self.kernel is not None:
            previous = {v["name"]: v for v in self.last_variables}
            told = []
            for variable in self.kernel.live().variables:
                if self.rng.random() < 0.2:
                    continue  # omitted
                known = previous.get(variable.name)
                kind = known["type"] if known and self.rng.random() < 0.5 else variable.type  # stale type
                told.append({"name": variable.name, "type": kind, "description": "used in the analysis"})
            told += [{"name": f"result_{self.rng.randint(0, 999)}", "type": "DataFrame", "description": "invented"} for _ in range(2)]
            data["Variables"] = told
            self.last_variables = told
        return Reply(content=json.dumps(data), delay=self.delay)


def make_rounds(rng: random.Random) -> list[dict[str, RoundMessages]]:
    """The scripted session: each round as the Planner sees it and as the CodeGenerator sees it."""
    session = []
    for index in range(1, ROUNDS + 1):
        big = index % BIG_OUTPUT_EVERY in (0, 1) and index > 1  # large outputs come in pairs
        output = f"Output of ROUND-{index}:\n" + words(rng, BIG_OUTPUT_TOKENS if big else rng.randint(50, 900))
        ask = f"ROUND-{index}: " + words(rng, rng.randint(20, 150))
        step = f"Step for ROUND-{index}: " + words(rng, rng.randint(20, 80))
        code = json.dumps({"response": {"thought": words(rng, 30), "reply_type": "python", "reply_content": words(rng, rng.randint(40, 300))}})
        plan_fields = {"init_plan": words(rng, 30), "plan": words(rng, 30), "current_plan_step": "1", "send_to": "CodeInterpreter", "message": step}
        plan = json.dumps({"response": plan_fields})
        answer = json.dumps({"response": {"init_plan": "", "plan": "", "current_plan_step": "2", "send_to": "User", "message": words(rng, 80)}})
        report = f"CodeInterpreter: done\n{output}"
        planner = (
            Message(role="user", content=ask),
            Message(role="assistant", content=plan),
            Message(role="user", content=report),
            Message(role="assistant", content=answer),
        )
        coder = (Message(role="user", content=step), Message(role="assistant", content=code), Message(role="user", content=f"Execution result:\n{output}"))
        planner_pieces = (FoldPiece(f"User: {ask}", essential=True), FoldPiece(f"Planner: {step}", essential=True), FoldPiece(output))
        coder_pieces = (FoldPiece(f"Planner asked: {step}", essential=True), FoldPiece(f"Code ran.\n{output}"))
        session.append(
            {
                "planner": RoundMessages(index, planner, planner_pieces, requests=(0,)),
                "code_generator": RoundMessages(index, coder, coder_pieces, requests=(0,)),
            }
        )
    return session


def last_call(rnd: RoundMessages, role: str) -> RoundMessages:
    """The round as it stands at the role's largest call: the Planner's answer, the CodeGenerator's first code."""
    keep = 3 if role == "planner" else 1
    return replace(rnd, messages=rnd.messages[:keep])


# A window no prompt here reaches: the budget guard never cuts, as in TaskWeaver, which has none.
UNGUARDED_WINDOW = 2_000_000
SIZE_ROWS = {
    "off": "compression off (every round verbatim)",
    "taskweaver": "our code folding by TaskWeaver's rule",
    "ours": "ours",
}


def size_contexts(server: ScriptedServer, model: OpenAIChatModel, role: str, live: Any) -> dict[str, RoleContext]:
    """The three ways of building a role's prompts, each our `RoleContext` as a session would use it.

    off: strategy `none`, no guard: every round verbatim, examples always. taskweaver: TaskWeaver's
    rule (fold `rounds_to_compress` 2 once 2 + 3 rounds are unfolded, by round count only: no token
    trigger, no budget guard, no cutting, examples always). ours: the defaults in the 32k window.
    """
    unguarded: dict[str, Any] = {"context_window": UNGUARDED_WINDOW}
    always = {"examples": "always"}
    off = config(server, llm=unguarded, planner={**always, "strategy": "none"}, code_generator={**always, "strategy": "none"})
    taskweaver = config(server, llm=unguarded, planner=always, code_generator=always, fold_token_trigger=0)
    return {
        name: RoleContext(ContextSettings.of(cfg, role), model=model, tokenizer=TOKENIZER, live_variables=live)
        for name, cfg in (("off", off), ("taskweaver", taskweaver), ("ours", config(server)))
    }


def sent_tokens(context: RoleContext, role: str, history: list[RoundMessages], current: RoundMessages, *, over: int) -> int:
    """The tokens of the request `context` builds for this call, counted as sent (messages, roles and framing); `over` when it refuses."""
    try:
        messages = context.build(system=SYSTEM[role], examples=EXAMPLES, history=history, current=current).messages
    except ContextOverflowError:
        return over
    return TOKENIZER.count_messages(messages)


def role_prompt_sizes(server: ScriptedServer, model: OpenAIChatModel, role: str, session: list[dict[str, RoundMessages]], budget: int) -> dict[str, list[int]]:
    """Each call's prompt tokens over the session for one role, per way of building it."""
    kernel = Kernel(random.Random(3))
    contexts = size_contexts(server, model, role, kernel.live if role == "code_generator" else None)
    history: list[RoundMessages] = []
    sizes: dict[str, list[int]] = {name: [] for name in contexts}
    for rounds in session:
        rnd = rounds[role]
        current = last_call(rnd, role)
        for name, context in contexts.items():
            sizes[name].append(sent_tokens(context, role, history, current, over=budget + 1))
        history.append(rnd)
        if role == "code_generator":
            kernel.run_round(rnd.index)
        for context in contexts.values():
            context.round_finished(history)
            context.wait_idle(60)  # a round lasts longer than a 0 s fold
    return sizes


def bench_prompt_sizes(server: ScriptedServer, session: list[dict[str, RoundMessages]]) -> None:
    budget = config(server).prompt_budget
    print(f"\n1. Prompt tokens over a {ROUNDS}-round session, {WINDOW:,}-token window (budget {budget:,})")
    print("   each request built by RoleContext as it would be sent, and its messages counted (o200k, with the chat framing)")
    model = OpenAIChatModel(config(server).llm)
    sizes = {role: role_prompt_sizes(server, model, role, session, budget) for role in ("planner", "code_generator")}
    print(f"   {'':58}{'planner':>10}{'coder':>10}")
    for name, label in SIZE_ROWS.items():
        print(f"   {'largest prompt, ' + label:<58}{max(sizes['planner'][name]):>10,}{max(sizes['code_generator'][name]):>10,}")
    for name, label in SIZE_ROWS.items():
        limit, limit_name = (budget, "budget") if name == "ours" else (WINDOW, "window")
        over = [sum(total > limit for total in sizes[role][name]) for role in ("planner", "code_generator")]
        print(f"   {f'over the {limit_name}, ' + label:<58}{over[0]:>10}{over[1]:>10}   of {ROUNDS} prompts")
    for role in ("planner", "code_generator"):
        ours_share, taskweaver_share = (sum(sizes[role][name]) / sum(sizes[role]["off"]) for name in ("ours", "taskweaver"))
        print(f"   {role}: tokens sent over the session / compression off: ours {ours_share:.3f}, TaskWeaver's rule {taskweaver_share:.3f}")
    print("\n   tokens per prompt at rounds (planner off / TW rule / ours | coder off / TW rule / ours)")
    for index in (1, 5, 10, 15, 16, 30, 50, 75, 100, 105, 150, 199, 200):
        row = [sizes[r][n][index - 1] for r in ("planner", "code_generator") for n in ("off", "taskweaver", "ours")]
        print(f"   round {index:>3}: {row[0]:>8,} {row[1]:>7,} {row[2]:>7,} | {row[3]:>8,} {row[4]:>7,} {row[5]:>7,}")


def bench_latency(server: ScriptedServer, session: list[dict[str, RoundMessages]]) -> None:
    print(f"\n2. Latency added before the next answer, summary call = {SUMMARY_SECONDS:.0f} s, {LATENCY_ROUNDS} rounds")
    server.set_default("compression", SummaryResponder(delay=SUMMARY_SECONDS))
    results = {}
    for mode in ("synchronous (TaskWeaver)", "background (ours)"):
        cfg = config(server)
        model = OpenAIChatModel(cfg.llm)
        contexts = {role: RoleContext(ContextSettings.of(cfg, role), model=model, tokenizer=TOKENIZER) for role in ("planner", "code_generator")}
        added: list[float] = []
        history: dict[str, list[RoundMessages]] = {"planner": [], "code_generator": []}
        for rounds in session[:LATENCY_ROUNDS]:
            time.sleep(ROUND_WORK_SECONDS)
            waited = 0.0
            for role, context in contexts.items():
                history[role].append(rounds[role])
                started = time.perf_counter()
                context.round_finished(history[role])
                if mode.startswith("synchronous"):
                    context.wait_idle()  # the fold in front of the role's next prompt
                nxt = session[len(history[role])][role]
                context.build(system=SYSTEM[role], examples=EXAMPLES, history=history[role], current=last_call(nxt, role))
                waited += time.perf_counter() - started
            added.append(waited)
        for context in contexts.values():
            context.wait_idle(60)
        folds = sum(len(c.state.log) for c in contexts.values())
        through = "/".join(str(c.state.folded_through) for c in contexts.values())
        results[mode] = (sum(added), max(added), folds)
        print(f"   {mode:<26} added {sum(added):6.2f} s in total, {max(added):5.2f} s at worst; {folds} fold calls, folded through round {through}")
    sync, ours = results["synchronous (TaskWeaver)"], results["background (ours)"]
    print(f"   ours / synchronous: total {ours[0] / sync[0]:.4f}, worst round {ours[1] / sync[1]:.4f}")


def bench_variables(server: ScriptedServer, session: list[dict[str, RoundMessages]]) -> None:
    print(f"\n3. Variables accuracy after {VARIABLE_ROUNDS} rounds (live variables in the CodeGenerator's prompt with the right type)")
    kernel = Kernel(random.Random(3))
    responder = SummaryResponder(kernel=kernel)
    server.set_default("compression", responder)
    cfg = config(server)
    context = RoleContext(ContextSettings.of(cfg, "code_generator"), model=OpenAIChatModel(cfg.llm), tokenizer=TOKENIZER, live_variables=kernel.live)
    history: list[RoundMessages] = []
    for rounds in session[:VARIABLE_ROUNDS]:
        history.append(rounds["code_generator"])
        kernel.run_round(rounds["code_generator"].index)
        context.round_finished(history)
        context.wait_idle(30)
    nxt = last_call(session[VARIABLE_ROUNDS]["code_generator"], "code_generator")
    built = context.build(system=SYSTEM["code_generator"], examples=EXAMPLES, history=history, current=nxt).messages
    text = "\n".join(m["content"] for m in built)  # the list sits with the summary (summary_placement), wherever that is
    truth = {(v.name, v.type) for v in kernel.live().variables}
    # Every tier: "- name (type): detail", "- name: type shape", and names alone ("Also: ...", no type).
    shown = set(re.findall(r"^- (\S+) \(([^)]*)\):", text, flags=re.MULTILINE))
    shown |= {(name, kind) for name, kind in re.findall(r"^- (\S+): (\S+)", text, flags=re.MULTILINE)}
    named = {n for n, _ in shown} | {n for line in text.splitlines() if line.startswith("Also") for n in expand_names(line)}
    told = {(v["name"], v["type"]) for v in responder.last_variables}
    invented = len({n for n, _ in told} - {n for n, _ in truth})
    typed = {n for n, _ in shown}
    print(f"   live variables: {len(truth)}; lost in the restart at round 30 and not recomputed: {len(kernel.live().lost)}")
    print(
        f"   merged with the kernel (ours): {len({n for n, _ in truth} & named) / len(truth):6.1%} named, "
        f"{len(truth & shown) / max(len(typed), 1):6.1%} of those shown with a type right, {len(shown - truth)} wrong or invented entries"
    )
    print(f"   the model's own Variables    : {len(truth & told) / len(truth):6.1%} right, {invented} invented names  (MODELLED, not measured:")
    print("     a scripted list that omits 20% of the live variables, keeps a stale type half the time and invents 2 names per")
    print("     fold, rates the bench chose; it shows what the kernel merge repairs, not how often a real model slips)")


def bench_tokenizer() -> None:
    print("\n4. Tokenizer")
    rng = random.Random(5)
    text = "\n".join(f"{words(rng, 12)} {rng.random():.6f} {json.dumps({'k': rng.randint(0, 10**6)})}" for _ in range(60_000))
    started = time.perf_counter()
    tokens = TOKENIZER.count(text)
    elapsed = time.perf_counter() - started
    estimate = len(text) / 4
    print(f"   o200k_base exact count: {tokens:,} tokens in {elapsed * 1000:.0f} ms = {tokens / elapsed / 1e6:.1f} M tokens/s")
    print(f"   chars/4 estimate (the seed's): {estimate:,.0f}, off by {abs(estimate - tokens) / tokens:.1%}")
    started = time.perf_counter()
    for _ in range(20):
        TOKENIZER.truncate_middle(text, 2_000)
    print(f"   truncate_middle of that text to 2,000 tokens: {(time.perf_counter() - started) / 20 * 1000:.0f} ms")


def bench_soak(rounds: int = SOAK_ROUNDS) -> None:
    import soak_session as soak  # from tests/, put on sys.path above

    print(f"\n5. Soak: {rounds} requests through the real Session at (1, 1), compression on against off")
    rows: dict[str, list[str]] = {}
    for window in SOAK_WINDOWS:
        with tempfile.TemporaryDirectory() as root:
            on = soak.run_soak(Path(root) / "on", rounds=rounds, window=window)
            off = soak.run_soak(Path(root) / "off", rounds=rounds, window=window, compression=False)
        for label, value in soak_figures(soak, on, off).items():
            rows.setdefault(label, []).append(value)
    print(f"   {'':58}" + "".join(f"{f'{w // 1000}k window':>16}" for w in SOAK_WINDOWS))
    for label, values in rows.items():
        print(f"   {label:<58}" + "".join(f"{v:>16}" for v in values))


def soak_figures(soak: Any, on: Any, off: Any) -> dict[str, str]:
    """One soak's figures by label, compression on (`on`) against off (`off`), formatted for the table."""
    lost = sorted({n for rounds in soak.unreachable_rounds(on).values() for n in rounds})
    on_tokens, off_tokens = soak.total_prompt_tokens(on), soak.total_prompt_tokens(off)
    return {
        "requests over the window, folds included (target 0)": f"{len(soak.overflows(on.requests, window=on.window)):,}",
        "rounds failed": f"{len(on.failed_rounds)}",
        "rounds lost: in no fold input nor the last prompt (target 0)": f"{len(lost)}",
        "prompts after the first fold with the summary (target 100%)": f"{soak.summary_fraction(on):.1%}",
        "CodeGenerator prompts with variables-list problems": f"{len(soak.variables_problems(on.requests, budget=on.budget))}",
        "total prompt tokens, compression on (roles + folds)": f"{on_tokens:,}",
        "total prompt tokens, compression off": f"{off_tokens:,}",
        "on / off (target <= 0.60)": f"{on_tokens / off_tokens:.3f}",
        "fold calls per 100 rounds": f"{soak.fold_calls(on) * 100 / on.rounds:.0f}",
        "variables in the kernel at the end": f"{on.variables}",
        "seconds, on / off": f"{on.seconds:.0f} / {off.seconds:.0f}",
    }


def reuse_runs(full: bool, *, reserve: int | None = None) -> list[tuple[str, dict[str, dict[str, Any]]]]:
    """The strategies, schedules and fold prompts of the prefix-reuse table: (label, config sections).

    Under `pressure`, rounds kept whole (sliding_window, none, masking) leave in steps too. The small
    run (the default) is the issue's targets: round_compression at (1, 1) under both schedules, its
    folds opening with the role's prompt (`fold_prompt: role`) or in a prompt of their own
    (`separate`). `reserve`: llm.reply_reserve (None: the config's default, a quarter of the window;
    the soak test itself sets 4,096).
    """
    both = ("role", "separate")
    plans = [
        ("round_compression (1,1)", "round_compression", 1, 1, both),
        ("round_compression (2,3)", "round_compression", 2, 3, both),
        ("summary_buffer", "summary_buffer", 1, 1, ("role",)),
        ("observation_masking", "observation_masking", 1, 1, ("role",)),
        ("sliding_window", "sliding_window", 1, 1, ("role",)),
        ("none", "none", 1, 1, ("role",)),
    ]
    runs = []
    for label, strategy, compress, retain, prompts in plans if full else plans[:1]:
        for schedule in ("rounds", "pressure"):
            for fold_prompt in prompts:
                role: dict[str, Any] = {"strategy": strategy, "fold_schedule": schedule, "fold_prompt": fold_prompt}
                sections: dict[str, dict[str, Any]] = {
                    "llm": {"reply_reserve": reserve},
                    "planner": role,
                    "code_generator": role,
                    "round_compressor": {"rounds_to_compress": compress, "rounds_to_retain": retain, "summary_buffer_rounds": retain},
                }
                folds = f", folds {fold_prompt}" if len(prompts) > 1 else ""
                runs.append((f"{label}, {schedule}{folds}", sections))
    return runs


REUSE_WIDTHS = (16, 16, 14, 16, 12, 11, 11, 11, 6, 6, 9, 11, 9)


def bench_reuse(*, full: bool, rounds: int, only: str = "", before: str = "", breaks: bool = False, reserve: int | None = None) -> None:
    windows = SOAK_WINDOWS
    earlier = _reuse_before(before, rounds=rounds, windows=windows, reserve=reserve) if before else {}
    print(f"\n6. Prefix reuse: {rounds} scripted requests through the real Session, per strategy, fold schedule and fold prompt")
    print("   reuse: the share of a role's prompt tokens its previous request began with (one cache slot per role; a fold that")
    print("   opens with its role's prompt is compared with that role's previous request, its slot) / any earlier request began")
    print("   with (a prefix cache over everything sent); uncached = prompt - shared with any: what such a cache recomputes.")
    print(f"   llm.reply_reserve: {reserve if reserve is not None else 'the default (a quarter of the window, at most 4,096)'}; margin 256.")
    for window in windows:
        header = (
            f"   {'at ' + str(window // 1000) + 'k':<44}{'Planner':>16}{'CodeGen':>16}{'folds':>14}{'all':>16}"
            f"{'P/C +reply':>12}{'uncached':>11}{'total':>11}{'fold calls':>11}{'over':>6}{'lost':>6}{'summary':>9}{'live named':>11}{'needed':>9}"
        )
        print("\n" + header)
        for (schedule, at), found in earlier.items():
            if at == window:
                _print_before_row(f"before ({before[:7]}), (1,1) {schedule}", found)
        for label, sections in (run for run in reuse_runs(full, reserve=reserve) if only in run[0]):
            before_row = earlier.get((sections["planner"]["fold_schedule"], window)) if sections["round_compressor"]["rounds_to_retain"] == 1 else None
            _reuse_row(label, sections, rounds=rounds, window=window, before=before_row, breaks=breaks)


def _print_before_row(label: str, found: dict[str, Any]) -> None:
    """The earlier commit's figures for one schedule and window (no lost/summary/names columns: its run is not kept)."""
    from prefix_ledger import Tally

    t0 = {role: Tally(**tally) for role, tally in found["tallies"].items()}
    folds0 = [t0[k] for k in ("compression_planner", "compression_code_generator") if k in t0]
    cells0 = [_pair(t0["planner"]), _pair(t0["code_generator"]), _fold_share(folds0), _pair(t0["all requests"]), _slots(t0)]
    cells0 += [f"{t0['all requests'].uncached:,}", f"{t0['all requests'].prompt:,}", f"{found['fold_calls']:,}", f"{found['over']}"]
    print(f"   {label:<44}" + "".join(f"{cell:>{w}}" for cell, w in zip(cells0, REUSE_WIDTHS, strict=False)))


def _reuse_row(label: str, sections: dict[str, dict[str, Any]], *, rounds: int, window: int, before: dict[str, Any] | None, breaks: bool) -> None:
    """One soak, counted; printed as a row, a row for its fold calls, and the causes of what is recomputed (`breaks`)."""
    import soak_session as soak  # from tests/, put on sys.path above
    from prefix_ledger import PrefixLedger, Tally, as_messages, first_break

    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as root:
        run = soak.run_soak(Path(root), rounds=rounds, window=window, settings=sections)
    ledger = PrefixLedger(TOKENIZER)
    causes: dict[tuple[str, str], list[int]] = {}
    previous: dict[str, list[Message]] = {}
    for request in run.requests:
        purpose, slot, messages = _purpose(request), _slot(request), as_messages(request.messages)
        prompt, _, shared_any = ledger.add(purpose, messages, slot=slot)
        cause = causes.setdefault((purpose, first_break(messages, previous.get(slot))), [0, 0])
        cause[0], cause[1] = cause[0] + 1, cause[1] + prompt - shared_any
        if slot == purpose:
            previous[purpose] = messages
    t = ledger.tallies
    folds = [t[k] for k in ("compression_planner", "compression_code_generator") if k in t]
    summarising = sections["planner"]["strategy"] in ("round_compression", "summary_buffer")
    live, needed = _names_listed(soak, run)
    # Rounds no fold saw and the last prompt does not hold: forgotten (a window's dropped rounds too).
    lost = {n for missing in soak.unreachable_rounds(run).values() for n in missing}
    cells = [
        _pair(t["planner"]),
        _pair(t["code_generator"]),
        _fold_share(folds) if folds else "-",
        _pair(t["all requests"]),
        _slots(t),
        f"{t['all requests'].uncached:,}",
        f"{t['all requests'].prompt:,}",
        f"{soak.fold_calls(run):,}",
        f"{len(soak.overflows(run.requests, window=run.window)):,}",
        f"{len(lost)}",
        f"{soak.summary_fraction(run):.0%}" if summarising else "-",
        live,
        needed,
    ]
    versus = ""
    if before is not None:  # recomputed tokens against the earlier commit's, the baseline of this run
        then = Tally(**before["tallies"]["all requests"])
        versus = f", uncached {t['all requests'].uncached / max(then.uncached, 1):.2f}x before"
    row = "".join(f"{cell:>{w}}" for cell, w in zip(cells, REUSE_WIDTHS, strict=True))
    print(f"   {label:<44}{row}   ({time.perf_counter() - started:.0f} s{versus})")
    if folds:
        prompt, uncached = sum(f.prompt for f in folds), sum(f.uncached for f in folds)
        share = uncached / max(t["all requests"].uncached, 1)
        print(f"   {'  its fold calls':<44}{'':>32}{_fold_share(folds):>14}{'':>28}{uncached:>11,}{prompt:>11,}   ({share:.0%} of the run's uncached)")
    if breaks:
        _print_breaks(causes)


def _fold_share(folds: list[Any]) -> str:
    prompt = max(sum(f.prompt for f in folds), 1)
    return f"{sum(f.shared_previous for f in folds) / prompt:.0%} / {sum(f.shared_any for f in folds) / prompt:.0%}"


def _print_breaks(causes: dict[tuple[str, str], list[int]]) -> None:
    """Uncached tokens by where each request first parts from its role's previous request, largest first."""
    for (purpose, cause), (count, uncached) in sorted(causes.items(), key=lambda item: -item[1][1])[:8]:
        print(f"      {uncached:>9,} uncached in {count:>4} {purpose} requests: {cause}")


def _reuse_before(commit: str, *, rounds: int, windows: tuple[int, ...], reserve: int | None) -> dict[tuple[str, int], dict[str, Any]]:
    """The soak at (1, 1) on `commit`'s code (`bench/reuse_before.py` in a child process), per schedule and window."""
    import subprocess

    repo = Path(__file__).resolve().parent.parent
    with tempfile.TemporaryDirectory() as tree:
        archive = subprocess.run(["git", "-C", str(repo), "archive", commit], capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", tree], input=archive, check=True)
        (Path(tree) / "taskweaver_lite" / "prompts").symlink_to(Path(tree) / "prompts")  # the data package, as an install maps it
        script = Path(__file__).resolve().parent / "reuse_before.py"
        arguments = [tree, str(rounds), str(reserve) if reserve is not None else "default", "rounds,pressure", *map(str, windows)]
        done = subprocess.run([sys.executable, str(script), *arguments], capture_output=True, text=True, check=True)
    rows = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    return {(str(row["schedule"]), int(row["window"])): row for row in rows}


def _pair(tally: Any) -> str:
    return f"{tally.share(tally.shared_previous):.1%} / {tally.share(tally.shared_any):.1%}"


def _slots(tallies: dict[str, Any]) -> str:
    """Planner / CodeGenerator reuse for a slot that keeps the reply it generated (llama.cpp's)."""
    return " / ".join(f"{t.share(t.shared_slot):.0%}" for t in (tallies["planner"], tallies["code_generator"]))


def _purpose(request: Any) -> str:
    """A recorded request's purpose (planner, compression_planner...): a fold's is compression_ and its role,
    whether it has a key of its own or shares its role's (the last part of its prompt_cache_key)."""
    key = _slot(request)
    return f"compression_{key.removeprefix('compression_')}" if request.role == "compression" else key


def _slot(request: Any) -> str:
    """The cache slot a recorded request went to: the last part of its prompt_cache_key."""
    key = request.body.get("prompt_cache_key")
    return str(key).rsplit("/", 1)[-1] if key else str(request.role)


def _names_listed(soak: Any, run: Any) -> tuple[str, str]:
    """(live names named while the kernel holds at most 200, needed names named) in each round's first CodeGenerator prompt."""
    seen: set[int] = set()
    live_named = live_total = needed_named = needed_total = 0
    for request in run.requests:
        if request.role != "code_generator":
            continue
        text = "\n".join(str(m.get("content") or "") for m in request.messages)
        n = max(soak.markers_in(text))
        if n in seen:
            continue
        seen.add(n)
        named = set(re.findall(r"[A-Za-z_]\w*", text))
        for run in re.finditer(r"[A-Za-z_]\w*\{\d+-\d+\}\w*", text):  # numbered runs (r{0001-0040}_frame), wherever they are
            named.update(expand_names(f": {run[0]}"))
        live = {f"r{m:04d}_{s}" for m in range(1, n) for s in ("count", "items", "frame", "meta")}
        if len(live) <= 200:
            live_named += len(live & named)
            live_total += len(live)
        wanted = soak.needed_name(n)
        if wanted is not None:
            needed_total += 1
            needed_named += wanted in named
    return f"{live_named / max(live_total, 1):.1%}", f"{needed_named}/{needed_total}"


def config(server: ScriptedServer, *, llm: dict[str, Any] | None = None, **sections: Any) -> Config:
    """The bench's config: TaskWeaver's (2, 3) in a 32k window; `llm` and role sections override, the rest are round_compressor's."""
    roles = {name: sections.pop(name) for name in ("planner", "code_generator") if name in sections}
    return Config.model_validate(
        {
            "llm": {"api_base": server.url, "api_key": "bench", "context_window": WINDOW, "max_retries": 0, **(llm or {})},
            "round_compressor": {"rounds_to_compress": 2, "rounds_to_retain": 3, **sections},
            **roles,
        }
    )


SECTIONS = ("sizes", "latency", "variables", "tokenizer", "soak", "reuse")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    # No `choices=`: argparse checks an empty `nargs="*"` list against them and refuses it.
    parser.add_argument("sections", nargs="*", metavar="SECTION", help=f"the sections to run: {', '.join(SECTIONS)} (default: all)")
    parser.add_argument("--full", action="store_true", help="reuse: every strategy and schedule (default: round_compression (1,1))")
    parser.add_argument("--rounds", type=int, default=SOAK_ROUNDS, help=f"reuse: requests per session (default {SOAK_ROUNDS})")
    parser.add_argument("--only", default="", help="reuse: only the rows whose label contains this text")
    parser.add_argument("--breaks", action="store_true", help="reuse: under each row, uncached tokens by where requests part from their role's previous one")
    parser.add_argument("--before", default="", metavar="COMMIT", help="reuse: also the soak at (1,1) on COMMIT's code per schedule (e.g. 70a6a8a)")
    parser.add_argument("--reserve", type=int, default=None, help="reuse: llm.reply_reserve (default: the config default; the soak test uses 4096)")
    args = parser.parse_args()
    chosen = set(args.sections or SECTIONS)
    if chosen - set(SECTIONS):
        parser.error(f"unknown section {', '.join(sorted(chosen - set(SECTIONS)))}; choose from {', '.join(SECTIONS)}")
    started = time.perf_counter()
    session = make_rounds(random.Random(11))
    with ScriptedServer() as server:
        server.set_default("compression", SummaryResponder())
        if "sizes" in chosen:
            bench_prompt_sizes(server, session)
        if "latency" in chosen:
            bench_latency(server, session)
        if "variables" in chosen:
            bench_variables(server, session)
    if "tokenizer" in chosen:
        bench_tokenizer()
    if "soak" in chosen:
        bench_soak()
    if "reuse" in chosen:
        bench_reuse(full=args.full, rounds=args.rounds, only=args.only, before=args.before, breaks=args.breaks, reserve=args.reserve)
    print(f"\n(bench ran in {time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main()
