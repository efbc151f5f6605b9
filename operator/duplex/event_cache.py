"""The Events the operator posted lately, so that a repeat is counted on the Event already posted rather than posted
anew, the way client-go's event recorder does: a resync that finds the same thing wrong says so once, with a count."""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

# A repeat later than this after the last one starts a new Event (client-go aggregates over 10 minutes too).
WINDOW_SECONDS = 600.0
SIZE = 4096  # Events remembered; the least recently posted goes first (client-go keeps 4096)

Key = tuple[str, str, str, str]  # (involved object's uid, type, reason, message)


@dataclass(frozen=True)
class Posted:
    name: str
    count: int
    first: str  # firstTimestamp, as written
    at: float  # when it was last seen, on the cache's clock


class EventCache:
    """A bounded LRU of the Events posted lately. Thread-safe: the reconcile passes run in worker threads, and each
    count is taken under the lock, so two repeats never claim the same one."""

    def __init__(
        self, size: int = SIZE, window: float = WINDOW_SECONDS, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._size = size
        self._window = window
        self._clock = clock
        self._posted: OrderedDict[Key, Posted] = OrderedDict()
        self._lock = threading.Lock()

    def observe(self, key: Key, name: str, stamp: str) -> Posted:
        """Count an Event: the one it repeats within the window, its count raised by one; otherwise a new one, named
        `name`, first seen at `stamp` (count 1)."""
        with self._lock:
            now = self._clock()
            last = self._posted.get(key)
            if last is None or now - last.at >= self._window:
                return self._keep(key, Posted(name, 1, stamp, now))
            return self._keep(key, Posted(last.name, last.count + 1, last.first, now))

    def restart(self, key: Key, name: str, stamp: str) -> Posted:
        """A new Event in place of the one a repeat was counted on (that one is gone: expired or deleted)."""
        with self._lock:
            return self._keep(key, Posted(name, 1, stamp, self._clock()))

    def _keep(self, key: Key, posted: Posted) -> Posted:
        self._posted[key] = posted
        self._posted.move_to_end(key)
        while len(self._posted) > self._size:
            self._posted.popitem(last=False)
        return posted
