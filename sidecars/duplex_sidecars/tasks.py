"""asyncio helpers shared by the router's long-running components."""

from __future__ import annotations

import asyncio
import contextlib


async def cancel_all(tasks: list[asyncio.Task[None]]) -> None:
    """Cancel every task, wait for each to finish, and empty the list; errors of dying tasks are dropped."""
    for task in tasks:
        task.cancel()
    for task in tasks:
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
    tasks.clear()
