"""Shared pytest fixtures, and the test tiers: every test is `unit`, `kernel`, `cli`, `soak`, `llama`, `postgres` or `team`.

A file's tier is its `pytestmark = pytest.mark.<tier>` line; a test's own tier marker wins over its
file's (a quick check in a kernel file). A test with no tier fails, saying where to put one.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

# The fixtures import what they build when first used: a run of a few unit tests (and the tier check's
# own pytest run) starts without the kernel client and the PostgreSQL driver.
if TYPE_CHECKING:
    from taskweaver_lite.kernel.executor import KernelExecutor
    from taskweaver_lite.store.interface import Store
    from taskweaver_lite.testing.postgres_cluster import PostgresCluster
    from taskweaver_lite.testing.scripted_server import ScriptedServer

TIERS = ("unit", "kernel", "cli", "soak", "llama", "postgres", "team", "otlp")
# unit: no kernel, no program started, nothing off this machine (a scripted model server on 127.0.0.1 in
# a thread is fine); kernel: a real ipykernel (local, sandboxed or on a gateway) or a browser; cli: the
# program run as a command; soak: long sessions and endurance; llama: llama.cpp's own server, built once
# by .ci/llama-server.sh (the tests skip without it); postgres: a private PostgreSQL server started
# for the test run (the store's tests on their second backend); team: several `serve` processes on that
# PostgreSQL server and a real kernel gateway (the replicas' flows, faults included); otlp: traces sent to Arize
# Phoenix, installed once by .ci/phoenix.sh in its own venv, and read back from it (the tests skip without it).


_UNTIERED = pytest.StashKey[bool]()


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
