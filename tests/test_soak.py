"""Compression at a local model's window (8k): a long hostile session, and three ways it once failed (A, B, C) at small scale.

The soak (`soak_session.py`) runs 110 requests through the real Session, kernel and openai client
with folds at (1, 1): the kernel ends with over 400 variables, every fifth cell prints 300 lines and
every seventh fails loudly before its fix. Each test asserts one promise of compression over all the
requests the scripted server received, and names the request or round that broke it.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from soak_session import (
    FoldRecorder,
    SoakModel,
    SoakRun,
    folded_through,
    has_summary,
    marker,
    open_soak_session,
    overflows,
    planner_step,
    run_soak,
    summary_gaps,
    total_prompt_tokens,
    unreachable_rounds,
    user_request,
    variables_problems,
    wait_for_folds,
)

from taskweaver_lite.errors import TaskWeaverError
from taskweaver_lite.session.session import Session
from taskweaver_lite.testing.scripted_server import ScriptedRequest, ScriptedServer, code_reply, last_user_text

pytestmark = pytest.mark.soak

WINDOW = 8000
BUDGET = WINDOW - 4096 - 256
SOAK_ROUNDS = 110
COMPARED_ROUNDS = 60  # the token comparison's two sessions: its ratio has settled well before (see that test)
WIDE = 150  # variables one cell leaves in the kernel in the wide-kernel tests


@pytest.fixture(scope="module")
def soak(tmp_path_factory: pytest.TempPathFactory) -> SoakRun:
    """The soak, run once for the module's tests."""
    return run_soak(tmp_path_factory.mktemp("soak"), rounds=SOAK_ROUNDS, window=WINDOW)


@pytest.fixture
def server(server: ScriptedServer) -> ScriptedServer:
    """The shared scripted server, answering as the soak's model."""
    SoakModel().install(server)
    return server


def ask(session: Session, n: int) -> None:
    """Round `n`'s request, which must finish; then let its folds finish."""
    try:
        rnd = session.ask(user_request(n))
    except TaskWeaverError as exc:
        pytest.fail(f"round {n} failed: {exc}")
    assert rnd.state == "finished", f"round {n} failed: {rnd.error}"
    wait_for_folds(session, after_round=n)


def role_requests(server: ScriptedServer, role: str) -> list[ScriptedRequest]:
    return [r for r in server.requests if r.role == role]


# The soak


def test_every_round_of_the_soak_finishes(soak: SoakRun) -> None:
    failed = len(soak.failed_rounds)
    first = "\n".join(f"round {n}: {error}" for n, error in soak.failed_rounds[:5])
    assert failed == 0, f"{failed} of {soak.rounds} rounds failed at an 8k window, first ones:\n{first}"
    assert 300 <= soak.variables <= 600, f"the soak should leave a wide kernel (300-600 variables), it left {soak.variables}"


def test_no_request_passes_the_window_fold_calls_included(soak: SoakRun) -> None:
    over = overflows(soak.requests, window=soak.window)
    assert len(over) == 0, f"{len(over)} of {len(soak.requests)} requests asked for prompt + max_tokens over the window:\n" + "\n".join(over[:5])


def test_the_summary_is_in_every_prompt_after_the_first_fold(soak: SoakRun) -> None:
    gaps = summary_gaps(soak)
    assert len(gaps) == 0, f"{len(gaps)} role prompts went without the summary after the role's first fold:\n" + "\n".join(gaps[:5])


def test_every_rounds_request_reaches_a_fold_or_the_last_prompt(soak: SoakRun) -> None:
    recorded = sorted(soak.fold_prompts)
    assert recorded == ["code_generator", "planner"], f"precondition: both roles' fold calls were recorded (ModelCalled events), got {recorded}"
    lost = unreachable_rounds(soak)
    described = "; ".join(f"{role}: {len(rounds)} rounds, e.g. {rounds[:8]}" for role, rounds in lost.items())
    assert len(lost) == 0, f"rounds whose request no fold saw and the last prompt does not hold (lost from memory): {described}"


@pytest.mark.timeout(300)  # two soaks of 60 rounds: 20 s in a quiet CI; a load of 20 stretches them past the default 120 s
def test_compression_costs_well_under_the_tokens_of_the_same_session_without_it(tmp_path: Path) -> None:
    # The target is <= 0.60 over 160 rounds (bench/compression_bench.py soak); the ratio falls as a
    # session grows, so this shorter soak allows 0.62. It has settled by 40 rounds: the same two runs
    # of 110 rounds, cut after n, gave 0.680 at 10, 0.614 at 20, 0.585 at 40, 0.577 at 60 and 0.571 at
    # 110, so 60 rounds hold the claim at half the CPU of 110. Fixed prompt text counts only on the compressed
    # side (uncompressed prompts are capped by the budget): new instructions show up here first.
    # Every prompt token counts here, as on a server without a prefix cache: there folds go in a prompt
    # of their own (`fold_prompt: separate`); a fold that opens with its role's prompt is mostly cached.
    separate = {"fold_prompt": "separate"}
    on = run_soak(tmp_path / "on", rounds=COMPARED_ROUNDS, window=WINDOW, settings={"planner": separate, "code_generator": separate})
    off = run_soak(tmp_path / "off", rounds=COMPARED_ROUNDS, window=WINDOW, compression=False)
    ratio = total_prompt_tokens(on) / total_prompt_tokens(off)
    assert ratio <= 0.62, f"compression on costs {ratio:.3f} of the tokens of the same {COMPARED_ROUNDS} rounds without it (at most 0.62 here)"


def test_the_variables_are_listed_once_within_their_share(soak: SoakRun) -> None:
    problems = variables_problems(soak.requests, budget=soak.budget)
    assert len(problems) == 0, f"{len(problems)} problems with the CodeGenerator's variables list:\n" + "\n".join(problems[:5])


# A, B and C, each at small scale


def huge_failure() -> str:
    """A cell that prints ~30,000 characters, ~4,000 of warnings on stderr, then raises 25 calls deep."""
    frames = [f"def level_{i}(params):\n    return level_{i + 1}(params)" for i in range(25)]
    frames.append("def level_25(params):\n    raise ValueError(f\"All 70 fits failed. Invalid parameter 'alpha' for estimator Ridge: {params}\")")
    return "\n".join(
        [
            "import sys",
            "for i in range(600):",
            '    print(f\'fold {i:3d}: mean_test_score {i * 0.37:.4f} params {{"alpha": {i}, "max_iter": 1000}}\')',
            "for k in range(70):",
            "    print(f'/opt/venv/lib/python3.12/site-packages/sklearn/model_selection/_validation.py:378: "
            "FitFailedWarning: fit {k} of 70 failed', file=sys.stderr)",
            *frames,
            "level_0({'alpha': [0.1, 1.0, 10.0], 'solver': 'auto'})",
        ]
    )


def wide_kernel(prefix: str) -> str:
    """A cell leaving WIDE variables with short descriptions (ints, short lists, dicts), so one list fits but two crowd the prompt."""
    lines = []
    for i in range(WIDE):
        if i % 3 == 0:
            lines.append(f"{prefix}_{i:03d} = {i}")
        elif i % 3 == 1:
            lines.append(f"{prefix}_{i:03d} = list(range({i % 5}))")
        else:
            lines.append(f"{prefix}_{i:03d} = {{'segment': {i}}}")
    lines.append(f"print('made {WIDE} variables for {prefix}')")
    return "\n".join(lines)


def test_a_huge_failing_cell_does_not_push_the_summary_out_of_the_retry_prompt(tmp_path: Path, server: ScriptedServer) -> None:
    """A: the guard dropped the summary before cutting a long traceback in the current round."""
    with open_soak_session(tmp_path, server, window=WINDOW) as session:
        ask(session, 1)
        ask(session, 2)
        server.enqueue("code_generator", code_reply(huge_failure()))
        ask(session, 3)
    retry = role_requests(server, "code_generator")[-1]
    assert "ValueError" in last_user_text(retry.messages), "precondition: the last CodeGenerator call is the retry after the failure"
    assert has_summary(retry), "the retry prompt lost the summary to make room for the failed cell's output (A)"
    assert planner_step(3) in last_user_text(retry.messages), "the step being fixed must stay verbatim in the retry's last message"
    answer = role_requests(server, "planner")[-1]
    assert has_summary(answer), "the Planner's prompt after the noisy failure lost the summary"
    over = overflows(server.requests, window=WINDOW)
    assert len(over) == 0, "requests over the window around a huge failing cell:\n" + "\n".join(over)


def test_a_wide_kernel_is_listed_once_and_leaves_room_for_the_summary(tmp_path: Path, server: ScriptedServer) -> None:
    """B: after a fold the variables were listed twice (template and summary) and crowded the summary out."""
    server.enqueue("code_generator", code_reply(wide_kernel("wide")))
    with open_soak_session(tmp_path, server, window=WINDOW) as session:
        for n in (1, 2, 3, 4):
            ask(session, n)
        assert folded_through(session)["code_generator"] >= 2, "precondition: the CodeGenerator folded its first rounds"
        kept = len(session.live_variables().variables)
    assert kept > 100, f"precondition: over 100 variables in the kernel, found {kept}"
    problems = variables_problems(server.requests, budget=BUDGET)
    assert len(problems) == 0, "the CodeGenerator's variables list after a fold (B):\n" + "\n".join(problems[:5])
    last = role_requests(server, "code_generator")[-1]
    assert has_summary(last), "with 150 variables in the kernel the CodeGenerator's prompt lost its summary (B)"


def test_fold_calls_fit_the_window_and_see_every_round_they_fold(tmp_path: Path, server: ScriptedServer) -> None:
    """C: fold prompts carried two uncut variable lists, passed the window and cut the folded rounds to nothing."""
    folds = FoldRecorder()
    server.enqueue("code_generator", code_reply(wide_kernel("wide") + "\nfor i in range(300):\n    print('line', i, 'of a long report')"))
    with open_soak_session(tmp_path, server, window=WINDOW, listeners=[folds]) as session:
        for n in (1, 2, 3, 4, 5):
            ask(session, n)
        folded = folded_through(session)
    fold_requests = role_requests(server, "compression")
    over = overflows(fold_requests, window=WINDOW)
    assert len(over) == 0, "fold requests over the window (C):\n" + "\n".join(over)
    for role, through in folded.items():
        assert through >= 3, f"precondition: the {role} folded rounds 1-3 at least, it folded through {through}"
        assert folds.prompts.get(role), f"precondition: the {role}'s fold calls were recorded (ModelCalled, purpose compression_{role})"
        inputs = "\n".join(folds.prompts[role])
        unseen = [n for n in range(1, through + 1) if marker(n) not in inputs]
        assert not unseen, f"the {role}'s summary covers rounds 1-{through}, but its fold calls never saw the requests of rounds {unseen} (C)"
