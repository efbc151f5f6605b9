"""The picker: engines in tiers (untried and not failing first), then scored (sticky decode, healthy before
unprobed, fewest in flight), ties at random."""

from __future__ import annotations

from collections import Counter

from duplex_sidecars.router.endpoints import DECODE, EnginePool
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
