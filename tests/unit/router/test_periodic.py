"""The background loop every long-running part of the router runs its rounds in."""

from __future__ import annotations

import asyncio
import logging

import pytest

from duplex_sidecars.router.periodic import Periodic

log = logging.getLogger(__name__)


async def test_a_failing_round_is_logged_and_the_loop_goes_on(caplog: pytest.LogCaptureFixture) -> None:
    rounds: list[int] = []

    async def step() -> None:
        rounds.append(len(rounds))
        if len(rounds) == 1:
            raise RuntimeError("boom")

    periodic = Periodic("counting", step, lambda: 0.01, log, at_start=True)
    periodic.start()
    periodic.start()  # once only
    for _ in range(100):
        if len(rounds) >= 3:
            break
        await asyncio.sleep(0.01)
    await periodic.stop()
    assert len(rounds) >= 3
    assert "counting failed" in caplog.text
    stopped = len(rounds)
    await asyncio.sleep(0.05)
    assert len(rounds) == stopped  # stopped for good
    await periodic.stop()  # twice is harmless


async def test_the_first_round_waits_an_interval_unless_at_start() -> None:
    rounds: list[str] = []

    async def step() -> None:
        rounds.append("round")

    waiting = Periodic("waiting", step, lambda: 60.0, log)
    at_once = Periodic("at once", step, lambda: 60.0, log, at_start=True)
    waiting.start()
    at_once.start()
    await asyncio.sleep(0.05)
    await waiting.stop()
    await at_once.stop()
    assert rounds == ["round"]


async def test_wake_cuts_the_wait_short() -> None:
    wake = asyncio.Event()
    done = asyncio.Event()

    async def step() -> None:
        wake.clear()
        done.set()

    periodic = Periodic("woken", step, lambda: 60.0, log, wake=wake)
    periodic.start()
    await asyncio.sleep(0.01)
    wake.set()
    await asyncio.wait_for(done.wait(), 1.0)
    await periodic.stop()
