"""Shared pytest fixtures."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from taskweaver_lite.config import ExecutionConfig
from taskweaver_lite.kernel.executor import KernelExecutor


@pytest.fixture(scope="module")
def kernel_executor(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KernelExecutor]:
    """One real ipykernel shared by a test module (tests set up the variables they rely on)."""
    config = ExecutionConfig(timeout=60)
    with KernelExecutor(tmp_path_factory.mktemp("kernel-session"), config=config) as executor:
        executor.wait_ready()
        yield executor
