"""The router's background loops (health probes, the fabric watch, the canary, the fabric report, store upkeep, config
reload): one step every so often in a task of its own, started once and stopped by cancelling and awaiting it."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable


class Periodic:
    """Runs `step` every `interval()` seconds (read before each wait: a reload may change it) until `stop`. A step
    that raises is logged as "`what` failed" and the loop goes on: a background part must never die of one bad
    round. With `at_start` the first step runs at once, else after the first wait. Setting `wake` cuts a wait short;
    the owner clears it when it has acted on it."""

    def __init__(
        self,
        what: str,
        step: Callable[[], Awaitable[None]],
        interval: Callable[[], float],
        log: logging.Logger,
        *,
        at_start: bool = False,
        wake: asyncio.Event | None = None,
    ):
        self.what = what
        self._step = step
        self._interval = interval
        self._log = log
        self._at_start = at_start
        self._wake = wake
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _wait(self) -> None:
        if self._wake is None:
            await asyncio.sleep(self._interval())
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), self._interval())

    async def _run(self) -> None:
        if not self._at_start:
            await self._wait()
        while True:
            try:
                await self._step()
            except Exception:
                self._log.exception("%s failed", self.what)
            await self._wait()
