"""What the router tells autoscalers per engine role (docs/install.md, "Autoscaling a role"): saturation (legs in
flight over the serving engines' slots), the wait a new leg would see, and prefill's prompt tokens by source. The
gauges are computed when scraped; nothing is added to the request path but two counter increments."""

from __future__ import annotations

import math

from duplex_sidecars.router.endpoints import DECODE, PREFILL, EnginePool

USER = {"role": "user", "content": "hi"}


def pool(*inflight: int, role: str = PREFILL) -> EnginePool:
    engines = EnginePool(role)
    engines.set_urls([f"http://10.0.0.{i}:8000" for i in range(len(inflight))])
    for engine, n in zip(engines.engines.values(), inflight, strict=True):
        engine.inflight = n
        engine.healthy = True
    return engines


def test_saturation_is_legs_in_flight_over_the_serving_engines_slots() -> None:
    assert pool(2, 6).saturation(8) == 0.5
    assert pool(8, 16).saturation(8) == 1.5  # above 1: legs queue inside the engines
    assert math.isnan(pool(1).saturation(None))  # slots unknown
    assert pool().saturation(8) == 0.0
    busy = pool(4, 4)
    (first, second) = busy.engines.values()
    second.healthy = False  # a failed engine serves nothing: its legs count against the others
    assert busy.saturation(8) == 1.0
    first.draining = True
    assert busy.saturation(8) == math.inf  # legs in flight, no serving engine left


def test_the_expected_wait_is_the_least_loaded_serving_engines_backlog() -> None:
    engines = pool(0, 0)
    (a, b) = engines.engines.values()
    with engines.busy(a, 3.0), engines.busy(b, 1.0):
        assert 0.5 < engines.expected_wait() <= 1.0
        b.draining = True  # a draining decode takes no new leg
        assert 2.5 < engines.expected_wait() <= 3.0
    assert engines.expected_wait() == 0.0


async def test_the_gauges_and_the_token_split_are_scraped_from_the_router(make_rig) -> None:
    rig = await make_rig(capacity={"prefill_slots": 4, "decode_slots": 8})
    _, _, text = await rig.chat([USER])
    await rig.chat([USER, {"role": "assistant", "content": text}, {"role": "user", "content": "more"}])
    assert rig.metric("duplex_router_kv_reuse_hits_total") == 1
    # the fake prefill engine counts 3 prompt tokens a leg; the follow-up's were decode's, read back
    assert rig.metric("duplex_router_prefill_prompt_tokens_total", source="computed") == 3
    assert rig.metric("duplex_router_prefill_prompt_tokens_total", source="read_back") == 3
    for role in (PREFILL, DECODE):
        assert rig.metric("duplex_router_saturation", role=role) == 0.0
        assert rig.metric("duplex_router_expected_wait_seconds", role=role) == 0.0
    async with rig.session.get(rig.url + "/metrics") as resp:
        text = await resp.text()
    assert 'duplex_router_saturation{role="decode"} 0.0' in text
