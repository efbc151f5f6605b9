"""A work queue of keys (client-go's workqueue, in small): each key is due at a time, is handed to one worker at a
time, and a key added while a worker holds it is handed out again once that worker is done, so no wake-up is lost
and no key is worked on twice at once."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)


class WorkQueue(Generic[K]):
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._due: dict[K, float] = {}  # waiting keys -> when they are due
        self._again: dict[K, float] = {}  # keys added while held by a worker -> when they are due once released
        self._held: set[K] = set()
        self._changed = asyncio.Event()

    def __len__(self) -> int:
        return len(self._due) + len(self._again)

    def add(self, key: K, delay: float = 0.0) -> None:
        """Make key due in `delay` seconds, or sooner if it already is."""
        due = self._clock() + delay
        pending = self._again if key in self._held else self._due
        pending[key] = min(pending.get(key, math.inf), due)
        self._changed.set()

    def forget(self, key: K) -> None:
        """Drop every pending wake-up of key (its object is gone)."""
        self._due.pop(key, None)
        self._again.pop(key, None)

    def done(self, key: K, hold: float = 0.0) -> None:
        """A worker releases key; wake-ups that came in meanwhile make it due again, but not within `hold` seconds
        (time for the watch to deliver what the worker itself just wrote)."""
        self._held.discard(key)
        if key in self._again:
            self._due[key] = max(self._again.pop(key), self._clock() + hold)
            self._changed.set()

    def take_due(self) -> tuple[K | None, float | None]:
        """(a due key, now held by the caller) or (None, seconds until the next one is due; None: nothing waits)."""
        if not self._due:
            return None, None
        key = min(self._due, key=self._due.__getitem__)
        wait = self._due[key] - self._clock()
        if wait > 0:
            return None, wait
        del self._due[key]
        self._held.add(key)
        return key, None

    async def get(self) -> K:
        """Wait for a due key and hold it; the caller must call `done(key)` when finished."""
        while True:
            key, wait = self.take_due()
            if key is not None:
                return key
            self._changed.clear()
            try:
                await asyncio.wait_for(self._changed.wait(), timeout=wait)
            except TimeoutError:
                pass
