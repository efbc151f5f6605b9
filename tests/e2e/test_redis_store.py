"""examples/local-redis.yaml on the real node: two router pods share their conversation state in a Redis pod, found by
its Service name through the node's cluster DNS; both routers restarted mid-conversation, the next turn still reuses
decode's KV."""

from __future__ import annotations

import yaml
from conftest import ROOT, Cluster, wait_for
from test_serving import Chat, Counters

NAMESPACE = "e2e-redis"
SERVING = "local-redis"


def test_routers_restarted_keep_reusing_through_redis(installed: Cluster) -> None:
    docs = list(yaml.safe_load_all((ROOT / "examples/local-redis.yaml").read_text()))
    serving = next(d for d in docs if d["kind"] == "DisaggregatedServing")
    serving["spec"]["prefill"]["enablePrefixCaching"] = False  # every reused token read back (conftest.local_example)
    installed.kubectl("create", "namespace", NAMESPACE)
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
    external = counters.external()
    chat.turn()  # the new routers never saw this conversation: the entry comes from Redis
    assert counters.router("duplex_router_kv_reuse_hits_total") == 1, "the turn after the restart did not reuse"
    assert counters.external() > external
