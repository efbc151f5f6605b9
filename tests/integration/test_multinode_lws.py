"""A serving whose instances span nodes (examples/multinode-decode.yaml) reconciled by the operator and the real
LeaderWorkerSet controller (conftest.py's `lws`) on the local control plane: each role becomes a LeaderWorkerSet the
API server accepts; every instance is a group of pods, each rank on a p5en node of its own with its GPUs and EFA
devices, launched with vLLM's multi-node arguments that the kubelet expands from the environment LWS's webhook adds;
the role Service lists the leaders only; the serving's status counts ready instances, and a lost worker brings its
whole group back, and the status with it. Without LWS's CRD the operator applies everything else and says what is
missing (an ExtensionMissing Event).

The example is applied with one decode instance instead of two: the fleet (tests/fixtures/fake-nodes.yaml) has four
p5en.48xlarge under two layer-3 switches, and instanceTopologyKey gives each instance a switch of its own, so two
instances fit, one prefill and one decode."""

from __future__ import annotations

import copy
import json
import posixpath
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from operator_harness import ROOT, OperatorProcess

from duplex.api.meta import FIELD_MANAGER
from duplex.replicas import HANDOVER
from duplex_dev.launch.lws import LWSController

pytestmark = pytest.mark.cluster

EXAMPLE = yaml.safe_load((ROOT / "examples/multinode-decode.yaml").read_text())
NAME = EXAMPLE["metadata"]["name"]
LWS_CRD = "leaderworkersets.leaderworkerset.x-k8s.io"
WORKER_INDEX = "leaderworkerset.sigs.k8s.io/worker-index"
P5EN = "p5en.48xlarge"
INSTANCE_TYPE = "node.kubernetes.io/instance-type"
SPINE = EXAMPLE["spec"]["decode"]["instanceTopologyKey"]
GPUS = str(EXAMPLE["spec"]["decode"]["tensorParallelSize"])  # one node's share of an instance: TP within a node
EFA = str(EXAMPLE["spec"]["network"]["efa"]["devicesPerPod"])
NODES = EXAMPLE["spec"]["decode"]["nodesPerInstance"]
# Held by the test on the deleted worker, as a kubelet holds a pod while its containers stop: without it kwok removes
# the pod at once, and the LWS controller may find it gone before it sees it terminating (test_lws_controller.py).
HOLD = "duplex.test/hold"
# What the kubelet reports of a pod whose containers it is stopping; kwok leaves a terminating pod Ready.
STOPPING = [{"type": t, "status": "False", "reason": "Stopping"} for t in ("Ready", "ContainersReady")]
REVISION = "duplex.dev/kv-revision"
GATE = "duplex.dev/kv-paired"


@pytest.fixture(scope="module")
def operator_flags() -> tuple[str, ...]:
    """The example's model cache is a node directory, which the operator's administrator allows (its policy)."""
    return ("--allow-host-path", posixpath.dirname(EXAMPLE["spec"]["model"]["cache"]["hostPath"]["path"]))


@pytest.fixture(scope="module", autouse=True)
def without_lws_at_first(kubectl: Any) -> Iterator[None]:
    """The module starts on a cluster without LWS's CRD (an earlier module's `lws` may still be removing it)."""
    kubectl("delete", "crd", LWS_CRD, "--ignore-not-found", "--wait=true", timeout=120)
    yield


def serving(namespace: str) -> dict[str, Any]:
    doc: dict[str, Any] = copy.deepcopy(EXAMPLE)
    doc["metadata"]["namespace"] = namespace
    doc["spec"]["decode"]["replicas"] = 1  # see the module docstring
    return doc


def get(kubectl: Any, namespace: str, kind: str, name: str) -> dict[str, Any] | None:
    found: list[dict[str, Any]] = kubectl.json(
        "-n", namespace, "get", kind, "--field-selector", f"metadata.name={name}"
    )["items"]
    return found[0] if found else None


def dsv(kubectl: Any, namespace: str) -> dict[str, Any]:
    obj: dict[str, Any] = kubectl.json("-n", namespace, "get", "disaggregatedserving", NAME)
    return obj


def condition(obj: dict[str, Any], ctype: str) -> dict[str, Any]:
    return next((c for c in (obj.get("status") or {}).get("conditions") or [] if c["type"] == ctype), {})


def role_pods(kubectl: Any, namespace: str, role: str) -> dict[str, dict[str, Any]]:
    items = kubectl.json("-n", namespace, "get", "pods", "-l", f"duplex.dev/role={role}")["items"]
    return {p["metadata"]["name"]: p for p in items}


def running_and_ready(pod: dict[str, Any]) -> bool:
    conditions = {c["type"]: c["status"] for c in pod["status"].get("conditions", [])}
    return (
        pod["status"].get("phase") == "Running"
        and conditions.get("Ready") == "True"
        and not pod["metadata"].get("deletionTimestamp")
    )


def group(role: str) -> tuple[str, list[str]]:
    """Group 0's leader and workers: the leader StatefulSet's pod 0, the worker StatefulSet's ordinals from 1."""
    leader = f"{NAME}-{role}-0"
    return leader, [f"{leader}-{i}" for i in range(1, NODES)]


def group_running(kubectl: Any, namespace: str, role: str) -> dict[str, dict[str, Any]] | None:
    """The role's one group, every rank Running and Ready; None until then."""
    leader, workers = group(role)
    pods = role_pods(kubectl, namespace, role)
    if set(pods) != {leader, *workers} or not all(running_and_ready(p) for p in pods.values()):
        return None
    return pods


def instances_ready(kubectl: Any, namespace: str, role: str) -> dict[str, Any] | None:
    """The serving, once its status reports the role's one instance ready for the current generation."""
    obj = dsv(kubectl, namespace)
    st = obj.get("status") or {}
    ready = condition(obj, f"{role.capitalize()}Ready")
    if st.get("observedGeneration") != obj["metadata"]["generation"] or ready.get("status") != "True":
        return None
    return obj if (st.get(role) or {}).get("readyReplicas") == 1 else None


def instances_not_ready(kubectl: Any, namespace: str, role: str) -> bool:
    obj = dsv(kubectl, namespace)
    ready = ((obj.get("status") or {}).get(role) or {}).get("readyReplicas", 0)
    return condition(obj, f"{role.capitalize()}Ready").get("status") == "False" and ready == 0


def endpoint_pods(kubectl: Any, namespace: str, service: str) -> dict[str, str] | None:
    """Pod name -> uid of the ready endpoints in the Service's EndpointSlices (None while there are none): what a
    router reads to find a role's engines."""
    slices = kubectl.json("-n", namespace, "get", "endpointslices", "-l", f"kubernetes.io/service-name={service}")
    out = {
        ep["targetRef"]["name"]: ep["targetRef"]["uid"]
        for s in slices["items"]
        for ep in s.get("endpoints") or []
        if (ep.get("conditions") or {}).get("ready") and (ep.get("targetRef") or {}).get("kind") == "Pod"
    }
    return out or None


def with_managed_fields(kubectl: Any, namespace: str, kind: str, name: str) -> dict[str, Any] | None:
    """The object with its managedFields, which kubectl leaves out unless asked (None while it does not exist)."""
    try:
        obj: dict[str, Any] = kubectl.json("-n", namespace, "get", kind, name, "--show-managed-fields")
    except AssertionError:  # the conftest's KubectlError: NotFound
        return None
    return obj


def replicas_managers(workload: dict[str, Any]) -> set[str]:
    """The field managers that own the workload's spec.replicas (server-side apply's managedFields)."""
    return {
        entry["manager"]
        for entry in workload["metadata"].get("managedFields") or []
        if "f:replicas" in ((entry.get("fieldsV1") or {}).get("f:spec") or {})
    }


def env(pod: dict[str, Any]) -> dict[str, str | None]:
    (ctr,) = [c for c in pod["spec"]["containers"] if c["name"] == "vllm"]
    return {e["name"]: e.get("value") for e in ctr.get("env") or []}


def args(pod: dict[str, Any]) -> list[str]:
    (ctr,) = [c for c in pod["spec"]["containers"] if c["name"] == "vllm"]
    out: list[str] = ctr["args"]
    return out


def flag(argv: list[str], name: str) -> str:
    assert argv.count(name) == 1, f"{name} once in {argv}"
    return argv[argv.index(name) + 1]


def test_without_the_crd_the_rest_goes_out_and_the_sets_are_reported_missing(
    op: OperatorProcess, kubectl: Any, namespace: str, wait_for: Any
) -> None:
    """On a cluster without LWS, a multi-node role is not run some other way (no Deployment stands in for it): the
    operator applies every other child and says what the cluster lacks."""
    op.stop()  # so that it starts without the CRD, whatever ran before
    op.start()
    kubectl.apply(serving(namespace))
    wait_for(lambda: get(kubectl, namespace, "deployment", f"{NAME}-router"), timeout=120, what="the router")

    def missing() -> set[str]:
        events = kubectl.json("-n", namespace, "get", "events", "--field-selector", "reason=ExtensionMissing")
        return {e["message"].split()[0] for e in events["items"] if e["involvedObject"]["name"] == NAME}

    wait_for(
        lambda: missing() >= {f"LeaderWorkerSet/{NAME}-prefill", f"LeaderWorkerSet/{NAME}-decode"},
        timeout=120,
        what="ExtensionMissing Events naming both LeaderWorkerSets",
    )
    deployments = {d["metadata"]["name"] for d in kubectl.json("-n", namespace, "get", "deployments")["items"]}
    assert deployments == {f"{NAME}-router"}
    for role in ("prefill", "decode"):
        assert get(kubectl, namespace, "service", f"{NAME}-{role}") is not None
    wait_for(
        lambda: condition(dsv(kubectl, namespace), "DecodeReady").get("reason") == "NotCreated",
        timeout=60,
        what="DecodeReady NotCreated",
    )
    assert op.alive()


def test_instances_are_groups_of_ranks_behind_their_leaders_and_recreated_whole(
    op: OperatorProcess, lws: LWSController, kubectl: Any, namespace: str, wait_for: Any
) -> None:
    # Started again now that LWS's CRD is there. kopf starts watching a kind whose CRD is created while it runs when
    # it sees the CRD's events, looking the kind up in the API server's discovery; when those events all come before
    # discovery lists the kind (kubernetes#125471; seen here with LWS's large CRD), it never does, and each pass
    # applies a LeaderWorkerSet it does not see.
    op.stop()
    op.start()
    kubectl.apply(serving(namespace))

    # Each role is a LeaderWorkerSet the API server accepted (through LWS's defaulting and validating webhooks).
    for role in ("prefill", "decode"):
        wait_for(
            lambda role=role: get(kubectl, namespace, "leaderworkerset", f"{NAME}-{role}"),
            timeout=120,
            what=f"LeaderWorkerSet {NAME}-{role}",
        )
    deployments = {d["metadata"]["name"] for d in kubectl.json("-n", namespace, "get", "deployments")["items"]}
    assert deployments == {f"{NAME}-router"}, "the engines run as LeaderWorkerSets only"
    parent = dsv(kubectl, namespace)
    decode_set = get(kubectl, namespace, "leaderworkerset", f"{NAME}-decode")
    assert decode_set is not None
    (owner,) = decode_set["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["uid"]) == ("DisaggregatedServing", parent["metadata"]["uid"])
    assert decode_set["spec"]["leaderWorkerTemplate"]["size"] == NODES

    # The groups: each rank on a p5en.48xlarge of its own, asking for that node's GPUs and EFA devices; an instance's
    # ranks under one switch, and no other instance under it (instanceTopologyKey, LWS's exclusive placement).
    groups = {
        role: wait_for(
            lambda role=role: group_running(kubectl, namespace, role),
            timeout=180,
            what=f"the {role} group's {NODES} pods Running and Ready",
        )
        for role in ("prefill", "decode")
    }
    nodes = {n["metadata"]["name"]: n["metadata"]["labels"] for n in kubectl.json("get", "nodes")["items"]}
    placed = {name: pod["spec"]["nodeName"] for pods in groups.values() for name, pod in pods.items()}
    assert len(set(placed.values())) == len(placed) == 2 * NODES, f"one rank per node: {placed}"
    assert {nodes[n][INSTANCE_TYPE] for n in placed.values()} == {P5EN}, placed
    spines = {role: {nodes[p["spec"]["nodeName"]][SPINE] for p in pods.values()} for role, pods in groups.items()}
    assert all(len(s) == 1 for s in spines.values()) and spines["prefill"] != spines["decode"], spines
    for name, pod in (item for pods in groups.values() for item in pods.items()):
        (ctr,) = [c for c in pod["spec"]["containers"] if c["name"] == "vllm"]
        for bound in ("requests", "limits"):
            asked = ctr["resources"][bound]
            assert (asked.get("nvidia.com/gpu"), asked.get("vpc.amazonaws.com/efa")) == (GPUS, EFA), (name, bound)

    # The KV revision (revision.py) on every rank and on the role Services; the readiness gate on the leaders only.
    # kwok marks every gate of a pod True itself, so the operator's opening of it (lockstep.py, counting leaders) is
    # the unit tier's and, on real pods, the e2e tier's.
    revs = {p["metadata"]["labels"].get(REVISION) for pods in groups.values() for p in pods.values()}
    assert len(revs) == 1 and None not in revs and "" not in revs, revs
    for role, pods in groups.items():
        service = get(kubectl, namespace, "service", f"{NAME}-{role}")
        assert service is not None and service["metadata"]["labels"][REVISION] in revs
        for name, pod in pods.items():
            gated = pod["spec"].get("readinessGates") == [{"conditionType": GATE}]
            assert gated is (name == group(role)[0]), (name, pod["spec"].get("readinessGates"))

    # vLLM's multi-node launch, with what LWS's pod webhook put in the environment for the kubelet to expand.
    decode = groups["decode"]
    leader_name, (worker_name,) = group("decode")
    leader, worker = decode[leader_name], decode[worker_name]
    for pod, rank in ((leader, "0"), (worker, "$(LWS_WORKER_INDEX)")):
        argv = args(pod)
        assert flag(argv, "--master-addr") == "$(LWS_LEADER_ADDRESS)"
        assert flag(argv, "--node-rank") == rank
        assert flag(argv, "--nnodes") == str(NODES)
        assert flag(argv, "--distributed-executor-backend") == "mp"
        assert ("--headless" in argv) is (pod is worker)
        assert env(pod).get("LWS_WORKER_INDEX") == pod["metadata"]["labels"][WORKER_INDEX]
        assert env(pod).get("LWS_GROUP_SIZE") == str(NODES)
    address = env(worker).get("LWS_LEADER_ADDRESS") or ""
    host, subdomain, ns = address.split(".")[:3]
    assert (host, ns) == (leader_name, namespace), address
    # The worker finds its leader by that name before the leader is Ready (the leader is Ready only once every rank
    # has joined it): the headless Service of the subdomain must publish not-ready pods, so it cannot be the role
    # Service, whose EndpointSlices the routers read.
    assert subdomain != f"{NAME}-decode", address
    rendezvous = get(kubectl, namespace, "service", subdomain)
    assert rendezvous is not None, f"the Service {subdomain} of {address}"
    assert rendezvous["spec"]["clusterIP"] == "None" and rendezvous["spec"].get("publishNotReadyAddresses"), rendezvous
    selected = kubectl.json(
        "-n", namespace, "get", "pods", "-l", ",".join(f"{k}={v}" for k, v in rendezvous["spec"]["selector"].items())
    )
    assert leader_name in {p["metadata"]["name"] for p in selected["items"]}

    # The role Service's EndpointSlices: the leaders, not the workers. A router pairs instances through them.
    for role in ("prefill", "decode"):
        wanted = {group(role)[0]: groups[role][group(role)[0]]["metadata"]["uid"]}
        wait_for(
            lambda role=role, wanted=wanted: endpoint_pods(kubectl, namespace, f"{NAME}-{role}") == wanted,
            timeout=60,
            what=f"{NAME}-{role}'s EndpointSlices listing {sorted(wanted)} only",
        )

    # The status counts instances: a group is one, ready when all its ranks are.
    obj = wait_for(lambda: instances_ready(kubectl, namespace, "decode"), timeout=120, what="decode 1/1 instances")
    assert obj["status"]["decode"]["summary"] == "1/1"
    assert "1/1 decode instances ready" in condition(obj, "DecodeReady")["message"]
    assert instances_ready(kubectl, namespace, "prefill")

    # A lost worker takes its group with it (RecreateGroupOnPodRestart): while it is going, the instance is not
    # ready, and the status says so; then a new group comes up and the status is back.
    old = {name: pod["metadata"]["uid"] for name, pod in decode.items()}
    hold = json.dumps({"metadata": {"finalizers": [HOLD]}})
    kubectl("-n", namespace, "patch", "pod", worker_name, "--type=merge", "-p", hold)
    try:
        kubectl("-n", namespace, "delete", "pod", worker_name, "--wait=false")
        # As the kubelet stops the worker's containers, its StatefulSet has no worker available: the group is not
        # ready.
        stopping = json.dumps({"status": {"conditions": STOPPING}})
        kubectl(
            "-n", namespace, "patch", "pod", worker_name, "--subresource=status", "--type=strategic", "-p", stopping
        )

        def leader_going() -> bool:
            now = role_pods(kubectl, namespace, "decode").get(leader_name)
            return (
                now is None
                or bool(now["metadata"].get("deletionTimestamp"))
                or now["metadata"]["uid"] != old[leader_name]
            )

        wait_for(leader_going, timeout=60, what=f"the controller deleting leader {leader_name} after {worker_name}")
        wait_for(
            lambda: instances_not_ready(kubectl, namespace, "decode"),
            timeout=60,
            what="the status reporting decode 0/1 while the group is recreated",
        )
    finally:
        kubectl(
            "-n", namespace, "patch", "pod", worker_name, "--type=merge", "-p", '{"metadata": {"finalizers": null}}'
        )

    def recreated() -> dict[str, dict[str, Any]] | None:
        pods = group_running(kubectl, namespace, "decode")
        return pods if pods and not {p["metadata"]["uid"] for p in pods.values()} & set(old.values()) else None

    pods = wait_for(recreated, timeout=180, what="a new decode group, every rank Ready")
    wait_for(lambda: instances_ready(kubectl, namespace, "decode"), timeout=120, what="decode 1/1 instances again")
    new_leader = {leader_name: pods[leader_name]["metadata"]["uid"]}
    wait_for(
        lambda: endpoint_pods(kubectl, namespace, f"{NAME}-decode") == new_leader,
        timeout=60,
        what="the decode Service listing the new leader only",
    )
    # The operator and LWS's defaulting never fought over the spec: it is as first applied.
    after = get(kubectl, namespace, "leaderworkerset", f"{NAME}-decode")
    assert after is not None and after["metadata"]["generation"] == decode_set["metadata"]["generation"] == 1


def test_an_external_role_leaves_its_instances_to_the_sets_scale_subresource(
    op: OperatorProcess, lws: LWSController, kubectl: Any, namespace: str, wait_for: Any
) -> None:
    """scaling.mode External on a multi-node role: the operator hands the LeaderWorkerSet's replicas over and an
    autoscaler (here `kubectl scale`, through the scale subresource an HPA uses) sizes the role in instances; the
    operator counts them in the status and never sets them back."""
    doc = serving(namespace)
    doc["spec"]["decode"]["scaling"] = {"mode": "External"}
    kubectl.apply(doc)
    decode = f"{NAME}-decode"

    def handed_over() -> dict[str, Any] | None:
        found = with_managed_fields(kubectl, namespace, "leaderworkerset", decode)
        return found if found and replicas_managers(found) == {HANDOVER} else None

    created = wait_for(handed_over, timeout=120, what=f"{decode}'s replicas owned by the hand-over manager only")
    assert created["spec"]["replicas"] == 1  # the spec's starting size

    kubectl("-n", namespace, "scale", "leaderworkerset", decode, "--replicas=2")

    def counted() -> dict[str, Any] | None:
        obj = dsv(kubectl, namespace)
        decode_status = (obj.get("status") or {}).get("decode") or {}
        return obj if decode_status.get("replicas") == 2 else None

    wait_for(counted, timeout=120, what="the serving's status asking for 2 decode instances")
    after = with_managed_fields(kubectl, namespace, "leaderworkerset", decode)
    assert after is not None and after["spec"]["replicas"] == 2
    assert FIELD_MANAGER not in replicas_managers(after), after["metadata"]["managedFields"]
