"""A node drained mid-conversation (issue 25's last lifecycle event): `kubectl drain` of the real node that holds the
prefill and decode pods evicts both through the Eviction API. The decode pod's preStop drain holds it while the
conversation's next turn reads the history from it and reuses; the prefill pod's holds it, taking turns as the routers'
last resort, until its replacement serves; the replacements run on the other real node, and no request of a steady
second conversation fails; its turns while the leaving pod is the only decode pod decode and bind there, so every
one of them reuses (docs/architecture.md, Draining).

The router pod runs on the other node, moved there first: a router drained with its decode takes its memory store
along (a router restart, which test_serving covers; run two routers with the Redis store to drain a router's node).

This module runs before test_serving.py on the same serving and leaves it as it found it: the pods back on their
node, both nodes as they were (the session's second node is cordoned but here)."""

from __future__ import annotations

import json
import subprocess
import threading
import time
import urllib.error
import urllib.request
from typing import Any

from conftest import NAMESPACE, SERVING, Cluster, wait_for
from test_serving import Chat, Counters, selector

from duplex.children.labels import ADMIN_PORT

ROLES = ("prefill", "decode", "router")
OPERATOR = ("duplex-system", "app.kubernetes.io/name=duplex")
HITS = "duplex_router_kv_reuse_hits_total"


def placement(serving: Cluster) -> dict[str, str]:
    """The node of each running pod of the serving, and of the operator."""
    where = {role: [p["spec"]["nodeName"] for p in serving.running(NAMESPACE, selector(role))] for role in ROLES}
    where["operator"] = [p["spec"]["nodeName"] for p in serving.running(*OPERATOR)]
    assert all(len(nodes) == 1 for nodes in where.values()), where
    return {role: nodes[0] for role, nodes in where.items()}


def cordoned(serving: Cluster, node: str) -> bool:
    return bool(serving.json("get", "node", node)["spec"].get("unschedulable"))


def router_ready(counters: Counters) -> dict[str, Any]:
    """The router pod's /ready detail, also while it answers 503 (without a prefill engine it is not ready)."""
    (router,) = [
        p
        for p in counters.cluster.pods(NAMESPACE, selector("router"))
        if p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")
    ]
    try:
        with urllib.request.urlopen(f"http://{router['status']['podIP']}:{ADMIN_PORT}/ready", timeout=10) as resp:
            return dict(json.loads(resp.read()))
    except urllib.error.HTTPError as err:
        return dict(json.loads(err.read()))


def decode_endpoints(counters: Counters) -> dict[str, dict[str, Any]]:
    """The router pod's decode engines by pod IP."""
    return {e["url"].split("//")[1].split(":")[0]: e for e in router_ready(counters)["decode"]["endpoints"]}


def router_knows(counters: Counters, roles: tuple[str, ...] = ("prefill", "decode")) -> bool:
    """The router pod lists exactly the engine pods that run and are Ready, healthy and not draining."""
    ready = router_ready(counters)
    for role in roles:
        ips = {p["status"]["podIP"] for p in counters.engines(role)}
        endpoints = ready[role]["endpoints"]
        listed = {e["url"].split("//")[1].split(":")[0] for e in endpoints if e["healthy"] and not e.get("draining")}
        if not ips or listed != ips or len(endpoints) != len(ips):
            return False
    return True


def settled(serving: Cluster, counters: Counters) -> bool:
    """One Ready pod of each role, the serving Ready with its canary verified, the router's Service sending to the
    router pod only and the router taking turns with the engine pods that run."""
    if any(len(counters.engines(role)) != 1 for role in ROLES):
        return False
    if sum(len(serving.pods(NAMESPACE, selector(role))) for role in ROLES) != 3:  # nothing still leaving
        return False
    if any(serving.condition(kind).get("status") != "True" for kind in ("Ready", "DisaggregationVerified")):
        return False
    return serving.serves_through(f"{SERVING}-router", counters.engines("router")) and router_knows(counters)


def drain(serving: Cluster, node: str) -> subprocess.Popen[str]:
    """`kubectl drain` as an operator runs it: cordon, then evict every pod through the Eviction API (PDBs apply),
    and wait until they are gone."""
    argv = [str(serving.local.kubectl), f"--kubeconfig={serving.local.kubeconfig}", "drain", node]
    argv += ["--ignore-daemonsets", "--delete-emptydir-data", "--timeout=400s"]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def move(serving: Cluster, counters: Counters, roles: list[str], away_from: str) -> None:
    """Put the pods of `roles` on another node than `away_from`, as the scheduler does once their node is cordoned."""
    serving.kubectl("cordon", away_from)
    try:
        for role in roles:
            (pod,) = counters.engines(role)
            serving.kubectl("-n", NAMESPACE, "delete", "pod", pod["metadata"]["name"], "--wait=true", timeout=180)
            wait_for(lambda role=role: counters.engines(role), 180, f"a new {role} pod Ready")
    finally:
        serving.kubectl("uncordon", away_from)
    wait_for(lambda: settled(serving, counters), 180, f"the serving settled with {', '.join(roles)} moved")


def test_draining_the_engines_node_moves_its_conversation_without_a_recompute_or_a_failed_request(
    serving: Cluster,
) -> None:
    counters = Counters(serving)
    nodes = [node.name for node in serving.local.nodes]
    assert len(nodes) == 2, nodes
    found = placement(serving)
    was_cordoned = {node: cordoned(serving, node) for node in nodes}
    drained = found["decode"]
    (other,) = (node for node in nodes if node != drained)
    try:
        serving.kubectl("uncordon", other)
        if placement(serving)["router"] == drained:
            move(serving, counters, ["router"], drained)
        assert placement(serving)["prefill"] == drained  # it leaves with decode: its hook keeps it serving
        chat, load = Chat(serving), Chat(serving)
        for _ in range(2):
            load.turn()
            chat.turn()
        (old,) = counters.engines("decode")
        old_name, old_ip = old["metadata"]["name"], old["status"]["podIP"]
        (old_prefill,) = counters.engines("prefill")

        # A steady second conversation through the drain: every request must get its answer.
        failures: list[str] = []
        receipts: list[tuple[float, str]] = []
        stop = threading.Event()

        def converse() -> None:
            while not stop.is_set():
                try:
                    load.turn()
                    receipts.append((time.monotonic() - started, load.receipt))
                except (AssertionError, OSError) as err:  # a status other than 200, a reset, a timeout
                    failures.append(f"+{time.monotonic() - started:.1f}s {str(err)[:300]}")
                time.sleep(1.0)  # think time

        started = time.monotonic()
        chat.turn()  # the binding the drain must keep: stored just before it
        drainer = drain(serving, drained)
        worker = threading.Thread(target=converse, daemon=True)
        worker.start()
        try:
            # The decode pod, evicted, holds in its preStop drain: the router sees it draining while the replacement
            # comes up on the other node.
            wait_for(
                lambda: decode_endpoints(counters).get(old_ip, {}).get("draining"),
                60,
                "the router seeing the decode pod draining",
            )
            seen = time.monotonic() - started
            (new,) = wait_for(
                lambda: [p for p in counters.engines("decode") if p["metadata"]["name"] != old_name],
                180,
                "the replacement decode pod Ready",
            )
            wait_for(
                lambda: decode_endpoints(counters).get(new["status"]["podIP"], {}).get("healthy"),
                60,
                "the router using the new decode pod",
            )
            in_use = time.monotonic() - started
        finally:
            stop.set()
            worker.join(timeout=150)
        assert not failures, failures
        assert receipts and all('kv;desc="hit:' in r for _, r in receipts), receipts  # not one recompute
        assert any(p["metadata"]["name"] == old_name for p in serving.pods(NAMESPACE, selector("decode"))), (
            "the evicted decode pod ended while a conversation was bound to it"
        )
        load.turn()  # the second conversation moves too, so that only `chat` is left bound to the leaving pod
        hits, external = counters.router(HITS), counters.external()
        chat.turn()  # reads its history from the leaving pod, decodes on the new one
        assert counters.router(HITS) == hits + 1
        assert 'kv;desc="hit:' in chat.receipt, chat.receipt
        assert counters.external() > external and counters.corrupt() == 0

        out, _ = drainer.communicate(timeout=300)
        gone = time.monotonic() - started
        assert drainer.returncode == 0, out
        assert f"pod/{old_name} evicted" in out, out  # through the Eviction API, not a delete
        assert not any(p["metadata"]["name"] == old_name for p in serving.pods(NAMESPACE, selector("decode")))
        assert f"pod/{old_prefill['metadata']['name']} evicted" in out, out
        for role in ("prefill", "decode"):
            (replacement,) = counters.engines(role)
            assert replacement["spec"]["nodeName"] == other, role
        hits = counters.router(HITS)
        chat.turn()  # bound to the replacement now
        assert counters.router(HITS) == hits + 1 and 'kv;desc="hit:' in chat.receipt
        print(
            f"\ndrain of {drained}: the router saw the decode pod draining after {seen:.1f}s, used its replacement "
            f"after {in_use:.1f}s; the pod was gone and kubectl drain done after {gone:.1f}s; the second "
            f"conversation's receipts: {[(round(t, 1), r.rpartition(' ')[2]) for t, r in receipts]}"
        )
    finally:
        restore(serving, counters, found, was_cordoned, drained, other)


def restore(
    serving: Cluster,
    counters: Counters,
    found: dict[str, str],
    was_cordoned: dict[str, bool],
    drained: str,
    other: str,
) -> None:
    """The serving as found: its pods back on the node they were on, each node cordoned or not as it was."""
    serving.kubectl("uncordon", drained)
    if other not in found.values():
        proc = drain(serving, other)
        out, _ = proc.communicate(timeout=450)
        assert proc.returncode == 0, out
    for node, was in was_cordoned.items():
        serving.kubectl("cordon" if was else "uncordon", node)
    wait_for(lambda: settled(serving, counters), 300, "the serving settled as found")
    assert placement(serving) == found
