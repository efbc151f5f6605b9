"""The router's canary (router/canary.py) against simulator engines: it passes on a working pair with the bytes each
direction moved, names the failing step when decode keeps nothing or prefill will not read, runs by itself when the
healthy engines change and not otherwise, leaves the router's own metrics and conversations alone, and fails when
the receipt a client would get denies the read the engines counted."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from duplex_dev.launch.sim import SimProcess, async_sim_pair
from duplex_sidecars.router import receipt
from duplex_sidecars.router.app import Router, RouterServer
from duplex_sidecars.router.canary import Canary
from duplex_sidecars.router.config import RouterConfig
from duplex_sidecars.router.endpoints import DECODE
from duplex_sidecars.router.receipt import parse

NO_CACHE = ("--no-enable-prefix-caching",)  # every reused token is then a read


async def router_for(
    prefill: SimProcess, decodes: list[SimProcess], receipts: bool = True, **canary: Any
) -> RouterServer:
    config = RouterConfig.model_validate(
        {
            "prefill": [prefill.url],
            "decode": [d.url for d in decodes],
            "canary": {"enabled": True, "check_seconds": 0.2, **canary},
            "receipts": receipts,
        }
    )
    server = RouterServer(Router(config))
    await server.start()
    return server


@pytest.fixture
async def pair() -> AsyncIterator[tuple[SimProcess, SimProcess]]:
    async with async_sim_pair(prefill_args=NO_CACHE) as engines:
        yield engines


def canary_of(server: RouterServer) -> Canary:
    assert server.router.canary is not None
    return server.router.canary


async def wait_for_run(canary: Canary, runs: int, timeout: float = 20.0) -> dict[str, Any]:
    deadline = asyncio.get_running_loop().time() + timeout
    while canary.runs < runs:
        assert asyncio.get_running_loop().time() < deadline, f"canary ran {canary.runs} times, wanted {runs}"
        await asyncio.sleep(0.05)
    assert canary.result is not None
    return canary.result


async def test_a_working_pair_passes_every_step_and_the_router_counts_none_of_it(pair):
    """Receipts off for clients: the canary still reads its own, and turn 2's agrees with the engines' read."""
    prefill, decode = pair
    server = await router_for(prefill, [decode], receipts=False)
    try:
        verdict = await wait_for_run(canary_of(server), 1)
        assert verdict["ok"] and verdict["step"] == "done", verdict
        assert (verdict["prefill"], verdict["decode"]) == (prefill.url, decode.url)
        assert verdict["p_to_d_bytes"] > 0 and verdict["d_to_p_bytes"] > 0 and verdict["d_to_p_tokens"] >= 64
        assert [t["replayed"] for t in verdict["turns"]] == [False, True]
        first, second = (parse(t["receipt"]) for t in verdict["turns"])
        assert first.reason == "no_entry" and second.tokens >= 64, verdict["turns"]
        assert f"turn 2's receipt: hit:{second.tokens}" in verdict["message"]
        assert prefill.metric("sim_corrupt_blocks_total") == decode.metric("sim_corrupt_blocks_total") == 0
        # The engines did the work; the router's own counters saw no client turn.
        metrics = server.router.metrics
        assert metrics.total("duplex_router_kv_reuse_hits_total") == 0
        assert metrics.total("duplex_router_requests_total") == 0
        # ... and its store holds nothing of it: no binding keeps a draining decode pod waiting
        assert await server.router.store.size() == 0 and await server.router.store.held(decode.url) == 0
        async with aiohttp.ClientSession() as s, s.get(server.url + "/ready") as resp:
            assert (await resp.json())["canary"]["ok"] is True
        await asyncio.sleep(1.0)
        assert canary_of(server).runs == 1  # the same engines: no second run
    finally:
        await server.close()


async def test_a_decode_that_keeps_no_blocks_fails_the_retained_step():
    async with async_sim_pair(prefill_args=NO_CACHE, decode_args=("--no-bidirectional",)) as (prefill, decode):
        server = await router_for(prefill, [decode])
        try:
            verdict = await wait_for_run(canary_of(server), 1)
        finally:
            await server.close()
    assert not verdict["ok"] and verdict["step"] == "retained", verdict
    assert "bidirectional_kv_xfer" in verdict["message"] and "no_params" in verdict["message"]


async def test_a_prefill_that_will_not_read_fails_the_d_to_p_step():
    prefill_args = (*NO_CACHE, "--kv-recompute-threshold", "100000")
    async with async_sim_pair(prefill_args=prefill_args) as (prefill, decode):
        server = await router_for(prefill, [decode], retry_seconds=0.5)
        try:
            verdict = await wait_for_run(canary_of(server), 1)
            assert not verdict["ok"] and verdict["step"] == "d_to_p", verdict
            assert "kv_recompute_threshold" in verdict["message"]
            again = await wait_for_run(canary_of(server), 2)  # a failure is tried again after retry_seconds
            assert again["step"] == "d_to_p" and again["run"] == 2
        finally:
            await server.close()


async def test_a_receipt_that_denies_the_read_the_engines_counted_fails_the_receipt_step(pair, monkeypatch):
    prefill, decode = pair
    monkeypatch.setattr(receipt, "verdict", lambda *_, **__: "miss:no_entry")  # a router that misreports
    server = await router_for(prefill, [decode])
    try:
        verdict = await wait_for_run(canary_of(server), 1)
    finally:
        await server.close()
    assert not verdict["ok"] and verdict["step"] == "receipt", verdict
    assert 'kv;desc="miss:no_entry"' in verdict["message"]


async def test_new_engines_are_verified_each_in_a_pair(pair):
    prefill, decode = pair
    async with SimProcess("decode") as second:
        server = await router_for(prefill, [decode])
        try:
            await wait_for_run(canary_of(server), 1)
            server.router.engines.set_role(DECODE, [decode.url, second.url])
            await server.router.prober.probe_all()
            verdict = await wait_for_run(canary_of(server), 2)
            assert verdict["ok"] and verdict["pairs"] == 2, verdict
        finally:
            await server.close()


async def test_prefills_own_prefix_cache_cannot_stand_in_for_the_read():
    # With prefill's prefix cache on, turn 2 would find turn 1's prompt there and read only the few tokens beyond it
    # (below the threshold: none). Turn 1's cache_salt (vLLM's, honoured by the simulator) keeps it apart.
    async with async_sim_pair() as (prefill, decode):
        server = await router_for(prefill, [decode])
        try:
            verdict = await wait_for_run(canary_of(server), 1)
        finally:
            await server.close()
        assert verdict["ok"], verdict
        assert verdict["d_to_p_tokens"] >= 64
        assert prefill.metric("vllm:prompt_tokens_by_source_total", source="local_cache_hit") == 0
