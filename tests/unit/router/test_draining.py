"""A draining decode engine (its pod terminating, in its preStop hook): the conversations bound to it read its blocks
once more and bind elsewhere; it takes no new legs while another engine is left; /drain on the admin port tells the
hook what it still holds, to the engine key only. A draining prefill engine takes legs only while no other is left,
and its hook holds the pod until another serves. And the router's own shutdown lets what is in flight finish."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from duplex.children import duplex_drain
from duplex_sidecars.router.app import shutdown
from duplex_sidecars.router.endpoints import DECODE, PREFILL
from duplex_sidecars.router.store import Entry, MemoryStore

USER = {"role": "user", "content": "Summarise the report. " + "row value " * 40}


def follow_up(text: str) -> list[dict[str, Any]]:
    return [USER, {"role": "assistant", "content": text}, {"role": "user", "content": "next"}]


async def drain_state(rig: Any, url: str, key: str | None = "engine-key") -> tuple[int, Any]:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    async with rig.session.get(rig.server.admin_url + "/drain", params={"endpoint": url}, headers=headers) as resp:
        return resp.status, await resp.json()


@pytest.fixture
def engine_key(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    monkeypatch.setenv("TEST_ENGINE_KEY", "engine-key")
    return {"engine_api_key_env": "TEST_ENGINE_KEY", "admin_port": 0}


async def test_a_bound_conversation_reads_from_the_draining_engine_once_and_binds_elsewhere(make_rig, engine_key):
    rig = await make_rig(n_decode=2, **engine_key)
    d0, d1 = (e.url for e in rig.decode)
    rig.router.engines.set_role(DECODE, [d1])  # the first turns all bind to d0
    rig.router.engines.set_role(DECODE, [d0])
    texts = {conv: (await rig.chat([USER], conv=conv))[2] for conv in ("a", "b")}
    assert await drain_state(rig, d0) == (
        200,
        {"endpoint": d0, "known": True, "draining": False, "held": 2, "inflight": 0},
    )

    rig.router.engines.set_role(DECODE, [d1], draining=[d0])  # d0's pod is deleted: terminating, still serving
    await rig.router.engines.settle()
    assert rig.metric("duplex_router_store_dropped_entries_total") == 0  # nothing dropped: d0 still serves reads
    status, state = await drain_state(rig, d0)
    assert status == 200 and state["draining"] and state["held"] == 2

    before = len(rig.decode[0].seen)
    status, _, _ = await rig.chat(follow_up(texts["a"]), conv="a")
    assert status == 200 and rig.metric("duplex_router_kv_reuse_hits_total") == 1  # d0's blocks were read
    assert len(rig.decode[0].seen) == before  # ... but decode ran on d1
    assert (await drain_state(rig, d0))[1]["held"] == 1
    assert (await drain_state(rig, d1))[1]["held"] == 1  # "a" is bound to d1 now

    await rig.chat(follow_up(texts["b"]), conv="b")
    assert (await drain_state(rig, d0))[1] | {"inflight": 0} == {
        "endpoint": d0,
        "known": True,
        "draining": True,
        "held": 0,
        "inflight": 0,
    }
    assert rig.metric("duplex_router_kv_reuse_hits_total") == 2
    assert rig.metric("duplex_router_endpoints", role="decode", state="draining") == 1


async def test_the_last_decode_engine_draining_still_binds_and_its_conversations_move_once_another_serves(make_rig):
    """A single decode pod replaced (a node drain): its turns until the replacement serves bind to it rather than
    recompute every time; then the next turn reads from it and binds to the replacement, and it holds nothing."""
    rig = await make_rig(n_decode=2)
    d0, d1 = (e.url for e in rig.decode)
    rig.router.engines.set_role(DECODE, [], draining=[d0])
    status, _, text = await rig.chat([USER], conv="a")
    assert status == 200  # served rather than refused
    assert await rig.router.store.held(d0) == 1  # bound: the turn after reads it back
    history = follow_up(text)
    status, _, text = await rig.chat(history, conv="a")
    assert status == 200 and rig.metric("duplex_router_kv_reuse_hits_total") == 1
    rig.router.engines.set_role(DECODE, [d1], draining=[d0])  # the replacement
    assert rig.router.prober is not None
    await rig.router.prober.probe_all()
    await rig.chat([*history, {"role": "assistant", "content": text}, {"role": "user", "content": "more"}], conv="a")
    assert rig.metric("duplex_router_kv_reuse_hits_total") == 2  # read from d0 once more ...
    assert await rig.router.store.held(d0) == 0 and await rig.router.store.held(d1) == 1  # ... and bound to d1


async def test_drain_needs_the_engine_key_and_an_endpoint(make_rig, engine_key):
    rig = await make_rig(**engine_key)
    url = rig.decode[0].url
    assert (await drain_state(rig, url, key=None))[0] == 401
    assert (await drain_state(rig, url, key="wrong"))[0] == 401
    async with rig.session.get(rig.server.admin_url + "/drain", headers={"Authorization": "Bearer engine-key"}) as r:
        assert r.status == 400
    async with rig.session.get(rig.url + "/drain", params={"endpoint": url}) as r:
        assert r.status == 404  # never on the API port


async def test_held_counts_live_replayable_entries_of_one_endpoint() -> None:
    now = [100.0]
    store = MemoryStore(100, clock=lambda: now[0])
    live = Entry(decode_url="http://d0", params={"remote_block_ids": [1]}, covered=None, scope="s")
    await store.put("a", live, ttl=10)
    await store.put("b", Entry(decode_url="http://d0", params={"remote_block_ids": [2]}, scope="s"), ttl=30)
    await store.put("c", Entry(decode_url="http://d0", reason="no_params"), ttl=30)  # a tombstone holds nothing
    await store.put("d", Entry(decode_url="http://d1", params={"remote_block_ids": [3]}, scope="s"), ttl=30)
    assert await store.held("http://d0") == 2
    await store.take("b")
    assert await store.held("http://d0") == 1
    assert await store.held("http://d0", remaining=15) == 0  # "a" has 10 s left: stored longer ago than that
    await store.put("e", Entry(decode_url="http://d0", params={"remote_block_ids": [4]}, scope="s"), ttl=30)
    assert await store.held("http://d0", remaining=15) == 1  # "e", just stored
    await store.take("e")
    now[0] += 11  # "a" expired
    assert await store.held("http://d0") == 0 and await store.held("http://d1") == 1


# --- the decode pod's preStop hook (operator/duplex/children/duplex_drain.py) against this router -----------------


async def test_the_pre_stop_hook_returns_once_the_last_bound_conversation_moved(make_rig, engine_key, monkeypatch):
    monkeypatch.setattr(duplex_drain, "say", lambda message: None)
    answers: list[Any] = []
    ask = duplex_drain.ask
    monkeypatch.setattr(duplex_drain, "ask", lambda *a: answers.append(ask(*a)) or answers[-1])
    rig = await make_rig(n_decode=2, **engine_key)
    d0, d1 = (e.url for e in rig.decode)
    rig.router.engines.set_role(DECODE, [d0])
    _, _, text = await rig.chat([USER], conv="a")
    rig.router.engines.set_role(DECODE, [d1], draining=[d0])
    hook = asyncio.create_task(
        asyncio.to_thread(duplex_drain.wait, rig.server.admin_url, d0, "engine-key", 30.0, interval=0.05)
    )
    while len(answers) < 3:  # the hook has seen the pod draining and holding "a"
        await asyncio.sleep(0.01)
    assert not hook.done() and answers[-1]["draining"] and answers[-1]["held"] == 1
    await rig.chat(follow_up(text), conv="a")
    assert await asyncio.wait_for(hook, 10) == "released"


async def test_the_pre_stop_hook_gives_up_on_an_unreachable_router_and_at_its_deadline(make_rig, engine_key):
    rig = await make_rig(**engine_key)
    d0 = rig.decode[0].url
    await rig.chat([USER], conv="a")  # bound: the hook would wait
    assert await asyncio.to_thread(duplex_drain.wait, rig.server.admin_url, d0, "engine-key", 0.3, 0.05) == "deadline"
    closed = "http://127.0.0.1:1"
    assert await asyncio.to_thread(duplex_drain.wait, closed, d0, "engine-key", 30.0, 0.01) == "unreachable"


async def test_a_draining_prefill_is_the_last_resort_and_is_held_until_another_serves(
    make_rig, engine_key, monkeypatch
):
    """A node drain evicting the only prefill pod: it keeps taking turns (no request finds no prefill) and its hook
    waits until a replacement has answered a probe; then new turns go there and the hook lets the pod go."""
    monkeypatch.setattr(duplex_drain, "say", lambda message: None)
    rig = await make_rig(n_prefill=2, **engine_key)
    p0, p1 = (e.url for e in rig.prefill)
    engines = rig.router.engines
    engines.set_role(PREFILL, [], draining=[p0])  # p0's pod is evicted; p1, its replacement, is not listed yet
    status, _, _ = await rig.chat([USER], conv="a")
    assert status == 200 and len(rig.prefill[0].seen) == 1  # served by the draining pod rather than refused
    assert (await drain_state(rig, p0))[1] == {
        "endpoint": p0,
        "known": True,
        "role": "prefill",
        "draining": True,
        "inflight": 0,
        "others": 0,
        "held": 1,
    }
    hook = asyncio.create_task(
        asyncio.to_thread(duplex_drain.wait, rig.server.admin_url, p0, "engine-key", 30.0, interval=0.05)
    )
    await asyncio.sleep(0.3)
    assert not hook.done()
    engines.set_role(PREFILL, [p1], draining=[p0])  # the replacement is Ready
    assert rig.router.prober is not None
    await rig.router.prober.probe_all()
    assert await asyncio.wait_for(hook, 10) == "released"
    await rig.chat([USER], conv="b")
    assert len(rig.prefill[0].seen) == 1 and len(rig.prefill[1].seen) == 1  # new turns go to the replacement


# --- the router's own shutdown ------------------------------------------------------------------------------------


async def test_on_shutdown_a_stream_in_flight_finishes_and_new_connections_are_refused(make_rig):
    rig = await make_rig()
    rig.d.stall_seconds = 0.5
    rig.d.actions.append("stall_mid")  # the answer's first word, then half a second of nothing
    turn = asyncio.create_task(rig.chat([USER], conv="a", stream=True))
    while not rig.d.seen:  # the decode leg is streaming
        await asyncio.sleep(0.01)
    assert rig.server.server is not None
    stopping = asyncio.create_task(shutdown(rig.server.server, rig.router, grace=10))
    while rig.server.server.api._server.is_serving():
        await asyncio.sleep(0.01)
    with pytest.raises(OSError):
        await asyncio.open_connection("127.0.0.1", rig.server.port)
    status, _, text = await turn
    assert status == 200 and text == "hello world again"  # the whole answer, not a cut stream
    await stopping
    rig.server.server = None


async def test_bindings_per_decode_host_are_counted_for_the_fabric_report(make_rig):
    rig = await make_rig(n_decode=2)
    d0, d1 = (e.url for e in rig.decode)
    rig.router.engines.set_role(DECODE, [d0])
    for conv in ("a", "b"):
        await rig.chat([USER], conv=conv)
    rig.router.engines.set_role(DECODE, [d0, d1])
    counts = await rig.router.count_bindings()
    assert counts == {d0.split("//")[1]: 2, d1.split("//")[1]: 0}
    assert rig.router.bindings == counts


async def test_only_bindings_stored_within_the_active_window_hold_a_draining_pod(make_rig, engine_key, monkeypatch):
    monkeypatch.setattr(duplex_drain, "say", lambda message: None)
    rig = await make_rig(**engine_key)
    d0 = rig.decode[0].url
    await rig.chat([USER], conv="a")
    rig.router.engines.set_role(DECODE, [], draining=[d0])
    headers = {"Authorization": "Bearer engine-key"}
    for active, expected in (("120", 1), ("0", 0)):
        async with rig.session.get(
            rig.server.admin_url + "/drain", params={"endpoint": d0, "active": active}, headers=headers
        ) as resp:
            state = await resp.json()
        assert (state["held"], state["active"]) == (1, expected)
    async with rig.session.get(
        rig.server.admin_url + "/drain", params={"endpoint": d0, "active": "soon"}, headers=headers
    ) as resp:
        assert resp.status == 400
    # "a" was stored more than 0 s ago: finished, as far as a hook with --active 0 is concerned
    released = await asyncio.to_thread(
        duplex_drain.wait, rig.server.admin_url, d0, "engine-key", 30.0, 0.05, active=0.0
    )
    assert released == "released"
    held = await asyncio.to_thread(duplex_drain.wait, rig.server.admin_url, d0, "engine-key", 0.5, 0.05, active=120.0)
    assert held == "deadline"


async def test_a_worker_rank_is_held_while_its_leader_answers_and_let_go_once_it_stops(make_rig) -> None:
    rig = await make_rig()
    health = rig.d.url + "/health"
    assert await asyncio.to_thread(duplex_drain.leader_answers, health)
    rig.d.health_status = 503  # an engine whose core died answers, but not 200
    assert not await asyncio.to_thread(duplex_drain.leader_answers, health)
    assert not await asyncio.to_thread(duplex_drain.leader_answers, "http://127.0.0.1:1/health")

    now = [0.0]
    clock, sleep = (lambda: now[0]), (lambda s: now.__setitem__(0, now[0] + s))
    up = iter([True, True, False, True] + [False] * 10)  # one failed probe is a blip, not a leader gone
    assert duplex_drain.hold_while_leader(health, 60, 2.0, clock, sleep, lambda url: next(up)) == "leader gone"
    assert now[0] == 2.0 * (4 + duplex_drain.UNREACHABLE_TRIES - 1)
    now[0] = 0.0
    assert duplex_drain.hold_while_leader(health, 30, 2.0, clock, sleep, lambda url: True) == "deadline"


def test_the_hook_needs_a_router_or_a_leader(monkeypatch: pytest.MonkeyPatch) -> None:
    said: list[str] = []
    monkeypatch.setattr(duplex_drain, "say", said.append)
    monkeypatch.delenv("LEADER", raising=False)
    assert duplex_drain.main(["--leader-env", "LEADER", "--deadline", "5"]) == 0 and "not set" in said[-1]
    monkeypatch.setenv("LEADER", "127.0.0.1")
    assert duplex_drain.main(["--leader-env", "LEADER", "--port", "1", "--deadline", "0"]) == 0
    assert said[-1].startswith("deadline after")
    with pytest.raises(SystemExit):
        duplex_drain.main(["--deadline", "5"])
