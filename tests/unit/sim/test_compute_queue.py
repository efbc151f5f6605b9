"""An engine computes one prefill at a time, as vLLM's scheduler does with its per-step token budget: concurrent
requests queue for compute, first come first served, and a request that only decodes does not wait."""

import asyncio
import time

import pytest

from duplex_sidecars.sim.cost import CostModel

from .sim_app import sim_client

US_PER_TOKEN = 200.0  # 100 prompt words: ~20 ms of compute each


def _body(text: str, max_tokens: int = 1) -> dict:
    return {"model": "sim", "prompt": text, "max_tokens": max_tokens}


async def _timed(client, body) -> float:
    started = time.perf_counter()
    resp = await client.post("/v1/completions", json=body)
    assert resp.status == 200, await resp.text()
    await resp.json()
    return time.perf_counter() - started


@pytest.mark.asyncio
async def test_concurrent_prefills_queue_for_compute():
    async with sim_client(cost=CostModel(prefill_us_per_token=US_PER_TOKEN)) as client:
        prompts = [" ".join(f"w{i}_{j}" for j in range(100)) for i in range(4)]
        alone = await _timed(client, _body(prompts[0]))
        together = await asyncio.gather(*(_timed(client, _body(p)) for p in prompts[1:]))
    # Three at once: the last one waits for the other two, so it takes about three times one alone.
    assert max(together) > 2.2 * alone
    assert min(together) < 1.8 * alone


@pytest.mark.asyncio
async def test_decoding_does_not_hold_the_compute():
    cost = CostModel(prefill_us_per_token=US_PER_TOKEN, decode_us_per_token=20_000)
    async with sim_client(cost=cost) as client:
        prompt = " ".join(f"w{j}" for j in range(100))
        alone = await _timed(client, _body(prompt + " a"))
        long_decode = asyncio.create_task(_timed(client, _body(prompt + " b", max_tokens=20)))  # ~0.4 s decoding
        await asyncio.sleep(alone * 2)
        beside = await _timed(client, _body(prompt + " c"))
        await long_decode
    assert beside < alone * 2
