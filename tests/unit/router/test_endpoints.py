"""Engine pools: in-flight counts, health, and endpoint-set changes (choosing among them: test_picker.py)."""

from __future__ import annotations

from duplex_sidecars.router.endpoints import DECODE, PREFILL, EnginePool, Engines, normalize_url
from duplex_sidecars.router.metrics import RouterMetrics


def pool(*urls: str) -> EnginePool:
    p = EnginePool(PREFILL, RouterMetrics())
    p.set_urls(urls)
    for e in p.engines.values():
        e.healthy = True
    return p


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
