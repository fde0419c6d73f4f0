"""One prompt's work on a thread of its own, and the way back to the protocol's event loop.

A session's turn blocks (the model, the kernel), so each prompt runs on a new thread while the
loop goes on reading the client: a `session/cancel` must reach the turn while it runs. Cancelling
is Ctrl-C: KeyboardInterrupt raised in the turn's thread and the running cell interrupted, so the
session fails the round as cancelled, keeps its kernel and its variables, and stays open.

The turn speaks to the client through the loop: `Outbox` sends its updates in the order they
happened (one sender task, so a burst of printed output never overtakes the cell that printed
it), and `ask_client` waits for the client's answer to a request (a permission) in short steps, so
that a cancel reaches a turn waiting for a person too.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import ctypes
import logging
import threading
from collections.abc import Awaitable, Callable, Coroutine
from typing import TYPE_CHECKING, Any, Generic, TypeVar

if TYPE_CHECKING:  # the kernel's modules come with the first session, not with the agent's start
    from taskweaver_lite.kernel.interface import Executor

_T = TypeVar("_T")
_U = TypeVar("_U")
# Seconds between two looks at a request to the client while a cancel may arrive.
POLL = 0.1
log = logging.getLogger(__name__)


class TurnThread(Generic[_T]):
    """`work()` on a new thread; `result` is awaited on the loop, `cancel` stops it as Ctrl-C does."""

    def __init__(self, loop: asyncio.AbstractEventLoop, work: Callable[[], _T], *, executor: Executor | None = None) -> None:
        self._loop = loop
        self._work = work
        self._executor = executor
        self._running = threading.Lock()  # held while `work` may still be interrupted
        self._finished = False
        self.cancelled = False
        self.result: asyncio.Future[_T] = loop.create_future()
        self._thread = threading.Thread(target=self._run, name="acp-turn", daemon=True)

    def start(self) -> TurnThread[_T]:
        """Start the work; returns self."""
        self._thread.start()
        return self

    def _run(self) -> None:
        outcome: tuple[Any, BaseException | None]
        try:
            try:
                outcome = (self._work(), None)
            finally:
                with self._running:
                    self._finished = True  # from here on a cancel raises nothing in this thread
        except BaseException as exc:  # noqa: BLE001 - handed to the loop, where the prompt waits for it
            outcome = (None, exc)
        with contextlib.suppress(BaseException):  # a cancel that landed in the lines above has nothing left to stop
            from taskweaver_lite.kernel.executor import close_thread_loop

            close_thread_loop()  # the kernel client's loop for this thread
        for _ in range(3):  # a cancel raised a moment late must not keep the outcome from the loop
            try:
                self._loop.call_soon_threadsafe(_settle, self.result, *outcome)
                return
            except KeyboardInterrupt:
                continue
            except RuntimeError:  # the loop closed meanwhile: nobody waits for the outcome
                return

    def cancel(self) -> bool:
        """Ctrl-C in the turn: KeyboardInterrupt in its thread, the running cell interrupted; False when it already ended."""
        with self._running:
            ident = self._thread.ident
            if self._finished or ident is None or self.cancelled:
                return False
            self.cancelled = True
            ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(ident), ctypes.py_object(KeyboardInterrupt))
        if self._executor is not None:
            self._executor.interrupt()  # the cell stops now, not at its next bytecode
        return True


def _settle(future: asyncio.Future[Any], value: Any, error: BaseException | None) -> None:
    if future.done():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(value)


class Outbox(Generic[_U]):
    """Messages to the client from any thread, sent one at a time in the order they were put."""

    def __init__(self, loop: asyncio.AbstractEventLoop, send: Callable[[_U], Awaitable[None]]) -> None:
        self._loop = loop
        self._send = send
        self._queue: asyncio.Queue[_U] = asyncio.Queue()
        self._task = loop.create_task(self._sender())

    def put(self, item: _U) -> None:
        """Queue `item` (from any thread)."""
        self._loop.call_soon_threadsafe(self._queue.put_nowait, item)

    async def flush(self) -> None:
        """Wait until everything put so far has been sent (or failed to be)."""
        await asyncio.sleep(0)  # puts from other threads scheduled before now land first
        await self._queue.join()

    async def _sender(self) -> None:
        while True:
            item = await self._queue.get()
            try:
                await self._send(item)
            except Exception:
                log.warning("An update could not be sent to the client", exc_info=True)
            finally:
                self._queue.task_done()

    def close(self) -> None:
        """Stop sending."""
        self._task.cancel()


def ask_client(loop: asyncio.AbstractEventLoop, request: Coroutine[Any, Any, _T]) -> _T:
    """Run `request` on the loop and wait for its answer from the turn's thread, a cancel (KeyboardInterrupt) able to cut the wait."""
    future = asyncio.run_coroutine_threadsafe(request, loop)
    try:
        while True:
            try:
                return future.result(timeout=POLL)
            except concurrent.futures.TimeoutError:
                continue
    except BaseException:
        future.cancel()
        raise
