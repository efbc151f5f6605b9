"""Roles whose engine instance spans nodes (nodesPerInstance above 1): admission, the LeaderWorkerSet they render,
the leader-only Service and side channel, and the multi-node example through `duplex render`."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from dsv_helpers import EXAMPLES, SEED, arg_value, children, find, load, spec_dict

from duplex import render_cli
from duplex.children.kinds import CHILD_KINDS, LEADER_WORKER_SET, WATCHED_CHILD_KINDS
from duplex.children.lws import EXCLUSIVE_TOPOLOGY_ANNOTATION, WORKER_INDEX_LABEL
from duplex.render import InvalidSpec, Serving, desired_children, parse, parse_spec

MULTINODE = EXAMPLES / "multinode-decode.yaml"
EFA = {"network": {"efa": {"enabled": True}}, "prefill": {"memory": "1Gi"}}
TWO_NODES = {
    **EFA,
    "decode": {"memory": "1Gi", "nodesPerInstance": 2, "tensorParallelSize": 8, "pipelineParallelSize": 2},
}


def ranks(lws: dict[str, Any], rank: str) -> dict[str, Any]:
    template: dict[str, Any] = lws["spec"]["leaderWorkerTemplate"][f"{rank}Template"]
    return template


def engine(template: dict[str, Any]) -> dict[str, Any]:
    (ctr,) = template["spec"]["containers"]
    return ctr  # type: ignore[no-any-return]


# --- admission --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "patch,words",
    [
        (
            {"decode": {"nodesPerInstance": 2}},
            "spec.decode: decode.tensorParallelSize x pipelineParallelSize must be a multiple of nodesPerInstance: "
            "an instance runs one rank per GPU, the same number on every node (accelerator.count defaults to the "
            "quotient)",
        ),
        (
            {"decode": {"nodesPerInstance": 3, "tensorParallelSize": 8, "pipelineParallelSize": 2}},
            "must be a multiple of nodesPerInstance",
        ),
        (
            {"decode": {"nodesPerInstance": 2, "tensorParallelSize": 8, "accelerator": {"count": 2}}},
            "spec.decode: decode.accelerator.count x nodesPerInstance must equal tensorParallelSize x "
            "pipelineParallelSize: an instance runs one rank per GPU, the same number on every node",
        ),
        (
            {"prefill": {"pipelineParallelSize": 2, "tensorParallelSize": 4, "accelerator": {"count": 4}}},
            "spec.prefill: prefill.accelerator.count x nodesPerInstance must equal",
        ),
        ({"decode": {"nodesPerInstance": 2, "tensorParallelSize": 16}}, "network.efa.enabled"),
        (
            {"decode": {"nodesPerInstance": 2, "tensorParallelSize": 8, "accelerator": {"type": "cpu"}}},
            "nvidia.com/gpu",
        ),
        ({"prefill": {"instanceTopologyKey": "topology.kubernetes.io/zone"}}, "instanceTopologyKey"),
    ],
)
def test_admission_refuses_what_cannot_run(patch: dict[str, Any], words: str) -> None:
    with pytest.raises(InvalidSpec) as info:
        parse_spec(spec_dict(patch))
    assert words in str(info.value)


def test_devices_per_node_default_to_the_ranks_spread_evenly() -> None:
    for tp, pp in ((8, 2), (16, 1)):
        parsed = parse_spec(
            spec_dict(
                {
                    **EFA,
                    "decode": {
                        "memory": "1Gi",
                        "nodesPerInstance": 2,
                        "tensorParallelSize": tp,
                        "pipelineParallelSize": pp,
                    },
                }
            )
        )
        lws = find(desired_children_of(parsed), "LeaderWorkerSet", "demo-decode")
        for rank in ("leader", "worker"):
            assert engine(ranks(lws, rank))["resources"]["limits"]["nvidia.com/gpu"] == "8"


def desired_children_of(parsed: Any) -> list[dict[str, Any]]:
    return desired_children(Serving("demo", "ns1", parsed))


# --- single node: unchanged -------------------------------------------------------------------------------------


def test_single_node_roles_render_deployments_without_multinode_flags() -> None:
    objs = desired_children(parse(load(SEED)))
    assert not [o for o in objs if o["kind"] == "LeaderWorkerSet"]
    for role in ("prefill", "decode"):
        args = find(objs, "Deployment", f"qwen3-32b-{role}")["spec"]["template"]["spec"]["containers"][0]["args"]
        assert not {"--nnodes", "--pipeline-parallel-size", "--headless"} & set(args)
        assert WORKER_INDEX_LABEL not in find(objs, "Service", f"qwen3-32b-{role}")["spec"]["selector"]


# --- the LeaderWorkerSet ----------------------------------------------------------------------------------------


def test_a_multinode_role_renders_a_leader_worker_set_and_no_deployment() -> None:
    objs = children(TWO_NODES)
    assert [o["metadata"]["name"] for o in objs if o["kind"] == "Deployment"] == ["demo-prefill", "demo-router"]
    lws = find(objs, "LeaderWorkerSet", "demo-decode")
    assert lws["apiVersion"] == "leaderworkerset.x-k8s.io/v1"
    body = lws["spec"]
    assert body["replicas"] == 1 and body["leaderWorkerTemplate"]["size"] == 2
    assert body["leaderWorkerTemplate"]["restartPolicy"] == "RecreateGroupOnPodRestart"
    # Workers start with their leader, not after it is Ready: a leader is Ready only once every rank has joined.
    assert body["startupPolicy"] == "LeaderCreated"
    # The ranks find their leader through a Service per group that publishes not-ready pods, which LWS names after
    # the leader pod; with the Shared policy its name would be the set's, taken by the role Service (leaders only,
    # and only once Ready).
    assert body["networkConfig"] == {"subdomainPolicy": "UniquePerReplica"}
    assert body["rolloutStrategy"] == {
        "type": "RollingUpdate",
        "rollingUpdateConfiguration": {"maxSurge": 1, "maxUnavailable": 0},
    }


def test_leader_and_workers_run_vllms_multinode_launch() -> None:
    lws = find(children(TWO_NODES), "LeaderWorkerSet", "demo-decode")
    leader, worker = engine(ranks(lws, "leader"))["args"], engine(ranks(lws, "worker"))["args"]
    for args in (leader, worker):
        assert arg_value(args, "--tensor-parallel-size") == "8"
        assert arg_value(args, "--pipeline-parallel-size") == "2"
        assert arg_value(args, "--nnodes") == "2"
        assert arg_value(args, "--master-addr") == "$(LWS_LEADER_ADDRESS)"
        assert arg_value(args, "--distributed-executor-backend") == "mp"
    assert arg_value(leader, "--node-rank") == "0" and "--headless" not in leader
    assert arg_value(worker, "--node-rank") == "$(LWS_WORKER_INDEX)" and worker[-1] == "--headless"
    # Everything but the launch is the same engine.
    launch = len(leader) - 8
    assert leader[:launch] == worker[:launch] and worker[launch:-1][::2] == leader[launch:][::2]


def test_every_rank_has_the_engine_pods_fabric_shape() -> None:
    objs = children(TWO_NODES)
    lws = find(objs, "LeaderWorkerSet", "demo-decode")
    single = find(
        children({**TWO_NODES, "decode": {**TWO_NODES["decode"], "nodesPerInstance": 1, "accelerator": {"count": 16}}}),
        "Deployment",
        "demo-decode",
    )
    reference = single["spec"]["template"]["spec"]
    for rank in ("leader", "worker"):
        pod = ranks(lws, rank)["spec"]
        ctr = engine(ranks(lws, rank))
        assert ctr["resources"]["limits"]["vpc.amazonaws.com/efa"] == "16"
        assert ctr["resources"]["limits"]["hugepages-2Mi"] == "5120Mi"
        assert ctr["resources"]["limits"]["nvidia.com/gpu"] == "8"
        assert "IPC_LOCK" in ctr["securityContext"]["capabilities"]["add"]

        # the same environment but the KV revision: the pipeline split is part of it
        def but_revision(env: list[dict[str, str]]) -> list[dict[str, str]]:
            return [e for e in env if e["name"] != "DUPLEX_KV_REVISION"]

        assert but_revision(ctr["env"]) == but_revision(reference["containers"][0]["env"])
        assert ctr["volumeMounts"] == reference["containers"][0]["volumeMounts"]
        assert pod["volumes"] == reference["volumes"]
        assert pod["initContainers"] == reference["initContainers"]  # the fabric preflight on every node
        assert pod["tolerations"] == reference["tolerations"] and pod["affinity"] == reference["affinity"]


def test_only_the_leader_serves_http_the_side_channel_probes_and_drains() -> None:
    lws = find(children(TWO_NODES), "LeaderWorkerSet", "demo-decode")
    leader, worker = engine(ranks(lws, "leader")), engine(ranks(lws, "worker"))
    assert {"startupProbe", "readinessProbe", "livenessProbe", "lifecycle"} <= set(leader)
    assert not {"ports", "startupProbe", "readinessProbe", "livenessProbe"} & set(worker)
    # vLLM's scheduler, on the leader, serves the NIXL handshake of every rank on the one side-channel port.
    assert [(p["name"], p["containerPort"]) for p in leader["ports"]] == [("http", 8000), ("nixl-side", 5600)]


def test_a_worker_rank_is_held_while_its_leader_answers_within_the_same_grace_period() -> None:
    lws = find(children(TWO_NODES), "LeaderWorkerSet", "demo-decode")
    leader_pod, worker_pod = ranks(lws, "leader")["spec"], ranks(lws, "worker")["spec"]
    leader_hook = engine(ranks(lws, "leader"))["lifecycle"]["preStop"]["exec"]["command"]
    worker_hook = engine(ranks(lws, "worker"))["lifecycle"]["preStop"]["exec"]["command"]
    assert "--router" in leader_hook and "--router" not in worker_hook
    assert worker_hook[worker_hook.index("--leader-env") + 1] == "LWS_LEADER_ADDRESS"
    leader_deadline = int(leader_hook[leader_hook.index("--deadline") + 1])
    worker_deadline = int(worker_hook[worker_hook.index("--deadline") + 1])
    grace = worker_pod["terminationGracePeriodSeconds"]
    assert grace == leader_pod["terminationGracePeriodSeconds"]
    # The rank outlasts the leader's hook and its vLLM's shutdown, and still exits within its own grace period.
    assert leader_deadline < worker_deadline < grace
    undrained = {**TWO_NODES, "decode": {**TWO_NODES["decode"], "drain": {"deadlineSeconds": 0}}}
    worker = engine(ranks(find(children(undrained), "LeaderWorkerSet", "demo-decode"), "worker"))
    assert "lifecycle" not in worker


def test_the_role_service_selects_leaders_only() -> None:
    objs = children(TWO_NODES)
    assert find(objs, "Service", "demo-decode")["spec"]["selector"][WORKER_INDEX_LABEL] == "0"
    assert WORKER_INDEX_LABEL not in find(objs, "Service", "demo-prefill")["spec"]["selector"]


def test_the_ranks_of_an_instance_may_reach_each_other() -> None:
    objs = children(TWO_NODES)
    decode = find(objs, "NetworkPolicy", "demo-decode")["spec"]["ingress"]
    prefill = find(objs, "NetworkPolicy", "demo-prefill")["spec"]["ingress"]
    own = {"duplex.dev/serving": "demo", "duplex.dev/role": "decode"}
    (ranks_rule,) = [rule for rule in decode if rule["from"] == [{"podSelector": {"matchLabels": own}}]]
    # Every unprivileged port but HTTP: the ranks never call each other's API, only the router does.
    assert ranks_rule["ports"] == [
        {"protocol": "TCP", "port": 1024, "endPort": 7999},
        {"protocol": "TCP", "port": 8001, "endPort": 65535},
    ]
    assert len(prefill) == len(decode) - 1


def test_instance_topology_key_is_lws_exclusive_topology() -> None:
    patch = {
        **TWO_NODES,
        "decode": {**TWO_NODES["decode"], "instanceTopologyKey": "topology.k8s.aws/network-node-layer-3"},
    }
    lws = find(children(patch), "LeaderWorkerSet", "demo-decode")
    assert lws["metadata"]["annotations"] == {EXCLUSIVE_TOPOLOGY_ANNOTATION: "topology.k8s.aws/network-node-layer-3"}
    assert "annotations" not in find(children(TWO_NODES), "LeaderWorkerSet", "demo-decode")["metadata"]


# --- the kind ---------------------------------------------------------------------------------------------------


def test_the_kind_is_optional_watched_and_applied_after_the_deployments() -> None:
    assert LEADER_WORKER_SET.optional and LEADER_WORKER_SET in WATCHED_CHILD_KINDS
    assert [k.kind for k in CHILD_KINDS][-3:] == ["Deployment", "LeaderWorkerSet", "InferencePool"]


# --- the example ------------------------------------------------------------------------------------------------


def test_duplex_render_of_the_multinode_example(capsys: pytest.CaptureFixture[str]) -> None:
    assert render_cli.main(["-f", str(MULTINODE)]) == 0
    objs = [o for o in yaml.safe_load_all(capsys.readouterr().out) if o]
    assert [o["metadata"]["name"] for o in objs if o["kind"] == "LeaderWorkerSet"] == [
        "kimi-k2-prefill",
        "kimi-k2-decode",
    ]
    decode = find(objs, "LeaderWorkerSet", "kimi-k2-decode")
    assert decode["spec"]["replicas"] == 2 and decode["spec"]["leaderWorkerTemplate"]["size"] == 2
    for rank in ("leader", "worker"):
        limits = engine(ranks(decode, rank))["resources"]["limits"]
        assert (limits["nvidia.com/gpu"], limits["vpc.amazonaws.com/efa"]) == ("8", "16")
    assert find(objs, "Service", "kimi-k2-decode")["spec"]["selector"][WORKER_INDEX_LABEL] == "0"
    assert [o["metadata"]["name"] for o in objs if o["kind"] == "Deployment"] == ["kimi-k2-router"]
