"""Engine choice (least outstanding, sticky decode, health tiers) and endpoint-set changes."""

from __future__ import annotations

from collections import Counter

from duplex_sidecars.router.endpoints import DECODE, PREFILL, EnginePool, Engines, normalize_url
from duplex_sidecars.router.metrics import RouterMetrics


def pool(*urls: str) -> EnginePool:
    p = EnginePool(PREFILL, RouterMetrics())
    p.set_urls(urls)
    for e in p.engines.values():
        e.healthy = True
    return p


def test_least_outstanding_wins():
    p = pool("http://a", "http://b", "http://c")
    a, b, c = p.engines.values()
    with p.busy(a), p.busy(a), p.busy(b):
        assert p.pick() is c
        with p.busy(c), p.busy(c), p.busy(c):
            assert p.pick() is b
    assert a.inflight == b.inflight == c.inflight == 0


def test_ties_spread_the_load():
    p = pool("http://a", "http://b")
    assert set(Counter(p.pick().url for _ in range(200))) == {"http://a", "http://b"}


def test_health_tiers_and_exclusion():
    p = pool("http://a", "http://b", "http://c")
    a, b, c = p.engines.values()
    a.healthy, b.healthy, c.healthy = False, None, True
    with p.busy(c), p.busy(c):
        assert p.pick() is c  # healthy beats unprobed, whatever the load
    assert p.pick(exclude=["http://c"]) is b
    assert p.pick(exclude=["http://c", "http://b"]) is a  # unhealthy only as a last resort
    one = pool("http://only")
    assert one.pick(exclude=["http://only"]).url == "http://only"  # retry on the same engine if nothing else
    assert pool().pick() is None


def test_sticky_preference_unless_unhealthy_or_excluded():
    p = pool("http://a", "http://b")
    a, b = p.engines.values()
    with p.busy(b), p.busy(b):
        assert p.pick(prefer="http://b") is b
        assert p.pick(prefer="http://b", exclude=["http://b"]) is a
        b.healthy = False
        assert p.pick(prefer="http://b") is a
    assert p.pick(prefer="http://gone") in (a, b)


def test_set_urls_keeps_state_and_reports_departures():
    p = pool("http://a", "http://b/")
    p.engines["http://a"].inflight = 3
    removed = p.set_urls(["http://a", "http://c"])
    assert removed == ["http://b"]
    assert p.engines["http://a"].inflight == 3 and p.engines["http://c"].healthy is None


def test_normalize_url():
    assert normalize_url(" 10.0.0.1:8000/ ") == "http://10.0.0.1:8000"
    assert normalize_url("https://x") == "https://x"


async def test_decode_departures_trigger_callbacks_and_readiness():
    engines = Engines(RouterMetrics())
    dropped: list[str] = []

    async def on_removed(urls):
        dropped.extend(urls)

    engines.on_decode_removed(on_removed)
    engines.set_role(PREFILL, ["http://p"])
    engines.set_role(DECODE, ["http://d1", "http://d2"])
    assert not engines.ready()
    engines.prefill.engines["http://p"].healthy = True
    engines.decode.engines["http://d2"].healthy = True
    assert engines.ready()
    engines.set_role(PREFILL, [])  # prefill departures drop nothing
    engines.set_role(DECODE, ["http://d1"])
    await engines.settle()
    assert dropped == ["http://d2"] and not engines.ready()
    desc = engines.describe()
    assert desc["decode"]["total"] == 1 and desc["prefill"]["total"] == 0
