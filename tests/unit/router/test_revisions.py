"""KV revisions during a KV-incompatible rollout: each engine names its revision on its health answers, every request
goes to one revision (the desired one once it has both roles), its prefill and decode legs never cross revisions, a
conversation bound to another revision moves with a `revision_changed` miss, and a decode pod of a revision that
takes no new work holds nothing for /drain."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest

from duplex.children import duplex_drain
from duplex_sidecars.router.endpoints import DECODE, PREFILL, EnginePool, Engines, HealthProber
from duplex_sidecars.router.picker import Hints, decode_picker, prefill_picker

from .fake_engine import FakeEngine

A, B, C = "aaaa0001", "bbbb0002", "cccc0003"
USER = {"role": "user", "content": "Summarise the report. " + "row value " * 40}
KEYED = {"Authorization": "Bearer tenant-a"}  # a tenant of its own: its receipts name the miss reason


def engines(prefill: dict[str, str | None], decode: dict[str, str | None], desired: str | None = None) -> Engines:
    """Healthy engines by URL with their revisions (None: not probed yet)."""
    out = Engines()
    for role, revisions in ((PREFILL, prefill), (DECODE, decode)):
        out.set_role(role, list(revisions), desired=desired)
        for url, revision in revisions.items():
            engine = out.pool(role).engines[url]
            engine.healthy, engine.revision = True, revision
    return out


# ---- which revision new work goes to --------------------------------------------------------------------------------


def test_the_desired_revision_once_it_has_both_roles():
    both = engines({"http://pa": A, "http://pb1": B, "http://pb2": B}, {"http://da": A, "http://db": B}, desired=A)
    assert both.target_revision() == A  # desired and complete, though B has more engines
    both.desired = {PREFILL: C, DECODE: C}  # the operator's new revision has no engine yet
    assert both.target_revision() == B  # the complete revision with the most serving engines


@pytest.mark.parametrize(
    "state",
    [
        {"draining": True},  # its decode pod is going away
        {"healthy": False},  # its probe or last leg failed
        {"healthy": None},  # not probed yet
    ],
    ids=["draining", "unhealthy", "unprobed"],
)
def test_a_desired_revision_without_a_serving_decode_is_not_complete(state: dict[str, Any]):
    rollout = engines({"http://pa": A, "http://pb": B}, {"http://da": A, "http://db": B}, desired=B)
    for name, value in state.items():
        setattr(rollout.decode.engines["http://db"], name, value)
    assert rollout.complete_revisions() == {A: 2}
    assert rollout.target_revision() == A


def test_equal_revisions_are_told_apart_by_name():
    assert engines({"http://pb": B, "http://pa": A}, {"http://db": B, "http://da": A}).target_revision() == A


def test_no_complete_revision_or_none_known_means_no_constraint():
    assert engines({"http://pa": A}, {"http://db": B}, desired=A).target_revision() is None
    assert engines({"http://p": None}, {"http://d": None}).target_revision() is None
    assert Engines().target_revision() is None


def test_engines_naming_no_revision_are_a_revision_of_their_own():
    legacy = engines({"http://p0": "", "http://pb": B}, {"http://d0": "", "http://db": B}, desired="")
    assert legacy.target_revision() == ""  # the Services say "" until the first KV-incompatible change
    legacy.desired = {PREFILL: B, DECODE: B}
    assert legacy.target_revision() == B


def test_when_the_roles_labels_disagree_the_prefill_services_comes_first():
    both = engines({"http://pa": A, "http://pb": B}, {"http://da": A, "http://db": B})
    both.desired = {PREFILL: B, DECODE: A}
    assert both.target_revision() == B
    both.desired = {PREFILL: C, DECODE: A}  # the prefill Service's revision is not complete: the decode's
    assert both.target_revision() == A


# ---- learning the revisions ---------------------------------------------------------------------------------------


async def test_the_health_probe_reads_each_engines_revision():
    named, unnamed = await FakeEngine("p", revision=A).start(), await FakeEngine("d").start()
    pool = Engines()
    pool.set_role(PREFILL, [named.url])
    pool.set_role(DECODE, [unnamed.url])
    p, d = pool.prefill.engines[named.url], pool.decode.engines[unnamed.url]
    assert (p.revision, d.revision) == (None, None)  # not probed yet
    async with aiohttp.ClientSession() as session:
        prober = HealthProber(pool, session, "/health", 60, 2)
        try:
            await prober.probe_all()
            assert (p.revision, d.revision) == (A, "")  # "": an engine that names none
            assert pool.describe()["prefill"]["endpoints"][0]["revision"] == A
            await named.close()
            await prober.probe_all()
            assert p.healthy is False and p.revision == A  # a failed probe keeps what is known
        finally:
            await unnamed.close()


# ---- pairing --------------------------------------------------------------------------------------------------------


def mixed_pool(role: str) -> EnginePool:
    pool = Engines().pool(role)
    pool.set_urls(["http://a1", "http://a2", "http://b1", "http://new"])
    for url, revision in (("http://a1", A), ("http://a2", A), ("http://b1", B)):
        pool.engines[url].healthy, pool.engines[url].revision = True, revision
    return pool


@pytest.mark.parametrize("role", [PREFILL, DECODE])
def test_the_pickers_take_only_engines_of_the_requests_revision(role: str):
    pool = mixed_pool(role)
    picker = prefill_picker() if role == PREFILL else decode_picker()
    a1, a2, b1 = (pool.engines[u] for u in ("http://a1", "http://a2", "http://b1"))
    with pool.busy(a1), pool.busy(a1), pool.busy(a2), pool.busy(a2):
        assert {picker.pick(pool, Hints(revision=A)).url for _ in range(50)} <= {"http://a1", "http://a2"}
        assert picker.pick(pool, Hints(revision=B)) is b1
    a1.healthy = False
    # a failed engine of the revision is a last resort; never one of another revision, nor one not probed yet
    assert picker.pick(pool, Hints(frozenset({"http://a2"}), sticky="http://b1", revision=A)) is a1
    assert picker.pick(pool, Hints(revision=C)) is None
    assert picker.pick(pool, Hints(revision=None)) is not None  # no constraint


async def test_prefill_and_decode_of_a_request_share_its_revision(make_rig):
    rig = await make_rig(n_prefill=2, n_decode=2)
    await rollout(rig, desired=B)
    rig.decode[1].actions.append(500)  # B's only decode engine fails: the retry stays on B
    for conv in ("a", "b", "c"):
        status, _, _ = await rig.chat([USER], conv=conv)
        assert status == 200
    assert not rig.prefill[0].seen and not rig.decode[0].seen  # revision A took nothing
    assert len(rig.prefill[1].seen) == 4 and len(rig.decode[1].seen) == 4  # 3 turns, one decode retry
    rig.router.engines.set_role(DECODE, [rig.decode[0].url], draining=[rig.decode[1].url], desired=B)
    status, _, _ = await rig.chat([USER], conv="d")  # B has no serving decode left: the turn goes to A whole
    assert status == 200 and len(rig.prefill[0].seen) == 1 and len(rig.decode[0].seen) == 1


async def test_a_conversation_bound_to_another_revision_moves_to_the_desired_one(make_rig):
    rig = await make_rig(n_prefill=2, n_decode=2)
    await rollout(rig, desired=A)
    _, out, _ = await rig.post("/v1/chat/completions", chat([USER]), headers=KEYED)
    text = out["choices"][0]["message"]["content"]
    await rollout(rig, desired=B)  # both roles of B are up: new turns go there
    history = [USER, {"role": "assistant", "content": text}, {"role": "user", "content": "next"}]
    status, out, headers = await rig.post("/v1/chat/completions", chat(history), headers=KEYED)
    assert status == 200 and 'kv;desc="miss:revision_changed"' in headers["Server-Timing"]
    assert rig.metric("duplex_router_kv_reuse_misses_total", reason="revision_changed") == 1
    assert len(rig.prefill[1].seen) == 1 and len(rig.decode[1].seen) == 1  # recomputed on B ...
    async with rig.session.get(rig.server.admin_url + "/ready") as resp:
        ready = await resp.json()
    assert ready["kv_revision"] == {"target": B, "desired": {PREFILL: B, DECODE: B}}
    assert [e["revision"] for e in ready["decode"]["endpoints"]] == [A, B]
    history += [{"role": "assistant", "content": out["choices"][0]["message"]["content"]}, USER]
    _, _, headers = await rig.post("/v1/chat/completions", chat(history), headers=KEYED)
    assert 'kv;desc="hit:' in headers["Server-Timing"]  # ... and bound there


# ---- /drain -------------------------------------------------------------------------------------------------------


@pytest.fixture
def engine_key(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    monkeypatch.setenv("TEST_ENGINE_KEY", "engine-key")
    return {"engine_api_key_env": "TEST_ENGINE_KEY", "admin_port": 0}


async def test_a_decode_engine_of_a_retired_revision_holds_nothing(make_rig, engine_key, monkeypatch):
    monkeypatch.setattr(duplex_drain, "say", lambda message: None)
    rig = await make_rig(n_prefill=2, n_decode=2, **engine_key)
    d_a, d_b = (e.url for e in rig.decode)
    await rollout(rig, desired=A)
    await rig.chat([USER], conv="a")
    assert await drain_state(rig, d_a) == {"endpoint": d_a, "known": True, "draining": False, "held": 1, "inflight": 0}
    await rollout(rig, desired=B)
    state = await drain_state(rig, d_a, active="120")
    assert state == {**state, "held": 0, "active": 0, "revision": A, "retired": True}
    assert await rig.router.store.held(d_a) == 1  # still stored, but no prefill of A will read it
    assert "retired" not in await drain_state(rig, d_b)
    rig.router.engines.set_role(DECODE, [d_b], draining=[d_a], desired=B)  # the old decode pod is deleted
    hook = asyncio.to_thread(duplex_drain.wait, rig.server.admin_url, d_a, "engine-key", 30.0, 0.05)
    assert await asyncio.wait_for(hook, 10) == "released"


# ---- helpers --------------------------------------------------------------------------------------------------------


async def rollout(rig: Any, desired: str) -> None:
    """Engine 0 of each role runs revision A, engine 1 revision B; the Services name `desired`."""
    for role, fakes in ((PREFILL, rig.prefill), (DECODE, rig.decode)):
        fakes[0].revision, fakes[1].revision = A, B
        rig.router.engines.set_role(role, [e.url for e in fakes], desired=desired)
    await rig.router.prober.probe_all()


def chat(messages: list[dict[str, Any]]) -> dict[str, Any]:
    return {"model": "m", "messages": messages, "conversation_id": "c"}


async def drain_state(rig: Any, url: str, **query: str) -> Any:
    headers = {"Authorization": "Bearer engine-key"}
    async with rig.session.get(
        rig.server.admin_url + "/drain", params={"endpoint": url, **query}, headers=headers
    ) as resp:
        assert resp.status == 200
        return await resp.json()


def test_the_canary_pairs_only_engines_of_the_revision_turns_go_to():
    from types import SimpleNamespace

    from duplex_sidecars.router.canary import Canary
    from duplex_sidecars.router.config import CanaryConfig

    both = engines({"http://pa": A, "http://pb": B}, {"http://da": A, "http://db": B}, desired=B)
    canary = Canary(CanaryConfig(), lambda: SimpleNamespace(engines=both), lambda: None)  # type: ignore[arg-type,return-value]
    assert canary._healthy() == (("http://pb",), ("http://db",))
    legacy = engines({"http://p1": None, "http://p2": ""}, {"http://d": ""})  # one not probed yet: no revision known
    assert Canary(CanaryConfig(), lambda: SimpleNamespace(engines=legacy), lambda: None)._healthy()[0] == (  # type: ignore[arg-type,return-value]
        "http://p2",
    )


def test_the_canary_leaves_out_a_draining_engine_while_another_serves():
    from types import SimpleNamespace

    from duplex_sidecars.router.canary import Canary
    from duplex_sidecars.router.config import CanaryConfig

    pool = engines({"http://p": A}, {"http://d1": A, "http://d2": A})
    pool.decode.engines["http://d1"].draining = True  # a node drain: it binds nothing while d2 serves
    canary = Canary(CanaryConfig(), lambda: SimpleNamespace(engines=pool), lambda: None)  # type: ignore[arg-type,return-value]
    assert canary._healthy() == (("http://p",), ("http://d2",))
    pool.decode.engines["http://d2"].draining = True  # the last ones bind again: the canary checks them
    assert canary._healthy() == (("http://p",), ("http://d1", "http://d2"))
