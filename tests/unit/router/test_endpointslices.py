"""EndpointSlice discovery: slice parsing, and the list+watch loop against a fake API server reached through a
kubeconfig (the real control plane is covered by tests/integration/test_router_endpointslices.py)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
import yaml
from aiohttp import web
from aiohttp.test_utils import TestServer

from duplex_sidecars.router.config import EndpointSliceDiscovery
from duplex_sidecars.router.endpoints import DECODE, PREFILL
from duplex_sidecars.router.endpointslices import (
    REVISION_LABEL,
    ApiAccess,
    EndpointSliceWatcher,
    slice_endpoints,
    slice_revision,
    slice_urls,
)


def make_slice(
    name: str,
    service: str,
    addresses: list[tuple[str, Any]],
    port: int = 8000,
    port_name: str = "http",
    rv: str = "1",
    revision: str | None = None,
) -> dict[str, Any]:
    labels = {"kubernetes.io/service-name": service}
    if revision is not None:
        labels[REVISION_LABEL] = revision  # the Service's label, copied by Kubernetes
    return {
        "metadata": {"name": name, "resourceVersion": rv, "labels": labels},
        "addressType": "IPv4",
        "ports": [{"name": "side", "port": 5600}, {"name": port_name, "port": port}],
        "endpoints": [{"addresses": [a], "conditions": {"ready": r} if r is not None else {}} for a, r in addresses],
    }


TERMINATING_SERVING = {"ready": False, "serving": True, "terminating": True}


def test_slice_endpoints_tell_draining_from_ready():
    s = make_slice("s", "svc", [("10.0.0.1", True)])
    s["endpoints"] += [
        {"addresses": ["10.0.0.2"], "conditions": TERMINATING_SERVING},
        {"addresses": ["10.0.0.3"], "conditions": {"ready": False, "serving": False, "terminating": True}},
        {"addresses": ["10.0.0.4"], "conditions": {"terminating": True}},  # serving unset: serving
    ]
    assert slice_endpoints(s, "http", "http") == (
        ["http://10.0.0.1:8000"],
        ["http://10.0.0.2:8000", "http://10.0.0.4:8000"],
    )


def test_slice_urls_ready_only():
    s = make_slice("s", "svc", [("10.0.0.1", True), ("10.0.0.2", False), ("10.0.0.3", None)])
    s["endpoints"].append({"addresses": ["10.0.0.4"], "conditions": {"ready": True, "terminating": True}})
    s["endpoints"].append({"addresses": ["fd00::5"], "conditions": {"ready": True}})
    assert slice_urls(s, "http", "http") == ["http://10.0.0.1:8000", "http://10.0.0.3:8000", "http://[fd00::5]:8000"]
    assert slice_urls(s, "grpc", "http") == []
    assert slice_urls({"metadata": {}}, "http", "http") == []


class FakeApiServer:
    def __init__(self) -> None:
        self.slices: dict[str, dict[str, Any]] = {}
        self.version = 10
        self.watchers: list[tuple[str, asyncio.Queue]] = []
        self.auth: list[str] = []
        self.lists = 0
        self.server: TestServer | None = None

    async def start(self) -> str:
        app = web.Application()
        app.router.add_get("/apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices", self.handle)
        self.server = TestServer(app)
        await self.server.start_server()
        return str(self.server.make_url("")).rstrip("/")

    def _selected(self, selector: str) -> list[dict[str, Any]]:
        key, _, value = selector.partition("=")
        return [s for s in self.slices.values() if s["metadata"]["labels"].get(key) == value]

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.auth.append(request.headers.get("Authorization", ""))
        selector = request.query["labelSelector"]
        if request.query.get("watch") != "1":
            self.lists += 1
            return web.json_response(
                {
                    "kind": "EndpointSliceList",
                    "metadata": {"resourceVersion": str(self.version)},
                    "items": self._selected(selector),
                }
            )
        resp = web.StreamResponse()
        await resp.prepare(request)
        queue: asyncio.Queue = asyncio.Queue()
        entry = (selector, queue)
        self.watchers.append(entry)
        try:
            while True:
                event = await queue.get()
                if event is None:
                    break
                await resp.write(json.dumps(event).encode() + b"\n")
        finally:
            self.watchers.remove(entry)
        return resp

    def emit(self, kind: str, obj: dict[str, Any]) -> None:
        self.version += 1
        obj["metadata"]["resourceVersion"] = str(self.version)
        if kind == "DELETED":
            self.slices.pop(obj["metadata"]["name"], None)
        else:
            self.slices[obj["metadata"]["name"]] = obj
        service = obj["metadata"]["labels"]["kubernetes.io/service-name"]
        for selector, queue in self.watchers:
            if selector == f"kubernetes.io/service-name={service}":
                queue.put_nowait({"type": kind, "object": obj})

    def expire_watches(self) -> None:
        for _, queue in self.watchers:
            queue.put_nowait({"type": "ERROR", "object": {"kind": "Status", "code": 410, "message": "too old"}})


@pytest.fixture
async def api(tmp_path):
    server = FakeApiServer()
    base = await server.start()
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": base}}],
                "users": [{"name": "u", "user": {"token": "tok"}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u", "namespace": "ns"}}],
                "current-context": "x",
            }
        )
    )
    yield server, str(kubeconfig)
    for _, queue in list(server.watchers):
        queue.put_nowait(None)
    await server.server.close()


async def eventually(predicate, timeout: float = 20.0) -> None:
    for _ in range(int(timeout / 0.02)):
        if predicate():
            return
        await asyncio.sleep(0.02)
    raise AssertionError("condition not reached")


async def test_watch_follows_ready_endpoints(api):
    server, kubeconfig = api
    server.slices["p-1"] = make_slice("p-1", "eng-prefill", [("10.0.0.1", True), ("10.0.0.2", False)])
    server.slices["other"] = make_slice("other", "unrelated", [("10.9.9.9", True)])
    seen: dict[str, list[str]] = {}
    discovery = EndpointSliceDiscovery(
        namespace="ns", prefill_service="eng-prefill", decode_service="eng-decode", kubeconfig=kubeconfig
    )
    draining: dict[str, list[str]] = {}

    def on_change(role: str, urls: list[str], leaving: list[str], desired: str | None) -> None:
        seen[role], draining[role] = urls, leaving

    watcher = EndpointSliceWatcher(discovery, on_change)
    await watcher.start()
    try:
        await eventually(lambda: seen.get(PREFILL) == ["http://10.0.0.1:8000"] and seen.get(DECODE) == [])
        await eventually(lambda: len(server.watchers) == 2)
        server.emit("ADDED", make_slice("d-1", "eng-decode", [("10.0.1.1", True)]))
        await eventually(lambda: seen[DECODE] == ["http://10.0.1.1:8000"])
        server.emit("MODIFIED", make_slice("p-1", "eng-prefill", [("10.0.0.1", True), ("10.0.0.2", True)]))
        await eventually(lambda: seen[PREFILL] == ["http://10.0.0.1:8000", "http://10.0.0.2:8000"])
        server.emit("ADDED", make_slice("d-2", "eng-decode", [("10.0.1.2", True)]))
        await eventually(lambda: seen[DECODE] == ["http://10.0.1.1:8000", "http://10.0.1.2:8000"])
        # d-1's pod is deleted: terminating but still serving (its preStop hook runs), then gone
        leaving = make_slice("d-1", "eng-decode", [])
        leaving["endpoints"] = [{"addresses": ["10.0.1.1"], "conditions": TERMINATING_SERVING}]
        server.emit("MODIFIED", leaving)
        await eventually(lambda: draining[DECODE] == ["http://10.0.1.1:8000"])
        assert seen[DECODE] == ["http://10.0.1.2:8000"]
        server.emit("DELETED", make_slice("d-1", "eng-decode", []))
        await eventually(lambda: seen[DECODE] == ["http://10.0.1.2:8000"] and draining[DECODE] == [])
        lists = server.lists
        server.expire_watches()  # 410 Gone: relist
        await eventually(lambda: server.lists >= lists + 2)
        server.emit("ADDED", make_slice("d-3", "eng-decode", [("10.0.1.3", True)]))
        await eventually(lambda: seen[DECODE] == ["http://10.0.1.2:8000", "http://10.0.1.3:8000"])
        assert set(server.auth) == {"Bearer tok"}
        assert watcher.synced == {PREFILL: True, DECODE: True}
    finally:
        await watcher.stop()


async def test_router_drops_entries_of_a_decode_endpoint_that_leaves_its_slice(api):
    from duplex_sidecars.router.app import Router
    from duplex_sidecars.router.config import RouterConfig
    from duplex_sidecars.router.history import Covered
    from duplex_sidecars.router.store import Entry

    server, kubeconfig = api
    server.slices["d-1"] = make_slice("d-1", "dec", [("127.0.0.1", True), ("127.0.0.2", True)], port=9)
    config = RouterConfig(
        discovery={"namespace": "ns", "prefill_service": "pre", "decode_service": "dec", "kubeconfig": kubeconfig},
        health_check={"interval_seconds": 60, "timeout_seconds": 0.2},
    )
    router = Router(config)
    await router.start()
    try:
        await eventually(lambda: len(router.engines.decode) == 2)
        await router.store.put(
            "k", Entry("http://127.0.0.2:9", params={"x": 1}, covered=Covered("text", "d", 1)), ttl=60
        )
        server.emit("MODIFIED", make_slice("d-1", "dec", [("127.0.0.1", True), ("127.0.0.2", False)], port=9))
        await eventually(lambda: len(router.engines.decode) == 1)
        await router.engines.settle()
        taken = await router.store.take("k")
        assert taken.params is None and taken.reason == "endpoint_gone"
    finally:
        await router.stop()


def test_a_slice_carries_its_services_revision_label():
    assert slice_revision(make_slice("s", "svc", [], revision="0a1b2c3d")) == "0a1b2c3d"
    assert slice_revision(make_slice("s", "svc", [], revision="")) == ""  # engines from before revisions
    assert slice_revision(make_slice("s", "svc", [])) is None
    assert slice_revision({"metadata": {}}) is None


async def test_watch_reports_each_roles_desired_revision(api):
    server, kubeconfig = api
    server.slices["p-1"] = make_slice("p-1", "pre", [("10.0.0.1", True)], revision="aaaa0001")
    server.slices["d-1"] = make_slice("d-1", "dec", [("10.0.1.1", True)])
    desired: dict[str, str | None] = {}
    discovery = EndpointSliceDiscovery(
        namespace="ns", prefill_service="pre", decode_service="dec", kubeconfig=kubeconfig
    )

    def on_change(role: str, urls: list[str], leaving: list[str], revision: str | None) -> None:
        desired[role] = revision

    watcher = EndpointSliceWatcher(discovery, on_change)
    await watcher.start()
    try:
        await eventually(lambda: desired == {PREFILL: "aaaa0001", DECODE: None} and len(server.watchers) == 2)
        # the operator labels both Services with a new revision; the slices follow
        server.emit("MODIFIED", make_slice("d-1", "dec", [("10.0.1.1", True)], revision="bbbb0002"))
        server.emit("MODIFIED", make_slice("p-1", "pre", [("10.0.0.1", True)], revision="bbbb0002"))
        await eventually(lambda: desired == {PREFILL: "bbbb0002", DECODE: "bbbb0002"})
        # a second slice of the role, its label not copied yet: the first slice by name decides
        server.emit("ADDED", make_slice("p-2", "pre", [("10.0.0.2", True)], revision="aaaa0001"))
        await asyncio.sleep(0.1)
        assert desired[PREFILL] == "bbbb0002"
        server.emit("DELETED", make_slice("p-1", "pre", []))
        await eventually(lambda: desired[PREFILL] == "aaaa0001")
    finally:
        await watcher.stop()


async def test_the_router_takes_the_desired_revision_from_the_slices(api):
    from duplex_sidecars.router.app import Router
    from duplex_sidecars.router.config import RouterConfig

    server, kubeconfig = api
    server.slices["p-1"] = make_slice("p-1", "pre", [("127.0.0.1", True)], port=9, revision="aaaa0001")
    server.slices["d-1"] = make_slice("d-1", "dec", [("127.0.0.2", True)], port=9, revision="aaaa0001")
    config = RouterConfig(
        discovery={"namespace": "ns", "prefill_service": "pre", "decode_service": "dec", "kubeconfig": kubeconfig},
        health_check={"interval_seconds": 60, "timeout_seconds": 0.2},
    )
    router = Router(config)
    await router.start()
    try:
        await eventually(lambda: router.engines.desired == {PREFILL: "aaaa0001", DECODE: "aaaa0001"})
    finally:
        await router.stop()


def test_in_cluster_access_needs_the_environment(monkeypatch):
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(RuntimeError):
        ApiAccess.in_cluster()
