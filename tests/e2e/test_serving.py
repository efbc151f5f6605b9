"""duplex as users deploy it, on pods that really run: the chart's operator pod reconciles examples/local.yaml, whose
router pod finds the engine pods through EndpointSlices and verifies them with its canary, and a conversation through
the router's Service reuses decode's KV, counted by the engine pods themselves. Then the failures users meet: a
decode pod killed mid-conversation (a correct recompute) and one deleted (drained: its conversation moves without a
recompute), the operator and the router restarted; then the day-2 changes: a KV-incompatible change rolled as a new
KV revision in lockstep under load, traces turned on (a compatible roll of both roles, then one turn's trace across
the router and engine pods in a real Jaeger), decode handed to a real HPA, and decode scaled in."""

from __future__ import annotations

import json
import secrets
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import NAMESPACE, NODE_NAME, ROLE_LABEL, SERVING, SERVING_LABEL, Cluster, conversation_id, wait_for

from duplex.children.labels import ADMIN_PORT, HTTP_PORT
from duplex_dev.launch.jaeger import JaegerProcess, StoredSpan, only
from duplex_sidecars.router import tracing as router_tracing
from duplex_sidecars.sim import tracing as sim_tracing

EXTERNAL = ("vllm:prompt_tokens_by_source_total", {"source": "external_kv_transfer"})
TOOL_OUTPUT = " ".join(f"row{i} value{i * 7 % 97}" for i in range(300))


def selector(role: str, serving: str = SERVING) -> str:
    return f"{SERVING_LABEL}={serving},{ROLE_LABEL}={role}"


def post(
    url: str, body: dict[str, Any], timeout: float = 120, headers: dict[str, str] | None = None
) -> tuple[int, Any, dict[str, str]]:
    sent = {"content-type": "application/json", **(headers or {})}
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers=sent)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, json.loads(resp.read()), dict(resp.headers)
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode(errors="replace"), dict(err.headers)


class Chat:
    """One agentic conversation through the router's Service: each turn resends the whole history."""

    def __init__(self, cluster: Cluster, namespace: str = NAMESPACE, serving: str = SERVING):
        self.url = cluster.service_url(f"{serving}-router", namespace) + "/v1/chat/completions"
        model = cluster.json("-n", namespace, "get", "dsv", serving)["spec"]["model"]
        self.model = model.get("servedModelName") or model["name"]
        self.id = conversation_id()
        self.receipt = ""  # the last answer's Server-Timing
        # Long enough that its KV is above the recompute threshold: turn 2 already reuses it.
        self.messages: list[dict[str, Any]] = [{"role": "user", "content": "Summarise this report. " + TOOL_OUTPUT}]

    def turn(self, text: str = TOOL_OUTPUT, headers: dict[str, str] | None = None) -> dict[str, Any]:
        body = {"model": self.model, "messages": self.messages, "max_tokens": 16, "conversation_id": self.id}
        status, answer, headers = post(self.url, body, headers=headers)
        assert status == 200, answer
        self.receipt = headers.get("Server-Timing", "")  # router/receipt.py
        self.messages.append({"role": "assistant", "content": answer["choices"][0]["message"]["content"]})
        self.messages.append({"role": "user", "content": text})
        return dict(answer)


class Counters:
    """What the engine and router pods count, read off their own /metrics."""

    def __init__(self, cluster: Cluster, namespace: str = NAMESPACE, serving: str = SERVING):
        self.cluster, self.namespace, self.serving = cluster, namespace, serving

    def external(self) -> float:
        return sum(self.cluster.metric(p, HTTP_PORT, EXTERNAL[0], **EXTERNAL[1]) for p in self.engines("prefill"))

    def router(self, name: str, **labels: str) -> float:
        return sum(self.cluster.metric(p, ADMIN_PORT, name, **labels) for p in self.engines("router"))

    def corrupt(self) -> float:
        """Blocks an engine pod read and found wrong (the simulator verifies every block it reads)."""
        pods = self.engines("prefill") + self.engines("decode")
        return sum(self.cluster.metric(p, HTTP_PORT, "sim_corrupt_blocks_total") for p in pods)

    def engines(self, role: str) -> list[dict[str, Any]]:
        return self.cluster.running(self.namespace, selector(role, self.serving))


def test_every_child_runs_on_the_real_node_and_the_conditions_have_a_verdict(serving: Cluster) -> None:
    for role in ("prefill", "decode", "router"):
        pods = serving.running(NAMESPACE, selector(role))
        assert len(pods) == 1, f"{role}: {[p['metadata']['name'] for p in serving.pods(NAMESPACE, selector(role))]}"
        assert pods[0]["spec"]["nodeName"] == NODE_NAME
        assert all(s["ready"] and s["restartCount"] == 0 for s in pods[0]["status"]["containerStatuses"])
    (operator,) = serving.running("duplex-system", "app.kubernetes.io/name=duplex")
    assert operator["spec"]["nodeName"] == NODE_NAME
    # The preflight of each engine pod (FabricReady) and the router pod's canary (DisaggregationVerified) report
    # from the pods themselves: on the fake fleet both stay Unknown for ever.
    for kind in ("FabricReady", "DisaggregationVerified"):
        assert serving.condition(kind)["status"] == "True", serving.condition(kind)


def test_the_router_pod_found_the_engine_pods_through_endpointslices(serving: Cluster) -> None:
    (router,) = serving.running(NAMESPACE, selector("router"))
    with urllib.request.urlopen(f"http://{router['status']['podIP']}:{ADMIN_PORT}/ready", timeout=10) as resp:
        ready = json.loads(resp.read())
    for role in ("prefill", "decode"):
        ips = {p["status"]["podIP"] for p in serving.running(NAMESPACE, selector(role))}
        listed = {e["url"].split("//")[1].split(":")[0] for e in ready[role]["endpoints"] if e["healthy"]}
        assert listed == ips, (role, ready[role])


def test_a_conversation_through_the_service_reuses_decode_s_kv(serving: Cluster) -> None:
    chat, counters = Chat(serving), Counters(serving)
    chat.turn()
    before_hits, before_external = counters.router("duplex_router_kv_reuse_hits_total"), counters.external()
    chat.turn()
    chat.turn()
    assert counters.router("duplex_router_kv_reuse_hits_total") - before_hits == 2
    assert 'kv;desc="hit:' in chat.receipt and "prefill;dur=" in chat.receipt, chat.receipt  # the turn says so too
    assert counters.external() - before_external > 600, "prefill pods read no tokens back from the decode pod"
    assert counters.corrupt() == 0
    # The router pod measured those reads off the engines' own NIXL counters: KVTransferHealthy gets its verdict (on
    # a CPU pair, UCX reads at 100 MB/s or more, none failed).
    try:
        serving.wait_condition("KVTransferHealthy", 120)
    except AssertionError as err:
        reports = serving.json("-n", NAMESPACE, "get", "configmap", f"{SERVING}-fabric").get("data")
        (router,) = counters.engines("router")
        with urllib.request.urlopen(f"http://{router['status']['podIP']}:{ADMIN_PORT}/ready", timeout=10) as resp:
            fabric = json.loads(resp.read()).get("fabric")
        raise AssertionError(f"{err}\nthe routers' reports: {reports}\nthe router's fabric now: {fabric}") from None


def router_detail(counters: Counters) -> dict[str, Any]:
    """The router pod's /ready detail (its admin port)."""
    (router,) = counters.engines("router")
    with urllib.request.urlopen(f"http://{router['status']['podIP']}:{ADMIN_PORT}/ready", timeout=10) as resp:
        detail: dict[str, Any] = json.loads(resp.read())
    return detail


def decode_endpoints(counters: Counters) -> dict[str, dict[str, Any]]:
    """The router pod's decode engines by pod IP, as its /ready detail shows them."""
    return {e["url"].split("//")[1].split(":")[0]: e for e in router_detail(counters)["decode"]["endpoints"]}


def gone(serving: Cluster, name: str) -> bool:
    return not any(p["metadata"]["name"] == name for p in serving.pods(NAMESPACE, selector("decode")))


def test_a_decode_pod_killed_then_one_deleted_mid_conversation(serving: Cluster) -> None:
    """Killed (a one-second grace period cuts its drain short, as a crash or a forced delete would): the blocks die
    with it, and the next turn is a correct recompute. Deleted: it drains, so the next turn still reads its blocks,
    and it ends as soon as nothing is bound to it. The kill comes first so that the pod deleted after it holds only
    this conversation (earlier tests' conversations stay bound to the first pod until their TTL)."""
    chat, counters = Chat(serving), Counters(serving)
    chat.turn()
    chat.turn()
    (first,) = counters.engines("decode")
    serving.kubectl(
        "-n", NAMESPACE, "delete", "pod", first["metadata"]["name"], "--grace-period=1", "--wait=true", timeout=180
    )
    wait_for(lambda: counters.engines("decode"), 180, "a new decode pod Ready")
    wait_for(lambda: serving.condition("Ready").get("status") == "True", 120, "the serving Ready again")
    # the router's canary on the new pod reads decode's blocks back too: it must be done before the count is taken
    serving.wait_condition("DisaggregationVerified", 120)
    lost = counters.router("duplex_router_kv_reuse_misses_total", reason="endpoint_gone")
    external = counters.external()
    chat.turn()  # the blocks died with the pod: the router must not replay them
    assert counters.router("duplex_router_kv_reuse_misses_total", reason="endpoint_gone") == lost + 1
    assert counters.external() == external
    chat.turn()  # bound to the new decode pod, and reusing there
    assert counters.external() > external

    (second,) = counters.engines("decode")
    name, ip = second["metadata"]["name"], second["status"]["podIP"]
    assert second["spec"]["terminationGracePeriodSeconds"] == 480 + 30 + 10  # the drain deadline, shutdown, exit
    deleted = time.monotonic()
    serving.kubectl("-n", NAMESPACE, "delete", "pod", name, "--wait=false")
    # It stays, serving, in its preStop hook: the router sees it draining while a new pod takes new turns.
    wait_for(lambda: decode_endpoints(counters).get(ip, {}).get("draining"), 60, "the router seeing the pod draining")
    wait_for(lambda: counters.engines("decode"), 180, "a new decode pod Ready")
    assert not gone(serving, name), "the pod ended while a conversation was bound to it"
    hits, external = counters.router("duplex_router_kv_reuse_hits_total"), counters.external()
    chat.turn()  # reads the history from the draining pod, decodes on the new one
    assert counters.router("duplex_router_kv_reuse_hits_total") == hits + 1
    assert counters.external() > external and counters.corrupt() == 0
    # Nothing is bound to it any more: it ends long before its 480 s deadline.
    wait_for(lambda: gone(serving, name), 120, "the drained pod gone")
    assert time.monotonic() - deleted < 240
    chat.turn()  # bound to the new pod now
    assert counters.router("duplex_router_kv_reuse_hits_total") == hits + 2


def test_operator_and_router_pods_restarted_keep_serving(serving: Cluster) -> None:
    chat, counters = Chat(serving), Counters(serving)
    chat.turn()
    (operator,) = serving.running("duplex-system", "app.kubernetes.io/name=duplex")
    (router,) = counters.engines("router")
    for namespace, pod in (("duplex-system", operator), (NAMESPACE, router)):
        serving.kubectl("-n", namespace, "delete", "pod", pod["metadata"]["name"], "--wait=true", timeout=180)
    wait_for(lambda: serving.running("duplex-system", "app.kubernetes.io/name=duplex"), 180, "a new operator pod")
    wait_for(lambda: counters.engines("router"), 180, "a new router pod Ready")
    wait_for(lambda: serving.condition("Ready").get("status") == "True", 120, "the serving Ready again")
    wait_for(
        lambda: serving.serves_through(f"{SERVING}-router", counters.engines("router")),
        60,
        "the router Service sending to the new router pod only",
    )
    # The memory store went with the router pod: the next turn is a correct recompute, the one after reuses.
    chat.turn()
    started = time.monotonic()
    hits = counters.router("duplex_router_kv_reuse_hits_total")
    chat.turn()
    assert counters.router("duplex_router_kv_reuse_hits_total") == hits + 1, time.monotonic() - started


# Why a conversation's one recompute happened: it moved to the new revision (revision_changed), the old decode pod had
# ended (endpoint_gone), or its last turn on the old revision ran on a draining decode pod (endpoint_draining).
MOVED = ("revision_changed", "endpoint_gone", "endpoint_draining")


def revisions(serving: Cluster) -> dict[str, set[str]]:
    """The KV revisions of the engine pods that exist (Ready or not, leaving or not), by role."""
    out: dict[str, set[str]] = {}
    for role in ("prefill", "decode"):
        pods = serving.pods(NAMESPACE, selector(role))
        out[role] = {p["metadata"]["labels"].get("duplex.dev/kv-revision", "") for p in pods}
    return out


def test_a_kv_incompatible_change_rolls_both_roles_in_lockstep_under_load(serving: Cluster) -> None:
    """A block-size change under a steady multi-turn load: the new revision's prefill and decode come up together
    beside the old ones, the router moves each conversation to the new revision on its next turn (exactly one
    recompute, `miss:revision_changed`), no request fails, no engine reads a block of the other revision (the
    simulator checks every block it reads), and the old revision's pods are gone without waiting out the
    conversations' TTL. Decode is scaled 1 -> 2 in the middle of it: the rollout ends with both pods in the new
    revision."""
    counters = Counters(serving)
    (before,) = set.union(*revisions(serving).values())
    chats = [Chat(serving) for _ in range(3)]
    for chat in chats:
        chat.turn()
        chat.turn()
    misses_before = counters.router("duplex_router_kv_reuse_misses_total")
    moved_before = sum(counters.router("duplex_router_kv_reuse_misses_total", reason=r) for r in MOVED)
    receipts: dict[int, list[str]] = {i: [] for i in range(len(chats))}
    failures: list[str] = []
    stop = threading.Event()

    def load() -> None:
        while not stop.is_set():
            for i, chat in enumerate(chats):
                try:
                    chat.turn()
                    receipts[i].append(chat.receipt)
                except AssertionError as err:  # a status other than 200
                    failures.append(str(err)[:300])
                time.sleep(0.3)  # think time

    worker = threading.Thread(target=load, daemon=True)
    worker.start()
    try:
        wait_for(lambda: all(receipts.values()), 60, "every conversation turning under the load")
        patch = {"spec": {"model": {"blockSize": 64}}}
        serving.kubectl("-n", NAMESPACE, "patch", "dsv", SERVING, "--type=merge", "-p", json.dumps(patch))
        wait_for(lambda: len(revisions(serving)["decode"]) == 2, 120, "the rollout under way (two decode revisions)")
        scale = {"spec": {"decode": {"replicas": 2}}}  # scaling during the rollout is allowed
        serving.kubectl("-n", NAMESPACE, "patch", "dsv", SERVING, "--type=merge", "-p", json.dumps(scale))
        wait_for(lambda: serving.condition("Ready").get("status") == "True", 60, "the serving Ready")
        after = wait_for(
            lambda: (
                (r := revisions(serving))
                and r["prefill"] == r["decode"]
                and len(r["prefill"]) == 1
                and r["prefill"] != {before}
                and r["prefill"]
            ),
            300,
            "only the new revision's engine pods left",
        )
        wait_for(
            lambda: (len(counters.engines("prefill")), len(counters.engines("decode"))) == (1, 2),
            120,
            "one prefill and two decode pods of the new revision Ready",
        )
        seen = {i: len(r) for i, r in receipts.items()}
        wait_for(lambda: all(len(receipts[i]) >= seen[i] + 2 for i in receipts), 120, "two more turns each")
    finally:
        stop.set()
        worker.join(timeout=150)
    assert not failures, failures
    assert counters.corrupt() == 0
    for i, got in receipts.items():  # an anonymous client's receipt says `miss` without the reason
        assert len([r for r in got if 'kv;desc="miss' in r]) == 1, (i, got)  # one recompute, on the new revision
        assert 'kv;desc="hit:' in got[-1], (i, got)
    reasons = {r: counters.router("duplex_router_kv_reuse_misses_total", reason=r) for r in MOVED}
    moved = sum(reasons.values()) - moved_before
    assert moved == counters.router("duplex_router_kv_reuse_misses_total") - misses_before == len(chats), reasons
    for engine in counters.engines("decode"):
        assert engine["metadata"]["labels"]["duplex.dev/kv-revision"] in after


@pytest.fixture(scope="module")
def pod_jaeger(serving: Cluster, jaeger_path: Path) -> Iterator[JaegerProcess]:
    """A real Jaeger on the host's end of the node's link, where the pods reach it."""
    node = serving.local.node
    assert node is not None
    with JaegerProcess(host=node.addrs.host, binary=jaeger_path) as jaeger:
        yield jaeger


def test_traces_turned_on_roll_both_roles_keeping_reuse_and_a_reused_turn_is_one_tree(
    serving: Cluster, pod_jaeger: JaegerProcess
) -> None:
    """Turning spec.tracing on is a KV-compatible change to both roles: they roll in the same KV revision, the new
    pods open their readiness gates at once, and the conversation reads its history from the draining old decode
    pod, then reuses on the new one. A reused turn through the Service is then one tree in a real Jaeger: the router
    pod's request and legs, each engine pod's llm_request under its leg and its kv_read under that."""
    chat, counters = Chat(serving), Counters(serving)
    chat.turn()
    chat.turn()
    old = {role: {p["metadata"]["name"]: p for p in counters.engines(role)} for role in ("prefill", "decode")}
    tracing = {"endpoint": pod_jaeger.otlp_url, "sampleRatio": 1.0}
    serving.kubectl(
        "-n", NAMESPACE, "patch", "dsv", SERVING, "--type=merge", "-p", json.dumps({"spec": {"tracing": tracing}})
    )
    for role in ("prefill", "decode"):

        def rolled(role: str = role) -> list[dict[str, Any]] | None:
            pods = counters.engines(role)
            done = len(pods) == len(old[role]) and not any(p["metadata"]["name"] in old[role] for p in pods)
            return pods if done else None

        new = wait_for(rolled, 180, f"every {role} pod rolled and Ready")
        revisions = {p["metadata"]["labels"]["duplex.dev/kv-revision"] for p in (*new, *old[role].values())}
        assert len(revisions) == 1, revisions
    hits = counters.router("duplex_router_kv_reuse_hits_total")
    chat.turn()
    chat.turn()
    assert counters.router("duplex_router_kv_reuse_hits_total") == hits + 2

    # The router pod reads its settings from a mounted ConfigMap, which the kubelet refreshes within about a minute.
    wait_for(lambda: router_detail(counters)["traces_to"] == pod_jaeger.otlp_url, 120, "the router pod tracing")
    trace_id, client_span = secrets.token_hex(16), secrets.token_hex(8)
    chat.turn(headers={"traceparent": f"00-{trace_id}-{client_span}-01"})
    assert 'kv;desc="hit:' in chat.receipt
    router, prefill, decode = (f"{SERVING}-{role}" for role in ("router", "prefill", "decode"))
    wanted = {
        (router, router_tracing.REQUEST),
        (router, router_tracing.PREFILL),
        (router, router_tracing.DECODE),
        (prefill, sim_tracing.REQUEST_SPAN),
        (prefill, sim_tracing.KV_READ_SPAN),
        (decode, sim_tracing.REQUEST_SPAN),
        (decode, sim_tracing.KV_READ_SPAN),
    }

    def tree() -> list[StoredSpan] | None:
        spans = pod_jaeger.spans(trace_id)
        return spans if wanted <= {(s.service, s.name) for s in spans} else None

    try:
        spans = wait_for(tree, 90, f"trace {trace_id} in Jaeger with the router pod's and both engine pods' spans")
    except AssertionError as err:
        got = sorted({(s.service, s.name) for s in pod_jaeger.spans(trace_id)})
        with urllib.request.urlopen(pod_jaeger.query_url + "/api/services", timeout=10) as resp:
            services = json.loads(resp.read()).get("data")
        raise AssertionError(f"{err}\nspans of the trace: {got}\nservices Jaeger knows: {services}") from None
    request = only(spans, service=router, name=router_tracing.REQUEST)
    assert request.parent_id == client_span and request.attributes[router_tracing.REUSE] == "hit"
    for role, leg_name, direction in (
        (prefill, router_tracing.PREFILL, "decode_to_prefill"),
        (decode, router_tracing.DECODE, "prefill_to_decode"),
    ):
        leg = only(spans, service=router, name=leg_name)
        engine = only(spans, service=role, name=sim_tracing.REQUEST_SPAN)
        read = only(spans, service=role, name=sim_tracing.KV_READ_SPAN)
        assert leg.parent_id == request.span_id and engine.parent_id == leg.span_id and read.parent_id == engine.span_id
        assert read.attributes[sim_tracing.KV_DIRECTION] == direction and not read.error


def test_a_real_hpa_scales_decode_pods_that_really_run_and_reuse_goes_on(serving: Cluster) -> None:
    """decode handed to a HorizontalPodAutoscaler (scaling.mode External): the operator gives up .spec.replicas
    without changing it, the HPA (the kube-controller-manager's, below its minimum it needs no metrics) adds a
    decode pod that really runs, the router finds it, and the conversation keeps reusing decode's KV."""
    chat, counters = Chat(serving), Counters(serving)
    decode = f"{SERVING}-decode"

    def replica_owners() -> set[str]:
        deploy = serving.json("-n", NAMESPACE, "get", "deployment", decode, "--show-managed-fields")
        entries = deploy["metadata"].get("managedFields") or []
        return {e["manager"] for e in entries if "f:replicas" in ((e.get("fieldsV1") or {}).get("f:spec") or {})}

    patch = {"spec": {"decode": {"scaling": {"mode": "External"}}}}
    serving.kubectl("-n", NAMESPACE, "patch", "dsv", SERVING, "--type=merge", "-p", json.dumps(patch))
    wait_for(lambda: "duplex-operator" not in replica_owners(), 60, "the operator handing decode's replicas over")
    hpa = {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": decode, "namespace": NAMESPACE},
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": decode},
            "minReplicas": 2,
            "maxReplicas": 2,
            "metrics": [
                {
                    "type": "Resource",
                    "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": 90}},
                }
            ],
        },
    }
    serving.kubectl("apply", "-f", "-", input=json.dumps(hpa))
    try:
        wait_for(lambda: len(counters.engines("decode")) == 2, 240, "two decode pods running and ready")
        ips = {p["status"]["podIP"] for p in counters.engines("decode")}
        wait_for(lambda: ips <= set(decode_endpoints(counters)), 60, "the router knowing both decode pods")
        chat.turn()
        hits = counters.router("duplex_router_kv_reuse_hits_total")
        chat.turn()
        chat.turn()
        assert counters.router("duplex_router_kv_reuse_hits_total") == hits + 2
        assert 'kv;desc="hit:' in chat.receipt
        assert serving.json("-n", NAMESPACE, "get", "dsv", SERVING)["status"]["decode"]["replicas"] == 2
    finally:
        serving.kubectl("-n", NAMESPACE, "delete", "hpa", decode, "--ignore-not-found")


def test_decode_scaled_in_from_two_to_one_keeps_every_conversation_reusing(serving: Cluster) -> None:
    """After the HPA test (decode at 2, External): back to Fixed at 1. The operator marks each decode pod with its
    bindings as its deletion cost before it lowers replicas, the ReplicaSet removes one, which drains; the
    conversations keep reusing and no request fails."""
    counters = Counters(serving)
    wait_for(lambda: len(counters.engines("decode")) == 2, 120, "two decode pods")
    chats = [Chat(serving) for _ in range(2)]
    for chat in chats:
        chat.turn()
        chat.turn()
    before = {p["metadata"]["name"] for p in counters.engines("decode")}
    patch = {"spec": {"decode": {"replicas": 1, "scaling": {"mode": "Fixed"}}}}
    serving.kubectl("-n", NAMESPACE, "patch", "dsv", SERVING, "--type=merge", "-p", json.dumps(patch))
    (kept,) = wait_for(lambda: len(e := counters.engines("decode")) == 1 and e, 120, "one decode pod taking turns")
    assert kept["metadata"]["name"] in before
    assert "controller.kubernetes.io/pod-deletion-cost" in (kept["metadata"].get("annotations") or {})
    hits = counters.router("duplex_router_kv_reuse_hits_total")
    for chat in chats:  # a conversation bound to the draining pod reads its history there and moves
        chat.turn()
        chat.turn()
    assert counters.router("duplex_router_kv_reuse_hits_total") == hits + 2 * len(chats)
    # it ends once no active binding is left (an earlier test's conversation may hold it up to activeSeconds)
    wait_for(lambda: len(serving.pods(NAMESPACE, selector("decode"))) == 1, 200, "the removed pod gone")


def test_the_planner_adds_a_decode_pod_under_load_and_removes_it_after(serving: Cluster) -> None:
    """decode in scaling.mode Automatic (1 to 2 pods, maxNumSeqs 2, target saturation 0.5, no scale-down wait) and
    slowed to 20 ms a token: four conversations back to back fill decode, the router pod's load report shows it, and the planner adds a decode pod
    (status.autoscaling says why) that the router then uses; once the load is gone from the report's minute the
    planner removes one, which drains, and no request failed."""
    counters = Counters(serving)
    wait_for(lambda: len(counters.engines("decode")) == 1, 120, "one decode pod")
    patch = {
        "spec": {
            "decode": {
                "maxNumSeqs": 2,
                "scaling": {"mode": "Automatic", "minReplicas": 1, "maxReplicas": 2},
                # 20 ms a token: a turn spends most of its time in decode, which the load then fills
                "env": [{"name": "DUPLEX_SIM_ARGS", "value": "--fail-on-corrupt --decode-us-per-token 20000"}],
            },
            "autoscaling": {"targetSaturation": 0.5, "scaleDownSeconds": 0},
        }
    }
    serving.kubectl("-n", NAMESPACE, "patch", "dsv", SERVING, "--type=merge", "-p", json.dumps(patch))
    failures: list[str] = []
    stop = threading.Event()

    def converse() -> None:
        """Back to back, no think time; a new conversation every 6 turns keeps prompts short."""
        while not stop.is_set():
            chat = Chat(serving)
            for _ in range(6):
                try:
                    chat.turn()
                except AssertionError as err:  # a status other than 200
                    failures.append(str(err)[:300])
                    break

    workers = [threading.Thread(target=converse, daemon=True) for _ in range(4)]
    for worker in workers:
        worker.start()
    try:
        seen: dict[str, Any] = {}

        def sized() -> dict[str, Any] | None:
            seen["plan"] = serving.json("-n", NAMESPACE, "get", "dsv", SERVING)["status"].get("autoscaling") or {}
            return seen["plan"] if (seen["plan"].get("decode") or {}).get("replicas") == 2 else None

        try:
            plan = wait_for(sized, 180, "the planner sizing decode at 2 pods")
        except AssertionError as err:
            reports = serving.json("-n", NAMESPACE, "get", "configmap", f"{SERVING}-fabric").get("data")
            raise AssertionError(f"{err}\nstatus.autoscaling: {seen}\nthe routers' reports: {reports}") from None
        assert plan["decode"]["reason"] in ("ScaleUp", "Hold") and plan["decode"]["demand"] > 0.5, plan
        added = wait_for(lambda: len(e := counters.engines("decode")) == 2 and e, 120, "two decode pods Ready")
        ips = {p["status"]["podIP"] for p in added}
        wait_for(lambda: ips <= set(decode_endpoints(counters)), 60, "the router using both decode pods")
    finally:
        stop.set()
        for worker in workers:
            worker.join(timeout=150)
    assert not failures, failures
    decode = f"{SERVING}-decode"
    wait_for(
        lambda: serving.json("-n", NAMESPACE, "get", "deployment", decode)["spec"]["replicas"] == 1,
        240,
        "the planner scaling decode down once the load left the routers' minute",
    )
    said = [
        e["message"] for e in serving.json("-n", NAMESPACE, "get", "events")["items"] if e["reason"] == "Autoscaled"
    ]
    assert any("decode 1 -> 2 (ScaleUp" in m for m in said) and any("decode 2 -> 1 (ScaleDown" in m for m in said), said
    wait_for(lambda: len(serving.pods(NAMESPACE, selector("decode"))) == 1, 200, "the removed decode pod gone")
    assert counters.corrupt() == 0
