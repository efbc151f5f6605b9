"""EndpointSlice discovery against the real local control plane: the router follows the ready endpoints of the
prefill and decode Services (simulator engines on loopback), serves through them, and drops the stored state of a
decode engine as soon as its endpoint stops being ready.

The API server refuses loopback IPs in EndpointSlices, so the slices carry FQDN endpoints under `duplex.test` that
the router's resolver maps to the loopback address the engines listen on."""

from __future__ import annotations

import asyncio
import socket
import uuid
from typing import Any

import aiohttp.abc
import pytest

from duplex_dev.chat import ChatClient, Conversation
from duplex_dev.launch.sim import SimProcess
from duplex_sidecars.router.app import Router, RouterServer
from duplex_sidecars.router.config import RouterConfig

pytestmark = pytest.mark.cluster

LONG = "Explain how a lighthouse lens focuses light, with history and physics. " * 8


class LoopbackResolver(aiohttp.abc.AbstractResolver):
    """Every *.duplex.test name is the loopback address."""

    async def resolve(self, host: str, port: int = 0, family: int = socket.AF_INET) -> list[dict[str, Any]]:
        if not host.endswith(".duplex.test"):
            raise OSError(f"{host} is not a test name")
        return [
            {
                "hostname": host,
                "host": "127.0.0.1",
                "port": port,
                "family": socket.AF_INET,
                "proto": 0,
                "flags": socket.AI_NUMERICHOST,
            }
        ]

    async def close(self) -> None:
        pass


def fqdn(sim: SimProcess) -> str:
    return f"{sim.engine_id}.duplex.test"


def url(sim: SimProcess) -> str:
    return f"http://{fqdn(sim)}:{sim.port}"


def endpoint_slice(name: str, service: str, sim: SimProcess, ready: bool = True) -> dict[str, Any]:
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": name,
            "labels": {"kubernetes.io/service-name": service, "endpointslice.kubernetes.io/managed-by": "duplex-tests"},
        },
        "addressType": "FQDN",
        "ports": [
            {"name": "http", "port": sim.port, "protocol": "TCP"},
            {"name": "nixl", "port": sim.side_channel_port, "protocol": "TCP"},
        ],
        "endpoints": [{"addresses": [fqdn(sim)], "conditions": {"ready": ready}}],
    }


async def eventually(predicate, timeout: float = 20.0, what: str = "condition") -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


async def test_router_follows_endpointslices(cluster, kubectl, namespace):
    sims = [SimProcess("prefill", "--no-enable-prefix-caching"), SimProcess("decode"), SimProcess("decode")]
    for sim in sims:
        sim.start()
    router = None
    server = None
    try:
        await asyncio.gather(*(s.wait_ready_async() for s in sims))
        prefill, d1, d2 = sims
        kubectl.apply(
            [
                endpoint_slice("pre-1", "eng-prefill", prefill),
                endpoint_slice("dec-1", "eng-decode", d1),
                endpoint_slice("dec-2", "eng-decode", d2, ready=False),
            ],
            namespace=namespace,
        )
        config = RouterConfig(
            discovery={
                "namespace": namespace,
                "prefill_service": "eng-prefill",
                "decode_service": "eng-decode",
                "kubeconfig": str(cluster.kubeconfig),
            },
            health_check={"interval_seconds": 0.5, "timeout_seconds": 1},
        )
        router = Router(config, resolver=LoopbackResolver())
        server = RouterServer(router)
        await server.start()
        decode = router.engines.decode
        await eventually(lambda: router.engines.ready(), what="router ready")
        d1_url, d2_url = url(d1), url(d2)
        assert list(decode.engines) == [d1_url]  # the not-ready endpoint is not used

        async with ChatClient(server.url) as client:
            convs = [Conversation(f"k8s-{i}-{uuid.uuid4().hex[:6]}") for i in range(3)]
            for conv in convs:
                await client.turn(conv, LONG + conv.conversation_id)
            # d2 becomes ready, d1 stops being ready: d1's retained blocks are no longer reachable
            kubectl.apply(
                [
                    endpoint_slice("dec-1", "eng-decode", d1, ready=False),
                    endpoint_slice("dec-2", "eng-decode", d2, ready=True),
                ],
                namespace=namespace,
            )
            await eventually(lambda: list(decode.engines) == [d2_url], what="decode set switched to d2")
            await router.engines.settle()
            assert router.metrics.registry.get_sample_value("duplex_router_store_dropped_entries_total") == 3
            await eventually(lambda: decode.engines[d2_url].healthy is True, what="d2 probed healthy")
            for conv in convs:
                await client.turn(conv, "and then?")
            misses = router.metrics.registry.get_sample_value(
                "duplex_router_kv_reuse_misses_total", {"reason": "endpoint_gone"}
            )
            assert misses == 3
            # the next turns reuse d2's blocks
            for conv in convs:
                await client.turn(conv, "one more")
            assert router.metrics.registry.get_sample_value("duplex_router_kv_reuse_hits_total") == 3
            kubectl("-n", namespace, "delete", "endpointslice", "pre-1")
            await eventually(lambda: len(router.engines.prefill) == 0, what="prefill slice deletion seen")
            assert not router.engines.ready()
        assert prefill.metric("sim_corrupt_blocks_total") == 0
    finally:
        if server is not None:
            await server.close()
        for sim in sims:
            await asyncio.to_thread(sim.stop)
