"""Helpers shared by the tests that read HTTP messages off the wire themselves."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable


async def until(condition: Callable[[], bool], timeout: float = 1.0) -> None:
    """Wait for `condition` to hold; fail the test after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.002)


class HeaderLookup:
    """Case-insensitive lookup over a message's `headers`, a list of (name, value) as they were sent."""

    headers: list[tuple[str, str]]

    def values(self, name: str) -> list[str]:
        return [v for k, v in self.headers if k.lower() == name.lower()]

    def header(self, name: str) -> str | None:
        """The one value of a header (a header sent twice fails the test); None when absent."""
        found = self.values(name)
        assert len(found) <= 1, f"{name} sent {len(found)} times: {found}"
        return found[0] if found else None
