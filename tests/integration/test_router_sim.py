"""The router in front of real simulator engines (NIXL block transfers, every read block verified): turn 2+ reuses
decode's retained blocks exactly when the history provably extends what they cover, and never otherwise.

Prefill runs without prefix caching (as in the upstream benchmark), so every reused token shows up as an
`external_kv_transfer` prompt token on prefill, and the simulator checks each pulled block against its token prefix
(`sim_corrupt_blocks_total` must stay 0).
"""

from __future__ import annotations

import asyncio
import copy
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from duplex_dev.chat import ChatClient, Conversation, TurnFailed
from duplex_dev.launch.sim import SimProcess
from duplex_sidecars.router.app import Router, RouterServer
from duplex_sidecars.router.config import RouterConfig
from duplex_sidecars.router.config_file import deep_merge
from duplex_sidecars.sim import generation
from duplex_sidecars.sim.chat_template import render_chat

EXTERNAL = "vllm:prompt_tokens_by_source_total"
CORRUPT = "sim_corrupt_blocks_total"
LONG = "Please summarise the following report in detail. " * 12  # well above the recompute threshold


class Engines:
    def __init__(self, prefill: SimProcess, decodes: list[SimProcess]):
        self.prefill = prefill
        self.decodes = decodes

    def external(self) -> float:
        return self.prefill.metric(EXTERNAL, source="external_kv_transfer")

    def corrupt(self) -> float:
        return sum(e.metric(CORRUPT) for e in [self.prefill, *self.decodes])


@pytest.fixture(scope="module")
def engines() -> Iterator[Engines]:
    prefill = SimProcess("prefill", "--no-enable-prefix-caching")
    decodes = [SimProcess("decode"), SimProcess("decode")]
    procs = [prefill, *decodes]
    try:
        for p in procs:
            p.start()
        for p in procs:
            p.wait_ready()
        yield Engines(prefill, decodes)
    finally:
        for p in procs:
            p.stop()


class Rig:
    def __init__(self, router: Router, server: RouterServer, client: ChatClient, engines: Engines):
        self.router = router
        self.server = server
        self.client = client
        self.engines = engines

    def metric(self, name: str, **labels: str) -> float:
        return self.router.metrics.total(name, **labels)

    @property
    def hits(self) -> float:
        return self.metric("duplex_router_kv_reuse_hits_total")

    @property
    def reused_tokens(self) -> float:
        return self.metric("duplex_router_kv_reused_tokens_total")

    def misses(self, reason: str) -> float:
        return self.metric("duplex_router_kv_reuse_misses_total", reason=reason)


@pytest.fixture
async def make_rig(engines: Engines) -> AsyncIterator[Any]:
    made: list[Rig] = []

    async def factory(decodes: list[SimProcess] | None = None, **config: Any) -> Rig:
        base = {"prefill": [engines.prefill.url], "decode": [d.url for d in (decodes or engines.decodes)]}
        router = Router(RouterConfig.model_validate(deep_merge(base, config)))
        server = RouterServer(router)
        await server.start()
        client = await ChatClient(server.url, model="sim").__aenter__()
        rig = Rig(router, server, client, engines)
        made.append(rig)
        return rig

    yield factory
    for rig in made:
        await rig.client.__aexit__()
        await rig.server.close()
    assert engines.corrupt() == 0, "a replayed block did not hold its prefix's KV"


def expected_reply(messages: list[dict[str, Any]], max_tokens: int | None = None, tools: Any = None) -> str:
    """What the deterministic simulator answers for this history, however the KV got there."""
    return generation.chat_text(generation.reply(render_chat(messages, tools), max_tokens).tokens)


async def test_multi_turn_chat_reuses_decodes_blocks_every_turn(make_rig):
    rig = await make_rig()
    conv = Conversation(f"conv-{uuid.uuid4().hex}")
    external0 = rig.engines.external()
    for turn in range(5):
        stream = turn % 2 == 1
        before = copy.deepcopy(conv.messages) + [{"role": "user", "content": LONG + f" turn {turn}"}]
        result = await rig.client.turn(conv, LONG + f" turn {turn}", stream=stream)
        assert result.text == expected_reply(before)
    assert rig.hits == 4
    assert rig.misses("no_entry") == 1
    pulled = rig.engines.external() - external0
    assert pulled > 0
    assert pulled == rig.reused_tokens  # every offered token was pulled from decode, not recomputed


async def test_a_history_below_the_routers_threshold_is_recomputed(make_rig):
    rig = await make_rig(reuse={"min_tokens": 100_000})
    conv = Conversation(f"conv-{uuid.uuid4().hex}")
    external0 = rig.engines.external()
    for turn in range(2):
        before = copy.deepcopy(conv.messages) + [{"role": "user", "content": LONG + f" turn {turn}"}]
        result = await rig.client.turn(conv, LONG + f" turn {turn}")
        assert result.text == expected_reply(before)
    assert rig.hits == 0 and rig.misses("below_threshold") == 1
    assert rig.engines.external() == external0  # prefill read nothing: it computed the history


async def test_completions_reuse(make_rig):
    rig = await make_rig()
    session = rig.client._session
    url = rig.client.base + "/v1/completions"
    prompt = LONG
    external0 = rig.engines.external()
    for turn in range(3):
        async with session.post(
            url, json={"model": "sim", "prompt": prompt, "max_tokens": 12, "conversation_id": "completion-conv"}
        ) as resp:
            body = await resp.json()
            assert resp.status == 200 and "kv_transfer_params" not in body
        prompt = prompt + body["choices"][0]["text"] + f" and then part {turn}"
    assert rig.hits == 2
    assert rig.engines.external() - external0 == rig.reused_tokens > 0


async def test_tool_call_histories_reuse(make_rig):
    rig = await make_rig()
    tools = [
        {
            "type": "function",
            "function": {
                "name": "lookup",
                "description": "look a thing up",
                "parameters": {"type": "object", "properties": {}},
            },
        }
    ]
    conv = Conversation("tools-" + uuid.uuid4().hex)
    conv.messages = [
        {"role": "system", "content": "You are a careful assistant."},
        {"role": "user", "content": LONG},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "lookup", "arguments": '{"q": "x"}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "the answer is 42"},
    ]
    first = await rig.client.send(conv.messages, conv.conversation_id, tools=tools)
    assert first.text == expected_reply(conv.messages, tools=tools)
    conv.messages.append({"role": "assistant", "content": first.text})
    conv.messages += [
        {"role": "user", "content": "Now call it again."},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"id": "call_2", "type": "function", "function": {"name": "lookup", "arguments": "{}"}}],
        },
        {"role": "tool", "tool_call_id": "call_2", "content": "still 42"},
    ]
    second = await rig.client.send(conv.messages, conv.conversation_id, stream=True, tools=tools)
    assert second.text == expected_reply(conv.messages, tools=tools)
    assert rig.hits == 1
    # the same history with different tools would render differently: never reused
    conv.messages += [{"role": "assistant", "content": second.text}, {"role": "user", "content": "thanks"}]
    await rig.client.send(conv.messages, conv.conversation_id)  # no tools this time
    assert rig.hits == 1 and rig.misses("scope_mismatch") == 1


def _variant(history: list[dict[str, Any]], variant: str) -> list[dict[str, Any]]:
    """`history` is [user, assistant reply]; each variant breaks the prefix decode's blocks cover."""
    changed = copy.deepcopy(history)
    if variant == "edited user turn":
        changed[0]["content"] += " (edited)"
    elif variant == "edited reply":
        changed[1]["content"] = changed[1]["content"].replace(" ", "  ", 1)
    elif variant == "truncated reply":
        changed[1]["content"] = changed[1]["content"].rsplit(" ", 1)[0]
    elif variant == "reordered":
        changed.reverse()
    elif variant == "dropped turn":
        changed = changed[1:]
    return changed + [{"role": "user", "content": "next question"}]


@pytest.mark.parametrize(
    "variant", ["edited user turn", "edited reply", "truncated reply", "reordered", "dropped turn"]
)
async def test_changed_histories_never_reuse(make_rig, variant):
    rig = await make_rig()
    conv = Conversation("edit-" + uuid.uuid4().hex)
    await rig.client.turn(conv, LONG)
    changed = _variant(conv.messages, variant)
    external0 = rig.engines.external()
    result = await rig.client.send(changed, conv.conversation_id)
    assert result.text == expected_reply(changed)
    assert rig.hits == 0 and rig.misses("history_mismatch") == 1
    assert rig.engines.external() == external0  # nothing was pulled from decode


async def test_entries_are_single_use(make_rig):
    rig = await make_rig()
    conv = Conversation("once-" + uuid.uuid4().hex)
    await rig.client.turn(conv, LONG)
    nxt = conv.messages + [{"role": "user", "content": "go on"}]
    results = await asyncio.gather(*(rig.client.send(nxt, conv.conversation_id) for _ in range(4)))
    assert {r.text for r in results} == {expected_reply(nxt)}
    assert rig.hits == 1


async def test_tenants_are_isolated(make_rig):
    rig = await make_rig()
    alice = Conversation("shared-id", headers={"Authorization": "Bearer alice"})
    await rig.client.turn(alice, LONG)
    nxt = alice.messages + [{"role": "user", "content": "go on"}]
    await rig.client.send(nxt, "shared-id", headers={"Authorization": "Bearer mallory"})
    await rig.client.send(nxt, "shared-id")
    assert rig.hits == 0 and rig.misses("no_entry") == 3
    await rig.client.send(nxt, "shared-id", headers={"Authorization": "Bearer alice"})
    assert rig.hits == 1


async def test_ttl_expiry_recomputes(make_rig):
    rig = await make_rig(conversation={"ttl_seconds": 0.5})
    conv = Conversation("ttl-" + uuid.uuid4().hex)
    await rig.client.turn(conv, LONG)
    await asyncio.sleep(0.7)
    external0 = rig.engines.external()
    result = await rig.client.turn(conv, "still there?")
    assert result.text == expected_reply(conv.messages[:-1])
    assert rig.misses("expired") == 1 and rig.hits == 0
    assert rig.engines.external() == external0


async def test_decode_endpoint_removal_drops_its_entries(make_rig, engines):
    rig = await make_rig()
    convs = [Conversation(f"rm-{i}-{uuid.uuid4().hex}") for i in range(6)]
    for conv in convs:
        await rig.client.turn(conv, LONG + conv.conversation_id)
    gone, kept = list(rig.router.engines.decode.engines)
    held_by_gone = len(rig.router.store._by_endpoint.get(gone, {}))
    await rig.router.apply(rig.router.config.model_copy(update={"decode": [kept]}))
    await rig.router.engines.settle()
    assert rig.metric("duplex_router_store_dropped_entries_total") == held_by_gone
    for conv in convs:
        await rig.client.turn(conv, "and then?")
    assert rig.misses("endpoint_gone") == held_by_gone
    assert rig.hits == len(convs) - held_by_gone
    assert gone not in rig.router.engines.decode


async def test_two_hundred_concurrent_conversations_without_cross_talk(make_rig):
    rig = await make_rig()
    n = 200
    convs = [Conversation(f"many-{i}-{uuid.uuid4().hex[:6]}") for i in range(n)]
    external0 = rig.engines.external()

    async def run(i: int, conv: Conversation) -> None:
        for turn in range(2):
            text = f"{LONG} conversation {i} turn {turn} " + "detail " * (i % 7)
            history = conv.messages + [{"role": "user", "content": text}]
            result = await rig.client.turn(conv, text, stream=(i + turn) % 2 == 0, max_tokens=8)
            assert result.text == expected_reply(history, max_tokens=8), f"conversation {i} turn {turn}"

    await asyncio.gather(*(run(i, c) for i, c in enumerate(convs)))
    assert rig.hits == n
    assert rig.engines.external() - external0 == rig.reused_tokens
    assert rig.metric("duplex_router_inflight_requests", role="decode", endpoint=rig.engines.decodes[0].url) == 0


async def test_engine_rejections_pass_through(make_rig):
    rig = await make_rig()
    with pytest.raises(TurnFailed) as err:
        await rig.client.send([{"role": "user", "content": "x " * 40000}], "too-long")
    assert err.value.status == 400 and "context length" in err.value.body["error"]["message"]
    rig.client.model = "not-served"
    with pytest.raises(TurnFailed) as err:
        await rig.client.send([{"role": "user", "content": "hi"}])
    assert err.value.status == 404
    assert set(err.value.body["error"]) == {"message", "type", "code"}


async def test_an_engine_that_streams_no_params_gives_its_own_miss_reason(make_rig):
    # As vLLM 0.32 does: a streamed turn leaves nothing to replay. The next turn says why, and is still correct;
    # a non-streamed turn on the same engine still gives reuse.
    old = SimProcess("decode", "--no-stream-kv-params")
    old.start()
    try:
        old.wait_ready()
        rig = await make_rig(decodes=[old])
        conv = Conversation(f"conv-{uuid.uuid4().hex}")
        await rig.client.turn(conv, LONG + " streamed", stream=True)
        before = copy.deepcopy(conv.messages) + [{"role": "user", "content": "and then?"}]
        second = await rig.client.turn(conv, "and then?", stream=False)
        assert second.text == expected_reply(before)
        assert rig.misses("stream_no_params") == 1 and rig.hits == 0
        await rig.client.turn(conv, "once more", stream=False)
        assert rig.hits == 1  # the non-streamed turn before it left decode's params
        captures = rig.router.metrics.registry.get_sample_value(
            "duplex_router_kv_captures_total", {"outcome": "no_params", "stream": "true", "endpoint": old.url}
        )
        assert captures == 1
    finally:
        old.stop()


async def test_the_router_reads_the_engines_nixl_counters(make_rig):
    # prefill's D->P reads and decode's P->D reads, measured by the engines themselves (vllm:nixl_* histograms),
    # read back by the router: bandwidth per engine and per pair, and a verdict against the backend's floor.
    # The simulator's blocks are a few KiB: reads that small measure latency, so none is left out of the verdict here.
    rig = await make_rig(fabric={"backend": "UCX", "interval_seconds": 3600, "floor_gbps": 1e-6, "min_read_bytes": 0})
    conv = Conversation(f"conv-{uuid.uuid4().hex}")
    assert rig.router.fabric is not None
    await rig.router.fabric.scrape_all()  # the baseline
    for turn in range(3):
        await rig.client.turn(conv, LONG + f" turn {turn}")
    await rig.router.fabric.scrape_all()
    fabric = rig.router.fabric.describe()
    by_url = {e["url"]: e for e in fabric["engines"]}
    prefill = by_url[rig.engines.prefill.url]
    assert prefill["reads"] >= 2 and prefill["read_gbps"] > 0  # the two replays read decode's blocks
    assert fabric["healthy"] and "GB/s (UCX)" in fabric["message"], fabric
    decode = rig.router.engines.decode
    owners = {labels_owner for labels_owner in (d.url for d in decode.engines.values())}
    pair = sum(
        rig.metric("duplex_router_kv_pair_bandwidth_bytes_per_second", reader=prefill["url"], owner=o) for o in owners
    )
    assert pair > 0
    async with rig.client._session.get(rig.server.url + "/ready") as resp:
        assert (await resp.json())["fabric"]["healthy"] is True

    # The same reads judged against a floor no loopback reaches: unhealthy, naming the engine and the likely cause.
    rig.router.fabric.floor_gbps = 10_000.0
    for turn in range(2):
        await rig.client.turn(conv, f"more {turn}")
    await rig.router.fabric.scrape_all()
    assert not rig.router.fabric.healthy
    assert "TCP fallback?" in rig.router.fabric.message
    assert rig.metric("duplex_router_kv_transfer_healthy") == 0
