"""examples/local-redis.yaml on the real node: two router pods share their conversation state in a Redis pod, found by
its Service name through the node's cluster DNS; both routers restarted mid-conversation, the next turn still reuses
decode's KV."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import yaml
from conftest import ROOT, Cluster, wait_for
from test_serving import Chat, Counters

NAMESPACE = "e2e-redis"
SERVING = "local-redis"


@pytest.fixture
def redis_namespace(installed: Cluster) -> Iterator[Cluster]:
    """The namespace, emptied afterwards: its pods would take the node's CPU from the tests after it (a drained decode
    pod and its replacement run side by side). The serving goes first, and its decode pod's drain hook finds the
    routers gone and ends; the namespace itself is left to go in the background, since the namespace controller
    looks again only after the longest grace period of the pods it saw (a decode pod's: its drain deadline)."""
    installed.kubectl("create", "namespace", NAMESPACE)
    yield installed
    installed.kubectl("-n", NAMESPACE, "delete", "dsv", SERVING, "--wait=true", timeout=120)
    wait_for(lambda: not installed.pods(NAMESPACE, "app.kubernetes.io/part-of=duplex"), 120, "the serving's pods gone")
    installed.kubectl("delete", "namespace", NAMESPACE, "--wait=false")


def test_routers_restarted_keep_reusing_through_redis(redis_namespace: Cluster) -> None:
    installed = redis_namespace
    docs = list(yaml.safe_load_all((ROOT / "examples/local-redis.yaml").read_text()))
    serving = next(d for d in docs if d["kind"] == "DisaggregatedServing")
    serving["spec"]["prefill"]["enablePrefixCaching"] = False  # every reused token read back (conftest.local_example)
    installed.kubectl("-n", NAMESPACE, "apply", "-f", "-", input=yaml.safe_dump_all(docs))
    condition = lambda kind: installed.condition(kind, SERVING, NAMESPACE).get("status") == "True"  # noqa: E731
    wait_for(lambda: condition("Ready"), 300, "the Redis-backed serving Ready")
    chat = Chat(installed, NAMESPACE, SERVING)
    counters = Counters(installed, NAMESPACE, SERVING)
    chat.turn()
    chat.turn()
    routers = counters.engines("router")
    assert len(routers) == 2
    hits_before = counters.router("duplex_router_kv_reuse_hits_total")
    assert hits_before >= 1
    names = [p["metadata"]["name"] for p in routers]
    installed.kubectl("-n", NAMESPACE, "delete", "pod", *names, "--wait=true", timeout=180)
    wait_for(lambda: len(counters.engines("router")) == 2, 180, "two new router pods Ready")
    wait_for(
        lambda: installed.serves_through(f"{SERVING}-router", counters.engines("router"), NAMESPACE),
        60,
        "the router Service sending to the new router pods only",
    )
    external = counters.external()
    chat.turn()  # the new routers never saw this conversation: the entry comes from Redis
    assert counters.router("duplex_router_kv_reuse_hits_total") == 1, "the turn after the restart did not reuse"
    assert counters.external() > external
