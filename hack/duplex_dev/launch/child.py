"""What the launchers of routers and engines share: a process on a loopback port with a log file and /metrics.

Child: the launcher gives url, start() (which sets `_startup`), stop() and `_startup_for(timeout)`, what its
    readiness poll is; wait_ready(timeout) polls it (on a failure the process is stopped and the error raised
    with its log's tail); log_tail(), metrics(), metric(name, **labels); `with` and `async with` start it, wait
    until it is ready and stop it on the way out, also when it never got ready.
"""

from __future__ import annotations

import asyncio
import time
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, Self

from duplex_dev import processes


class Child(ABC):
    log_path: str | Path
    _startup: processes.Startup | None = None
    poll_interval = 0.05  # between readiness checks
    scrape_timeout = 5.0  # for one /metrics scrape

    @property
    @abstractmethod
    def url(self) -> str: ...

    @abstractmethod
    def start(self) -> Self: ...

    @abstractmethod
    def stop(self) -> object: ...

    @abstractmethod
    def _startup_for(self, timeout: float) -> processes.Startup: ...

    def _started_again(self) -> bool:
        """After a failed start: True when the launcher has started it once more (then the wait goes on)."""
        return False

    def _check(self) -> bool:
        """True once ready; False to look again; raises (after stopping the process) when it will not be."""
        assert self._startup is not None, "start() first"
        try:
            return self._startup.check()
        except self._startup.error:
            if self._started_again():
                return False
            self.stop()
            raise

    def wait_ready(self, timeout: float | None = None) -> Self:
        if timeout is not None:
            self._startup = self._startup_for(timeout)
        while not self._check():
            time.sleep(self.poll_interval)
        return self

    async def wait_ready_async(self, timeout: float | None = None) -> Self:
        if timeout is not None:
            self._startup = self._startup_for(timeout)
        while not await asyncio.to_thread(self._check):
            await asyncio.sleep(self.poll_interval)
        return self

    def log_tail(self, lines: int = 40) -> str:
        return processes.log_tail(self.log_path, lines)

    def metrics(self) -> list[processes.Sample]:
        return processes.scrape(f"{self.url}/metrics", timeout=self.scrape_timeout)

    def metric(self, name: str, **labels: str) -> float:
        return processes.metric_sum(self.metrics(), name, **labels)

    def __enter__(self) -> Self:
        try:
            return self.start().wait_ready()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *_: Any) -> None:
        self.stop()

    async def __aenter__(self) -> Self:
        try:
            self.start()
            return await self.wait_ready_async()
        except BaseException:
            self.stop()
            raise

    async def __aexit__(self, *_: Any) -> None:
        await asyncio.to_thread(self.stop)
