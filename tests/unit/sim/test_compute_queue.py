"""An engine computes one prefill at a time, as vLLM's scheduler does with its per-step token budget: concurrent
requests queue for compute, first come first served, and a request that only decodes does not wait.

The simulated durations are recorded as intervals (the engine's `_sleep`, wrapped), so the assertions are about
order and overlap, not about wall-clock ratios that a loaded machine bends."""

from __future__ import annotations

import asyncio
import itertools
import sys
import time
from dataclasses import dataclass

import pytest

from duplex_sidecars.sim import engine as sim_engine
from duplex_sidecars.sim.cost import CostModel

from .sim_app import sim_client

US_PER_TOKEN = 200.0  # 100 prompt words: ~20 ms of compute each
DECODE_US = 20_000.0  # per output token


@dataclass
class Interval:
    kind: str  # the engine method that slept: "prefill" (compute) or "decode" (an output token)
    start: float
    end: float


@pytest.fixture
def intervals(monkeypatch: pytest.MonkeyPatch) -> list[Interval]:
    """Every simulated duration the engine sleeps, with the method it slept in, as it happens."""
    seen: list[Interval] = []
    real = sim_engine._sleep

    async def recorded(seconds: float) -> None:
        caller = sys._getframe(1).f_code.co_name
        start = time.monotonic()
        await real(seconds)
        seen.append(Interval(caller, start, time.monotonic()))

    monkeypatch.setattr(sim_engine, "_sleep", recorded)
    return seen


def _body(text: str, max_tokens: int = 1) -> dict:
    return {"model": "sim", "prompt": text, "max_tokens": max_tokens}


async def _complete(client, body) -> None:
    resp = await client.post("/v1/completions", json=body)
    assert resp.status == 200, await resp.text()
    await resp.json()


@pytest.mark.asyncio
async def test_concurrent_prefills_queue_for_compute(intervals: list[Interval]) -> None:
    async with sim_client(cost=CostModel(prefill_us_per_token=US_PER_TOKEN)) as client:
        prompts = [" ".join(f"w{i}_{j}" for j in range(100)) for i in range(3)]
        await asyncio.gather(*(_complete(client, _body(p)) for p in prompts))
    prefills = sorted((i for i in intervals if i.kind == "prefill"), key=lambda i: i.start)
    assert len(prefills) == 3
    # One at a time: each computes after the one before it ended.
    for before, after in itertools.pairwise(prefills):
        assert after.start >= before.end, (before, after)


@pytest.mark.asyncio
async def test_decoding_does_not_hold_the_compute(intervals: list[Interval]) -> None:
    cost = CostModel(prefill_us_per_token=US_PER_TOKEN, decode_us_per_token=DECODE_US)
    async with sim_client(cost=cost) as client:
        prompt = " ".join(f"w{j}" for j in range(100))
        long_decode = asyncio.create_task(_complete(client, _body(prompt + " b", max_tokens=20)))
        while not any(i.kind == "decode" for i in intervals):  # the first request has started decoding
            await asyncio.sleep(0.001)
        await _complete(client, _body(prompt + " c"))
        await long_decode
    first_decode = min(i.start for i in intervals if i.kind == "decode")
    last_decode = max(i.end for i in intervals if i.kind == "decode")
    second_prefill = sorted((i for i in intervals if i.kind == "prefill"), key=lambda i: i.start)[1]
    # The second prefill computed while the first request was still decoding: decoding never held the compute.
    assert first_decode < second_prefill.start and second_prefill.end < last_decode
