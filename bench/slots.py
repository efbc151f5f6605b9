"""Closed-loop load in threads: one per conversation slot, each with a random source seeded by its slot, started
together and stopped together (the lifecycle and autoscaling benchmarks)."""

from __future__ import annotations

import random
import threading
from collections.abc import Callable


class Slots:
    def __init__(self) -> None:
        self.stopping = threading.Event()  # set by stop(); slots wait on it between turns
        self._threads: list[threading.Thread] = []

    def start(self, count: int, run: Callable[[int, random.Random], None]) -> None:
        for slot in range(count):
            thread = threading.Thread(target=run, args=(slot, random.Random(slot)), daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self, timeout: float = 180.0) -> None:
        """Stop every slot and wait for its turn in flight (up to `timeout` each)."""
        self.stopping.set()
        for thread in self._threads:
            thread.join(timeout=timeout)
