"""The admin port: what names the topology (engine URLs, per-engine metrics, placement rates) is served there, and
the API port tells a client only whether the router can serve."""

from __future__ import annotations

import json

import pytest

from duplex_sidecars.router.app import ADMIN_ROUTES, API_ROUTES, route_tables
from duplex_sidecars.router.config import RouterConfig

from .conftest import Rig


async def get(rig: Rig, url: str) -> tuple[int, bytes]:
    async with rig.session.get(url) as resp:
        return resp.status, await resp.read()


async def test_the_api_port_says_ready_and_nothing_behind_it(make_rig):
    rig = await make_rig(admin_port=0)
    assert rig.server.admin_url != rig.url
    status, body = await get(rig, rig.url + "/ready")
    assert (status, json.loads(body)) == (200, {"ready": True})
    status, body = await get(rig, rig.url + "/metrics")
    assert status == 404
    for engine in rig.prefill + rig.decode:
        assert engine.url.encode() not in body
    assert (await get(rig, rig.url + "/health"))[0] == 200


async def test_the_admin_port_has_the_detail_and_no_api(make_rig):
    rig = await make_rig(admin_port=0)
    status, body = await get(rig, rig.server.admin_url + "/ready")
    detail = json.loads(body)
    assert status == 200 and detail["ready"] is True
    assert rig.p.url.encode() in body and rig.d.url.encode() in body
    assert {"store", "placement", "calibration", "config_generation"} <= detail.keys()
    assert detail["traces_to"] is None  # tracing off
    status, body = await get(rig, rig.server.admin_url + "/metrics")
    assert status == 200 and b"duplex_router_requests_total" in body
    async with rig.session.post(rig.server.admin_url + "/v1/chat/completions", json={"messages": []}) as resp:
        assert resp.status == 404
    assert rig.p.seen == []


async def test_turns_on_the_api_port_are_counted_on_the_admin_port(make_rig):
    rig = await make_rig(admin_port=0)
    status, _, _ = await rig.chat([{"role": "user", "content": "hi"}])
    assert status == 200
    _, body = await get(rig, rig.server.admin_url + "/metrics")
    assert b'duplex_router_requests_total{route="chat",status="200"} 1.0' in body


async def test_without_an_admin_port_everything_is_on_the_api_port(make_rig):
    rig = await make_rig()
    assert rig.server.admin_url == rig.url
    status, body = await get(rig, rig.url + "/ready")
    assert status == 200 and rig.p.url.encode() in body
    assert (await get(rig, rig.url + "/metrics"))[0] == 200


async def test_the_bare_ready_is_503_when_an_engine_pool_is_empty(make_rig):
    rig = await make_rig(admin_port=0)
    for engine in rig.decode:
        await engine.close()
    await rig.router.prober.probe_all()
    status, body = await get(rig, rig.url + "/ready")
    assert (status, json.loads(body)) == (503, {"ready": False})


@pytest.mark.parametrize("admin_port", [None, 9090])
def test_every_route_is_served_somewhere_and_the_api_routes_are_always_on_the_api_port(admin_port):
    api, admin = route_tables(RouterConfig(admin_port=admin_port))
    assert API_ROUTES.keys() <= api.keys()
    assert (api.keys() | (admin or {}).keys()) == API_ROUTES.keys() | ADMIN_ROUTES.keys()
    assert ("/metrics" in api) is (admin_port is None)
