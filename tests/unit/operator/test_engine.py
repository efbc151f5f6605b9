"""The prefill and decode engine Deployments: vllm serve arguments, environment, volumes, probes, labels, rollout,
and the config-hash annotation that changes exactly when an engine-facing field changes."""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml
from dsv_helpers import arg_value, container, env_map, merge, spec

from duplex.api.spec import DisaggregatedServingSpec
from duplex.children import labels as labels_module
from duplex.children.engine import engine_config_hash, engine_workload, served_model_name, vllm_args
from duplex.children.kv_config import kv_transfer_json
from duplex.children.labels import ENGINE_HASH_ANNOTATION, ROLE_LABEL, SERVING_LABEL, config_hash
from duplex.children.roles import EngineRole

ROLES = ("prefill", "decode")


def deployment(
    patch: dict[str, Any] | None = None, role: str = "prefill", name: str = "demo", namespace: str = "ns1"
) -> dict[str, Any]:
    return engine_workload(spec(patch), name, namespace, role)


def pod_spec(patch: dict[str, Any] | None = None, role: str = "prefill") -> dict[str, Any]:
    return deployment(patch, role)["spec"]["template"]["spec"]


def args_of(s: DisaggregatedServingSpec, role: str) -> list[str]:
    """`vllm serve`'s arguments for the named role."""
    return vllm_args(s, EngineRole.of(s, role))


def engine_hash(patch: dict[str, Any] | None = None, role: str = "prefill") -> str:
    return deployment(patch, role)["spec"]["template"]["metadata"]["annotations"][ENGINE_HASH_ANNOTATION]


# --- vllm serve arguments ---------------------------------------------------------------------------------------


def test_minimal_args_in_order() -> None:
    s = spec()
    assert args_of(s, "prefill") == [
        "org/model",
        "--served-model-name", "org/model",
        "--port", "8000",
        "--tensor-parallel-size", "1",
        "--dtype", "auto",
        "--block-size", "16",
        "--gpu-memory-utilization", "0.9",
        "--enable-prefix-caching",
        "--kv-transfer-config", kv_transfer_json(s, "prefill"),
        "--middleware", "duplex_engine_guard.EngineKeyGuard",
        "--shutdown-timeout", "40",  # the 30 s block lease and a margin: decode's pull of the last prefills
    ]  # fmt: skip
    ctr = container(deployment())
    assert ctr["command"] == ["vllm", "serve"] and ctr["args"] == args_of(s, "prefill")


def test_typed_fields_become_their_flags() -> None:
    s = spec(
        {
            "model": {"servedModelName": "qwen", "dtype": "bfloat16", "maxModelLen": 32768, "blockSize": 32},
            "prefill": {
                "tensorParallelSize": 4,
                "gpuMemoryUtilization": 0.85,
                "enablePrefixCaching": False,
                "maxNumSeqs": 8,
                "maxNumBatchedTokens": 8192,
            },
            "decode": {"tensorParallelSize": 8, "maxNumSeqs": 256},
        }
    )
    p, d = args_of(s, "prefill"), args_of(s, "decode")
    assert p[0] == d[0] == "org/model"
    assert arg_value(p, "--served-model-name") == "qwen"
    assert arg_value(p, "--dtype") == "bfloat16" and arg_value(p, "--block-size") == "32"
    assert arg_value(p, "--max-model-len") == arg_value(d, "--max-model-len") == "32768"
    assert arg_value(p, "--tensor-parallel-size") == "4" and arg_value(d, "--tensor-parallel-size") == "8"
    assert arg_value(p, "--gpu-memory-utilization") == "0.85" and arg_value(d, "--gpu-memory-utilization") == "0.9"
    assert "--no-enable-prefix-caching" in p and "--enable-prefix-caching" not in p
    assert "--enable-prefix-caching" in d and "--no-enable-prefix-caching" not in d
    assert arg_value(p, "--max-num-seqs") == "8" and arg_value(d, "--max-num-seqs") == "256"
    assert arg_value(p, "--max-num-batched-tokens") == "8192" and "--max-num-batched-tokens" not in d


def test_unset_optional_flags_are_left_to_vllm() -> None:
    args = args_of(spec(), "decode")
    for flag in ("--max-model-len", "--max-num-seqs", "--max-num-batched-tokens"):
        assert flag not in args


@pytest.mark.parametrize("value,text", [(0.9, "0.9"), (1, "1"), (0.95, "0.95"), (0.123456, "0.123456")])
def test_gpu_memory_utilization_rendering(value: float, text: str) -> None:
    assert (
        arg_value(args_of(spec({"prefill": {"gpuMemoryUtilization": value}}), "prefill"), "--gpu-memory-utilization")
        == text
    )


def test_kv_transfer_config_is_one_json_argument_per_role() -> None:
    neuron = {"accelerator": {"type": "aws.amazon.com/neuron"}}
    s = spec({"prefill": neuron, "decode": neuron})
    for role in ROLES:
        config = json.loads(arg_value(args_of(s, role), "--kv-transfer-config"))
        assert config["kv_connector"] == "NixlConnector"
        assert config["kv_role"] == {"prefill": "kv_producer", "decode": "kv_consumer"}[role]
    assert json.loads(arg_value(args_of(s, "prefill"), "--kv-transfer-config"))["kv_buffer_device"] == "cpu"
    assert json.loads(arg_value(args_of(s, "decode"), "--kv-transfer-config"))["kv_buffer_device"] == "cpu"


def test_extra_args_follow_the_typed_flags_model_first() -> None:
    s = spec(
        {
            "model": {"extraArgs": ["--enforce-eager", "--seed=1"]},
            "prefill": {"extraArgs": ["--max-num-partial-prefills", "2"]},
            "decode": {"extraArgs": ["--swap-space=8"]},
        }
    )
    p, d = args_of(s, "prefill"), args_of(s, "decode")
    assert p[-4:] == ["--enforce-eager", "--seed=1", "--max-num-partial-prefills", "2"]
    assert d[-3:] == ["--enforce-eager", "--seed=1", "--swap-space=8"]
    assert "--swap-space=8" not in p and "--max-num-partial-prefills" not in d


def test_served_model_name_defaults_to_the_model() -> None:
    assert served_model_name(spec()) == "org/model"
    assert served_model_name(spec({"model": {"servedModelName": "m"}})) == "m"


# --- container --------------------------------------------------------------------------------------------------


def test_image_and_pull_policy() -> None:
    ctr = container(deployment({"model": {"image": "my/vllm:1", "imagePullPolicy": "Always"}}))
    assert (ctr["name"], ctr["image"], ctr["imagePullPolicy"]) == ("vllm", "my/vllm:1", "Always")
    assert container(deployment())["imagePullPolicy"] == "IfNotPresent"


def test_side_channel_env_advertises_the_pod_ip() -> None:
    env = env_map(container(deployment({"kvTransfer": {"sideChannelPort": 5700}})))
    assert env["VLLM_NIXL_SIDE_CHANNEL_HOST"] == {
        "name": "VLLM_NIXL_SIDE_CHANNEL_HOST",
        "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}},
    }
    assert env["VLLM_NIXL_SIDE_CHANNEL_PORT"] == {"name": "VLLM_NIXL_SIDE_CHANNEL_PORT", "value": "5700"}


def test_ports_http_and_side_channel() -> None:
    for role in ROLES:
        ctr = container(deployment({"kvTransfer": {"sideChannelPort": 5601}}, role))
        assert ctr["ports"] == [
            {"name": "http", "containerPort": 8000, "protocol": "TCP"},
            {"name": "nixl-side", "containerPort": 5601, "protocol": "TCP"},
        ]


def test_hf_token_from_secret() -> None:
    env = env_map(container(deployment({"model": {"hfTokenSecret": {"name": "hf", "key": "token"}}})))
    assert env["HF_TOKEN"] == {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}}
    assert "HF_TOKEN" not in env_map(container(deployment()))


def test_no_cache_means_no_hf_home_and_only_shm_and_the_guard() -> None:
    ps = pod_spec()
    assert "HF_HOME" not in env_map(ps["containers"][0])
    assert ps["volumes"] == [
        {"name": "dshm", "emptyDir": {"medium": "Memory"}},
        {"name": "engine-guard", "configMap": {"name": "demo-guard"}},
    ]
    assert ps["containers"][0]["volumeMounts"] == [
        {"name": "dshm", "mountPath": "/dev/shm"},
        {"name": "engine-guard", "mountPath": "/opt/duplex/engine-guard", "readOnly": True},
    ]
    assert env_map(ps["containers"][0])["PYTHONPATH"]["value"] == "/opt/duplex/engine-guard"


@pytest.mark.parametrize("read_only", [True, False])
def test_model_cache_on_a_pvc(read_only: bool) -> None:
    ps = pod_spec({"model": {"cache": {"pvc": {"claimName": "weights", "readOnly": read_only}}}})
    assert {"name": "model-cache", "persistentVolumeClaim": {"claimName": "weights", "readOnly": read_only}} in ps[
        "volumes"
    ]
    assert {"name": "model-cache", "mountPath": "/models"} in ps["containers"][0]["volumeMounts"]
    assert env_map(ps["containers"][0])["HF_HOME"] == {"name": "HF_HOME", "value": "/models"}


def test_model_cache_on_a_host_path_with_custom_mount() -> None:
    ps = pod_spec({"model": {"cache": {"hostPath": {"path": "/mnt/raid0"}, "mountPath": "/cache"}}})
    assert {"name": "model-cache", "hostPath": {"path": "/mnt/raid0", "type": "Directory"}} in ps["volumes"]
    assert {"name": "model-cache", "mountPath": "/cache"} in ps["containers"][0]["volumeMounts"]
    assert env_map(ps["containers"][0])["HF_HOME"]["value"] == "/cache"
    mounts = {m["name"] for m in ps["containers"][0]["volumeMounts"]}
    assert mounts == {v["name"] for v in ps["volumes"]} == {"dshm", "engine-guard", "model-cache"}


def test_user_env_appends_and_overrides_by_name() -> None:
    ctr = container(
        deployment(
            {
                "model": {
                    "env": [{"name": "A", "value": "model"}, {"name": "VLLM_NIXL_SIDE_CHANNEL_PORT", "value": "9"}]
                },
                "prefill": {"env": [{"name": "B", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}]},
            }
        )
    )
    names = [e["name"] for e in ctr["env"]]
    assert names == [
        "VLLM_API_KEY",
        "VLLM_NIXL_SIDE_CHANNEL_HOST",
        "PYTHONPATH",
        "A",
        "VLLM_NIXL_SIDE_CHANNEL_PORT",
        "B",
    ]
    env = env_map(ctr)
    assert env["VLLM_NIXL_SIDE_CHANNEL_PORT"] == {"name": "VLLM_NIXL_SIDE_CHANNEL_PORT", "value": "9"}
    assert env["B"] == {"name": "B", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}
    assert env["A"] == {"name": "A", "value": "model"}  # unset value/valueFrom are omitted, not null
    # role env stays in its role
    assert "B" not in env_map(container(deployment({"prefill": {"env": [{"name": "B", "value": "x"}]}}, "decode")))


def test_probes() -> None:
    ctr = container(deployment())
    health = {"path": "/health", "port": "http"}
    assert (
        ctr["startupProbe"]["httpGet"] == ctr["readinessProbe"]["httpGet"] == ctr["livenessProbe"]["httpGet"] == health
    )
    startup = ctr["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 30 * 60  # large models load for minutes
    assert ctr["readinessProbe"]["periodSeconds"] <= 10
    assert ctr["livenessProbe"]["failureThreshold"] >= 3


# --- pod and Deployment -----------------------------------------------------------------------------------------


def test_pod_spec_defaults() -> None:
    ps = pod_spec()
    assert ps["automountServiceAccountToken"] is False
    assert ps["enableServiceLinks"] is False
    assert ps["terminationGracePeriodSeconds"] >= 30
    for absent in ("nodeSelector", "affinity", "topologySpreadConstraints", "priorityClassName", "serviceAccountName"):
        assert absent not in ps


def test_placement_fields_pass_through() -> None:
    tsc = [{"maxSkew": 1, "topologyKey": "kubernetes.io/hostname", "whenUnsatisfiable": "ScheduleAnyway"}]
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": []}}}
    ps = pod_spec(
        {
            "decode": {
                "nodeSelector": {"pool": "gpu"},
                "topologySpreadConstraints": tsc,
                "priorityClassName": "critical",
                "affinity": affinity,
            }
        },
        "decode",
    )
    assert ps["nodeSelector"] == {"pool": "gpu"}
    assert ps["topologySpreadConstraints"] == tsc
    assert ps["priorityClassName"] == "critical"
    assert ps["affinity"] == affinity
    assert "nodeSelector" not in pod_spec({"decode": {"nodeSelector": {"pool": "gpu"}}}, "prefill")


def test_deployment_metadata_replicas_strategy() -> None:
    d = deployment(
        {"prefill": {"replicas": 3, "rollout": {"maxSurge": 0, "maxUnavailable": 2, "progressDeadlineSeconds": 1200}}},
        "prefill",
        name="qwen",
        namespace="inference",
    )
    assert d["apiVersion"] == "apps/v1" and d["kind"] == "Deployment"
    assert d["metadata"]["name"] == "qwen-prefill" and d["metadata"]["namespace"] == "inference"
    assert d["spec"]["replicas"] == 3
    assert d["spec"]["strategy"] == {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 2}}
    assert d["spec"]["progressDeadlineSeconds"] == 1200
    assert deployment(role="decode", name="qwen")["metadata"]["name"] == "qwen-decode"
    assert deployment(role="decode", name="qwen")["spec"]["progressDeadlineSeconds"] == 600


@pytest.mark.parametrize("role", ROLES)
def test_labels_and_selector(role: str) -> None:
    d = deployment(role=role, name="qwen")
    selector = d["spec"]["selector"]["matchLabels"]
    assert selector == {SERVING_LABEL: "qwen", ROLE_LABEL: role}
    pod_labels = d["spec"]["template"]["metadata"]["labels"]
    assert selector.items() <= pod_labels.items()
    meta = d["metadata"]["labels"]
    assert meta["app.kubernetes.io/name"] == "vllm" and meta["app.kubernetes.io/component"] == role
    assert meta["app.kubernetes.io/instance"] == "qwen" and meta["app.kubernetes.io/managed-by"] == "duplex"
    assert meta["app.kubernetes.io/part-of"] == "duplex" and "app.kubernetes.io/version" in meta
    assert "app.kubernetes.io/version" not in pod_labels
    assert pod_labels == {k: v for k, v in meta.items() if k != "app.kubernetes.io/version"}


def test_selectors_of_the_roles_do_not_overlap() -> None:
    p = deployment(role="prefill")["spec"]["selector"]["matchLabels"]
    d = deployment(role="decode")["spec"]["template"]["metadata"]["labels"]
    assert not p.items() <= d.items()


def test_operator_version_bump_does_not_roll_engines(monkeypatch: pytest.MonkeyPatch) -> None:
    before = deployment()
    monkeypatch.setattr(labels_module, "__version__", "9.9.9")
    after = deployment()
    assert after["metadata"]["labels"]["app.kubernetes.io/version"] == "9.9.9"
    assert after["spec"]["template"] == before["spec"]["template"]


# --- config hash ------------------------------------------------------------------------------------------------

BASE = {
    "network": {"efa": {"enabled": True}},
    "prefill": {"memory": "64Gi", "tensorParallelSize": 2},
    "decode": {"memory": "64Gi", "tensorParallelSize": 2},
    "kvTransfer": {"allowDecodeTPBelowPrefill": True},
}

# Changes the engines must roll for (they change what the pods run).
ENGINE_CHANGES = {
    "recomputeThreshold": {"kvTransfer": {"recomputeThreshold": 128}},
    "decodeBlocksTTL": {"kvTransfer": {"decodeBlocksTTL": 600}},
    "leaseDuration": {"kvTransfer": {"leaseDuration": 60}},
    "bidirectional": {"kvTransfer": {"bidirectional": False}},
    "loadFailurePolicy": {"kvTransfer": {"loadFailurePolicy": "fail"}},
    "backend": {"kvTransfer": {"backend": "UCX"}},
    "sideChannelPort": {"kvTransfer": {"sideChannelPort": 5601}},
    "image": {"model": {"image": "vllm/vllm-openai:v0.34.0"}},
    "model env": {"model": {"env": [{"name": "X", "value": "1"}]}},
    "model extraArgs": {"model": {"extraArgs": ["--enforce-eager"]}},
    "blockSize": {"model": {"blockSize": 32}},
    "devicesPerPod": {"network": {"efa": {"devicesPerPod": 32}}},
    "efa off": {"network": {"efa": {"enabled": False}}},
    "servedModelName": {"model": {"servedModelName": "other"}},
}
# Changes that must not touch the engine Deployments at all.
ROUTER_CHANGES = {
    "router.replicas": {"router": {"replicas": 3, "store": {"type": "redis", "redis": {"url": "redis://r:6379"}}}},
    "conversation.ttl": {"router": {"conversation": {"ttl": 100}}},
    "conversation header": {"router": {"conversation": {"header": "X-Session", "bodyField": None}}},
    "router image": {"router": {"image": "ghcr.io/duplex-dev/duplex:9"}},
    "router resources": {"router": {"cpu": "4", "memory": "8Gi"}},
    "router service": {"router": {"service": {"type": "LoadBalancer", "port": 80, "annotations": {"a": "b"}}}},
    "router store": {"router": {"store": {"maxEntries": 5}}},
    "router maxBodyBytes": {"router": {"maxBodyBytes": 4096}},
    "router placement": {
        "router": {"nodeSelector": {"pool": "cpu"}, "tolerations": [{"key": "k", "operator": "Exists"}]}
    },
}


def test_hash_annotation_is_the_hash_of_the_pod_spec() -> None:
    d = deployment(BASE)
    assert d["spec"]["template"]["metadata"]["annotations"] == {
        ENGINE_HASH_ANNOTATION: config_hash(d["spec"]["template"]["spec"])
    }
    assert len(engine_hash(BASE)) == 16 and int(engine_hash(BASE), 16) >= 0


def test_hash_is_stable() -> None:
    assert engine_hash(BASE) == engine_hash(BASE)
    assert engine_config_hash(spec(BASE), "demo", "ns1") == engine_config_hash(spec(BASE), "demo", "ns1")


@pytest.mark.parametrize("change", list(ENGINE_CHANGES), ids=list(ENGINE_CHANGES))
def test_engine_facing_change_changes_the_hash_of_both_roles(change: str) -> None:
    changed = merge(BASE, ENGINE_CHANGES[change])
    for role in ROLES:
        assert engine_hash(changed, role) != engine_hash(BASE, role), role
    assert engine_config_hash(spec(changed), "demo", "ns1") != engine_config_hash(spec(BASE), "demo", "ns1")


@pytest.mark.parametrize("role", ROLES)
def test_role_only_change_changes_only_that_role(role: str) -> None:
    other = "decode" if role == "prefill" else "prefill"
    for patch in (
        {"env": [{"name": "X", "value": "1"}]},
        {"tensorParallelSize": 4},
        {"gpuMemoryUtilization": 0.8},
        {"extraArgs": ["--enforce-eager"]},
        {"cpu": "8"},
        {"maxNumSeqs": 4},
    ):
        changed = merge(BASE, {role: patch})
        assert engine_hash(changed, role) != engine_hash(BASE, role), patch
        assert deployment(changed, other) == deployment(BASE, other), patch
        assert engine_config_hash(spec(changed), "demo", "ns1") != engine_config_hash(spec(BASE), "demo", "ns1")


@pytest.mark.parametrize("change", list(ROUTER_CHANGES), ids=list(ROUTER_CHANGES))
def test_router_only_change_leaves_engine_workloads_byte_identical(change: str) -> None:
    changed = merge(BASE, ROUTER_CHANGES[change])
    for role in ROLES:
        assert yaml.safe_dump(deployment(changed, role)) == yaml.safe_dump(deployment(BASE, role))
    assert engine_config_hash(spec(changed), "demo", "ns1") == engine_config_hash(spec(BASE), "demo", "ns1")


def test_replicas_and_rollout_change_the_deployment_but_not_the_hash() -> None:
    changed = merge(BASE, {"prefill": {"replicas": 4, "rollout": {"maxSurge": 2}}})
    assert deployment(changed) != deployment(BASE)
    assert engine_hash(changed) == engine_hash(BASE)
    assert engine_config_hash(spec(changed), "demo", "ns1") == engine_config_hash(spec(BASE), "demo", "ns1")


def test_engine_config_hash_covers_both_roles_pod_templates() -> None:
    s = spec(BASE)
    parts = [engine_workload(s, "demo", "ns1", r)["spec"]["template"]["spec"] for r in ROLES]
    assert engine_config_hash(s, "demo", "ns1") == config_hash({"roles": parts})


def test_config_hash_ignores_key_order_but_not_values() -> None:
    assert config_hash({"a": 1, "b": [1, 2]}) == config_hash({"b": [1, 2], "a": 1})
    assert config_hash({"a": 1, "b": [1, 2]}) != config_hash({"a": 1, "b": [2, 1]})
    assert config_hash({"a": "1"}) != config_hash({"a": 1})


def test_builders_are_pure() -> None:
    s = spec(
        merge(
            BASE,
            {
                "prefill": {
                    "affinity": {
                        "podAffinity": {
                            "requiredDuringSchedulingIgnoredDuringExecution": [
                                {"labelSelector": {"matchLabels": {"x": "y"}}, "topologyKey": "kubernetes.io/hostname"}
                            ]
                        }
                    }
                },
                "decode": {"tolerations": [{"key": "k", "operator": "Exists"}]},
            },
        )
    )
    before = s.model_dump()
    first = [engine_workload(s, "demo", "ns1", r) for r in ROLES]
    second = [engine_workload(s, "demo", "ns1", r) for r in ROLES]
    assert first == second
    assert s.model_dump() == before


def test_a_role_env_entry_overrides_the_models_of_the_same_name() -> None:
    ctr = container(
        deployment(
            {"model": {"env": [{"name": "A", "value": "model"}]}, "prefill": {"env": [{"name": "A", "value": "role"}]}}
        )
    )
    assert [e for e in ctr["env"] if e["name"] == "A"] == [{"name": "A", "value": "role"}]


# --- how engine pods end (children/lifecycle.py) ---------------------------------------------------------------


def test_decode_pods_wait_for_their_bindings_in_a_pre_stop_hook_within_their_grace_period() -> None:
    ctr = container(deployment(role="decode"))
    hook = ctr["lifecycle"]["preStop"]["exec"]["command"]
    assert hook[:2] == ["python3", "/opt/duplex/engine-guard/duplex_drain.py"]
    assert hook[hook.index("--router") + 1] == "http://demo-drain.ns1.svc:9090"
    assert hook[hook.index("--deadline") + 1] == "480"  # decodeBlocksTTL: no binding outlives decode's blocks
    assert hook[hook.index("--active") + 1] == "120"  # bindings older than that are finished conversations
    assert ctr["args"][-2:] == ["--shutdown-timeout", "30"]
    # the hook's deadline, then vLLM's shutdown timeout, then time to exit
    assert pod_spec(role="decode")["terminationGracePeriodSeconds"] == 480 + 30 + 10


def test_the_drain_deadline_follows_its_field_and_zero_turns_the_hook_off() -> None:
    ctr = container(deployment({"decode": {"drain": {"deadlineSeconds": 90}}}, role="decode"))
    assert ctr["lifecycle"]["preStop"]["exec"]["command"][-2:] == ["--deadline", "90"]
    assert (
        pod_spec({"decode": {"drain": {"deadlineSeconds": 90}}}, role="decode")["terminationGracePeriodSeconds"] == 130
    )
    assert "lifecycle" not in container(deployment({"decode": {"drain": {"deadlineSeconds": 0}}}, role="decode"))
    assert pod_spec({"decode": {"drain": {"deadlineSeconds": 0}}}, role="decode")["terminationGracePeriodSeconds"] == 40


def test_prefill_holds_while_it_is_the_last_one_then_keeps_stepping_for_its_block_lease() -> None:
    patch = {"kvTransfer": {"leaseDuration": 120}}
    hook = container(deployment(patch))["lifecycle"]["preStop"]["exec"]["command"]
    assert hook[:2] == ["python3", "/opt/duplex/engine-guard/duplex_drain.py"]
    assert hook[-2:] == ["--deadline", "600"] and "--active" not in hook  # no bindings: held while it is the last
    assert container(deployment(patch))["args"][-2:] == ["--shutdown-timeout", "130"]
    assert pod_spec(patch)["terminationGracePeriodSeconds"] == 600 + 130 + 10
    off = {**patch, "prefill": {"drain": {"deadlineSeconds": 0}}}
    assert "lifecycle" not in container(deployment(off))
    assert pod_spec(off)["terminationGracePeriodSeconds"] == 140
