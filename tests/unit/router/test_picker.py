"""The picker: engines in tiers (untried and not failing first), then scored (sticky decode, healthy before
unprobed, fewest in flight), ties at random."""

from __future__ import annotations

import time
from collections import Counter

from duplex_sidecars.router.endpoints import DECODE, EnginePool
from duplex_sidecars.router.leg_costs import Rates
from duplex_sidecars.router.picker import Hints, Picker, decode_picker, least_outstanding


def pool(*urls: str) -> EnginePool:
    p = EnginePool(DECODE)
    p.set_urls(urls)
    for e in p.engines.values():
        e.healthy = True
    return p


def pick(p: EnginePool, tried=(), sticky=None):
    return decode_picker().pick(p, Hints(frozenset(tried), sticky))


def test_least_outstanding_wins():
    p = pool("http://a", "http://b", "http://c")
    a, b, c = p.engines.values()
    with p.busy(a), p.busy(a), p.busy(b):
        assert pick(p) is c
        with p.busy(c), p.busy(c), p.busy(c):
            assert pick(p) is b
    assert a.inflight == b.inflight == c.inflight == 0


def test_ties_spread_the_load():
    p = pool("http://a", "http://b")
    assert set(Counter(pick(p).url for _ in range(200))) == {"http://a", "http://b"}


def test_health_tiers_and_exclusion():
    p = pool("http://a", "http://b", "http://c")
    a, b, c = p.engines.values()
    a.healthy, b.healthy, c.healthy = False, None, True
    with p.busy(c), p.busy(c):
        assert pick(p) is c  # healthy beats unprobed, whatever the load
    assert pick(p, tried=["http://c"]) is b
    assert pick(p, tried=["http://c", "http://b"]) is a  # unhealthy only as a last resort
    one = pool("http://only")
    assert pick(one, tried=["http://only"]).url == "http://only"  # retry on the same engine if nothing else
    assert pick(pool()) is None


def test_sticky_preference_unless_unhealthy_or_excluded():
    p = pool("http://a", "http://b")
    a, b = p.engines.values()
    with p.busy(b), p.busy(b):
        assert pick(p, sticky="http://b") is b
        assert pick(p, sticky="http://b", tried=["http://b"]) is a
        b.healthy = False
        assert pick(p, sticky="http://b") is a
    assert pick(p, sticky="http://gone") in (a, b)


def test_a_placement_policy_is_one_more_scorer():
    # A scorer sees each candidate and the hints; with enough weight it decides, without touching the tiers.
    p = pool("http://a", "http://b")
    a, b = p.engines.values()
    prefer_b = Picker(((10.0, lambda e, h: 1.0 if e.url == "http://b" else 0.0), (1.0, least_outstanding)))
    with p.busy(b), p.busy(b):
        assert prefer_b.pick(p) is b
        assert prefer_b.pick(p, Hints(frozenset({"http://b"}))) is a  # tiers still come first


# ---- prefill placement ------------------------------------------------------------------------------------------

from duplex_sidecars.router.config import PlacementConfig  # noqa: E402
from duplex_sidecars.router.endpoints import PREFILL  # noqa: E402
from duplex_sidecars.router.picker import prefill_picker  # noqa: E402


def prefills(*busy: int) -> EnginePool:
    p = EnginePool(PREFILL)
    p.set_urls([f"http://p{i}" for i in range(len(busy))])
    for engine, legs in zip(p.engines.values(), busy, strict=True):
        engine.healthy, engine.inflight = True, legs
    return p


COST = prefill_picker(PlacementConfig(prefill="cost", queue_ms_per_leg=200, read_ms_per_1k_tokens=10))


def test_cost_keeps_a_conversation_on_the_prefill_that_holds_its_prefix():
    # Both idle: the previous turn's prefill reads nothing from decode for what its prefix cache holds.
    assert COST.pick(prefills(0, 0), Hints(sticky="http://p1", tokens=8000)).url == "http://p1"
    assert COST.pick(prefills(0, 0), Hints(sticky="http://p0", tokens=8000)).url == "http://p0"


def test_cost_moves_a_conversation_when_the_queue_costs_more_than_the_read():
    # p1 has 3 legs waiting (600 ms); reading 10k tokens from decode on p0 costs ~102 ms.
    assert COST.pick(prefills(0, 3), Hints(sticky="http://p1", tokens=10_000)).url == "http://p0"
    # One leg (200 ms) waiting is cheaper than reading 50k tokens (~502 ms).
    assert COST.pick(prefills(0, 1), Hints(sticky="http://p1", tokens=50_000)).url == "http://p1"


def test_cost_without_a_replay_is_the_shortest_queue():
    assert COST.pick(prefills(2, 1, 3), Hints(sticky="http://p0")).url == "http://p1"


def test_round_robin_takes_each_prefill_in_turn():
    rr = prefill_picker(PlacementConfig(prefill="round_robin"))
    pool = prefills(0, 5, 0)
    picked = [rr.pick(pool).url for _ in range(6)]
    assert sorted(set(picked)) == ["http://p0", "http://p1", "http://p2"]  # load does not matter to it
    assert picked[:3] == picked[3:]


def test_least_outstanding_ignores_the_previous_prefill():
    lo = prefill_picker()
    assert lo.pick(prefills(1, 0), Hints(sticky="http://p0", tokens=8000)).url == "http://p1"


def queued(*seconds: float) -> EnginePool:
    """One leg in flight on each engine, just sent, expected to compute `seconds`."""
    p = prefills(*([1] * len(seconds)))
    for engine, s in zip(p.engines.values(), seconds, strict=True):
        engine.queued_seconds = s
        engine._set_backlog(s, time.monotonic())
    return p


def test_cost_weighs_the_compute_queued_not_the_number_of_legs():
    # p0: three short legs (0.3 s of compute); p1: one long first turn (4 s): p0 starts sooner.
    pool = queued(0.3, 4.0)
    pool.engines["http://p0"].inflight = 3
    assert COST.pick(pool, Hints()).url == "http://p0"
    assert prefill_picker().pick(pool, Hints()).url == "http://p1"  # least_outstanding counts legs


def test_cost_moves_a_conversation_only_when_its_queue_outweighs_the_read():
    rates = Rates(per_leg=0.0, compute_per_token=0.003, read_per_token=1e-5, read_latency=0.1)
    picker = prefill_picker(PlacementConfig(prefill="cost"), lambda: rates)
    hints = Hints(sticky="http://p1", tokens=4000)  # reading it elsewhere: 0.1 s + 0.04 s
    assert picker.pick(queued(0.0, 0.1), hints).url == "http://p1"
    assert picker.pick(queued(0.0, 0.2), hints).url == "http://p0"


def test_a_leg_counts_its_expected_compute_while_it_runs():
    pool = prefills(0)
    engine = pool.engines["http://p0"]
    with pool.busy(engine, 1.5):
        assert (engine.inflight, engine.queued_seconds) == (1, 1.5)
        assert 1.4 < engine.backlog_seconds() <= 1.5
    assert (engine.inflight, engine.queued_seconds, engine.backlog_seconds()) == (0, 0.0, 0.0)


def test_the_backlog_is_worked_off_as_the_engine_computes(monkeypatch):
    clock = [100.0]
    monkeypatch.setattr("duplex_sidecars.router.endpoints.time.monotonic", lambda: clock[0])
    pool = prefills(0)
    p0 = pool.engines["http://p0"]
    first, second = pool.busy(p0, 4.0), pool.busy(p0, 2.0)
    first.__enter__()
    second.__enter__()
    assert p0.backlog_seconds() == 6.0
    clock[0] += 3.0
    assert p0.backlog_seconds() == 3.0  # 1 s of the first leg and all of the second still ahead
    first.__exit__(None, None, None)  # done early: no more than the second leg's 2 s can be left
    assert p0.backlog_seconds() == 2.0
    clock[0] += 5.0
    assert p0.backlog_seconds() == 0.0 and p0.inflight == 1  # overran its estimate: nothing more is expected
    second.__exit__(None, None, None)


def test_cost_counts_only_what_is_left_of_a_leg_that_has_been_running(monkeypatch):
    clock = [100.0]
    monkeypatch.setattr("duplex_sidecars.router.endpoints.time.monotonic", lambda: clock[0])
    pool = prefills(0, 0)
    p0, p1 = pool.engines.values()
    with pool.busy(p1, 4.0):
        clock[0] += 3.5
        with pool.busy(p0, 2.0):
            # p1's 4 s leg has 0.5 s left, p0's 2 s leg has just started: p1 can start the next leg sooner.
            assert COST.pick(pool, Hints()).url == "http://p1"
