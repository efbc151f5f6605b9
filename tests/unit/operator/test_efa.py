"""EFA and the accelerator: what one `network.efa.enabled` switch adds to engine pods (resources, hugepages, IPC_LOCK,
/dev/shm, FI_* env, LIBFABRIC, zone co-placement), and what GPU vs Neuron changes."""

from __future__ import annotations

import json
from typing import Any

import pytest
from dsv_helpers import arg_value, env_map, merge, spec

from duplex.children import efa
from duplex.children.engine import engine_workload
from duplex.children.labels import SERVING_LABEL
from duplex.render import InvalidSpec

EFA_ON = {"network": {"efa": {"enabled": True}}, "prefill": {"memory": "256Gi"}, "decode": {"memory": "256Gi"}}
FI_VARS = {"FI_PROVIDER", "FI_EFA_USE_DEVICE_RDMA", "FI_EFA_USE_HUGE_PAGE", "FI_EFA_FORK_SAFE", "LD_LIBRARY_PATH"}


def pod(patch: dict[str, Any] | None = None, role: str = "prefill", name: str = "demo") -> dict[str, Any]:
    return engine_workload(spec(patch), name, "ns1", role)["spec"]["template"]["spec"]


def kv_config(patch: dict[str, Any] | None = None, role: str = "prefill") -> dict[str, Any]:
    return json.loads(arg_value(pod(patch, role)["containers"][0]["args"], "--kv-transfer-config"))


# --- EFA off ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_efa_off_adds_nothing(role: str) -> None:
    ps = pod({"prefill": {"memory": "8Gi", "cpu": "4"}}, role)
    ctr = ps["containers"][0]
    for section in ("requests", "limits"):
        assert efa.EFA_RESOURCE not in ctr["resources"][section]
        assert "hugepages-2Mi" not in ctr["resources"][section]
    assert not FI_VARS & env_map(ctr).keys()
    assert ctr["securityContext"] == {"allowPrivilegeEscalation": False, "seccompProfile": {"type": "RuntimeDefault"}}
    assert {"name": "dshm", "emptyDir": {"medium": "Memory"}} in ps["volumes"]
    assert "affinity" not in ps
    assert kv_config(None, role)["kv_connector_extra_config"]["backends"] == ["UCX"]


def test_privileged_is_ignored_without_efa() -> None:
    ctr = pod({"network": {"efa": {"privileged": True}}})["containers"][0]
    assert "privileged" not in ctr["securityContext"]
    assert ctr["securityContext"]["allowPrivilegeEscalation"] is False


# --- EFA on -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_efa_resources_are_requested_equal_to_limits(role: str) -> None:
    patch = merge(
        EFA_ON,
        {
            "network": {"efa": {"devicesPerPod": 32, "hugepages2Mi": "8Gi"}},
            "prefill": {"tensorParallelSize": 8},
            "decode": {"tensorParallelSize": 8},
        },
    )
    ctr = pod(merge(patch, {role: {"cpu": "96"}}), role)["containers"][0]
    res = ctr["resources"]
    assert res["requests"] == res["limits"]
    assert res["requests"] == {
        "nvidia.com/gpu": "8",
        "cpu": "96",
        "memory": "256Gi",
        "vpc.amazonaws.com/efa": "32",
        "hugepages-2Mi": "8Gi",
    }
    # requests and limits are separate objects: mutating one cannot change the other
    assert res["requests"] is not res["limits"]


def test_efa_default_devices_and_hugepages() -> None:
    res = pod(EFA_ON)["containers"][0]["resources"]["limits"]
    assert res["vpc.amazonaws.com/efa"] == "16" and res["hugepages-2Mi"] == "5120Mi"


def test_efa_security_context_adds_ipc_lock_without_privilege() -> None:
    ctx = pod(EFA_ON)["containers"][0]["securityContext"]
    assert ctx["capabilities"] == {"add": ["IPC_LOCK"]}
    assert "privileged" not in ctx and ctx["allowPrivilegeEscalation"] is False


def test_efa_privileged_only_when_asked() -> None:
    ctx = pod(merge(EFA_ON, {"network": {"efa": {"privileged": True}}}))["containers"][0]["securityContext"]
    assert ctx["privileged"] is True and ctx["capabilities"] == {"add": ["IPC_LOCK"]}
    # Kubernetes refuses privileged together with allowPrivilegeEscalation: false
    assert "allowPrivilegeEscalation" not in ctx


def test_efa_shm_size_limit() -> None:
    vols = pod(merge(EFA_ON, {"network": {"efa": {"shmSize": "32Gi"}}}))["volumes"]
    assert {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "32Gi"}} in vols
    assert {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "64Gi"}} in pod(EFA_ON)["volumes"]


@pytest.mark.parametrize("fork_safe,value", [(True, "1"), (False, "0")])
def test_efa_env(fork_safe: bool, value: str) -> None:
    env = env_map(
        pod(merge(EFA_ON, {"network": {"efa": {"forkSafe": fork_safe, "libraryPath": "/opt/x/lib"}}}))["containers"][0]
    )
    assert env["FI_PROVIDER"]["value"] == "efa"
    assert env["FI_EFA_USE_DEVICE_RDMA"]["value"] == "1"
    assert env["FI_EFA_USE_HUGE_PAGE"]["value"] == "1"
    assert env["FI_EFA_FORK_SAFE"]["value"] == value
    assert env["LD_LIBRARY_PATH"]["value"] == "/opt/x/lib"
    default = env_map(pod(EFA_ON)["containers"][0])
    assert default["LD_LIBRARY_PATH"]["value"] == "/opt/amazon/efa/lib:/opt/amazon/efa/lib64"


def test_user_env_overrides_an_efa_variable() -> None:
    env = env_map(pod(merge(EFA_ON, {"prefill": {"env": [{"name": "FI_PROVIDER", "value": "shm"}]}}))["containers"][0])
    assert env["FI_PROVIDER"] == {"name": "FI_PROVIDER", "value": "shm"}


@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_efa_selects_libfabric_unless_backend_is_set(role: str) -> None:
    assert kv_config(EFA_ON, role)["kv_connector_extra_config"]["backends"] == ["LIBFABRIC"]
    forced = merge(EFA_ON, {"kvTransfer": {"backend": "UCX"}})
    assert kv_config(forced, role)["kv_connector_extra_config"]["backends"] == ["UCX"]
    assert kv_config({"kvTransfer": {"backend": "LIBFABRIC"}}, role)["kv_connector_extra_config"]["backends"] == [
        "LIBFABRIC"
    ]


@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_efa_requires_same_zone_and_prefers_the_same_network_leaf(role: str) -> None:
    affinity = pod(EFA_ON, role, name="qwen")["affinity"]
    peers = {"matchLabels": {SERVING_LABEL: "qwen"}}
    assert affinity == {
        "podAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {"labelSelector": peers, "topologyKey": "topology.kubernetes.io/zone"}
            ],
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {
                    "weight": 100,
                    "podAffinityTerm": {"labelSelector": peers, "topologyKey": "topology.k8s.aws/network-node-layer-3"},
                }
            ],
        }
    }


def test_same_zone_off_drops_the_co_placement() -> None:
    assert "affinity" not in pod(merge(EFA_ON, {"network": {"efa": {"sameZone": False}}}))
    user = {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []}}
    assert (
        pod(merge(EFA_ON, {"network": {"efa": {"sameZone": False}}, "prefill": {"affinity": user}}))["affinity"] == user
    )


def test_user_affinity_is_merged_not_replaced_and_not_mutated() -> None:
    user_term = {"labelSelector": {"matchLabels": {"team": "a"}}, "topologyKey": "kubernetes.io/hostname"}
    user_pref = {"weight": 5, "podAffinityTerm": user_term}
    node_aff = {
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [{"key": "gpu", "operator": "Exists"}]}]
        }
    }
    user = {
        "nodeAffinity": node_aff,
        "podAntiAffinity": {"x": 1},
        "podAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [user_term],
            "preferredDuringSchedulingIgnoredDuringExecution": [user_pref],
        },
    }
    s = spec(merge(EFA_ON, {"prefill": {"affinity": user}}))
    snapshot = json.dumps(s.prefill.affinity, sort_keys=True)
    merged = efa.affinity(s, "demo", s.prefill)
    assert merged is not None
    assert merged["nodeAffinity"] == node_aff and merged["podAntiAffinity"] == {"x": 1}
    required = merged["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    preferred = merged["podAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert required[0] == user_term and required[1]["topologyKey"] == "topology.kubernetes.io/zone"
    assert preferred[0] == user_pref and preferred[1]["podAffinityTerm"]["topologyKey"].endswith("layer-3")
    assert len(required) == 2 and len(preferred) == 2
    # calling twice gives the same result: the spec's affinity was not mutated in place
    assert json.dumps(s.prefill.affinity, sort_keys=True) == snapshot
    assert efa.affinity(s, "demo", s.prefill) == merged


def test_efa_without_role_memory_is_refused() -> None:
    with pytest.raises(InvalidSpec) as info:
        spec({"network": {"efa": {"enabled": True}}, "prefill": {"memory": "1Gi"}})
    assert "network.efa.enabled needs prefill.memory and decode.memory" in str(info.value)


# --- GPU vs Neuron ----------------------------------------------------------------------------------------------

NEURON = {"type": "aws.amazon.com/neuron"}


@pytest.mark.parametrize("tp,count", [(1, 1), (2, 2), (8, 8), (64, 64)])
def test_gpu_count_defaults_to_tp(tp: int, count: int) -> None:
    s = spec({"decode": {"tensorParallelSize": tp}})
    assert efa.accelerator_count(s.decode) == count
    assert pod({"decode": {"tensorParallelSize": tp}}, "decode")["containers"][0]["resources"]["limits"][
        "nvidia.com/gpu"
    ] == str(count)


@pytest.mark.parametrize("tp,count", [(1, 1), (2, 1), (3, 2), (8, 4), (32, 16), (63, 32), (64, 32)])
def test_neuron_count_defaults_to_half_the_tp_rounded_up(tp: int, count: int) -> None:
    s = spec({"prefill": {"accelerator": NEURON}, "decode": {"tensorParallelSize": tp, "accelerator": NEURON}})
    assert efa.accelerator_count(s.decode) == count


def test_explicit_count_wins() -> None:
    assert efa.accelerator_count(spec({"prefill": {"accelerator": {"count": 3}}}).prefill) == 3
    assert (
        efa.accelerator_count(
            spec(
                {
                    "prefill": {"tensorParallelSize": 1, "accelerator": {"type": "aws.amazon.com/neuron", "count": 16}},
                    "decode": {"accelerator": NEURON},
                }
            ).prefill
        )
        == 16
    )


@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_neuron_resource_toleration_and_cpu_buffer(role: str) -> None:
    other = "decode" if role == "prefill" else "prefill"
    patch = {
        role: {"accelerator": NEURON, "tensorParallelSize": 8},
        other: {"accelerator": NEURON},
        "kvTransfer": {"allowDecodeTPBelowPrefill": True},
    }
    ps = pod(patch, role)
    res = ps["containers"][0]["resources"]
    assert res["requests"] == res["limits"] == {"aws.amazon.com/neuron": "4"}
    assert ps["tolerations"] == [{"key": "aws.amazon.com/neuron", "operator": "Exists", "effect": "NoSchedule"}]
    assert kv_config(patch, role)["kv_buffer_device"] == kv_config(patch, other)["kv_buffer_device"] == "cpu"


def test_gpu_resource_toleration_and_cuda_buffer() -> None:
    ps = pod()
    assert ps["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "1"}
    assert ps["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    assert kv_config()["kv_buffer_device"] == "cuda"


def test_buffer_device_override() -> None:
    assert kv_config({"kvTransfer": {"bufferDevice": "cpu"}})["kv_buffer_device"] == "cpu"
    assert (
        kv_config(
            {
                "kvTransfer": {"bufferDevice": "cuda"},
                "prefill": {"accelerator": NEURON},
                "decode": {"accelerator": NEURON},
            }
        )["kv_buffer_device"]
        == "cuda"
    )


def test_user_tolerations_are_added_after_the_accelerator_taint_without_duplicates() -> None:
    auto = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    extra = {"key": "dedicated", "operator": "Equal", "value": "llm", "effect": "NoSchedule"}
    assert pod({"prefill": {"tolerations": [auto, extra]}})["tolerations"] == [auto, extra]
    assert pod({"prefill": {"tolerations": [extra]}})["tolerations"] == [auto, extra]


def test_efa_and_neuron_together() -> None:
    patch = merge(
        EFA_ON,
        {
            "prefill": {"accelerator": {"type": "aws.amazon.com/neuron", "count": 16}, "tensorParallelSize": 32},
            "decode": {"accelerator": {"type": "aws.amazon.com/neuron", "count": 16}, "tensorParallelSize": 32},
        },
    )
    res = pod(patch)["containers"][0]["resources"]["limits"]
    assert res == {
        "aws.amazon.com/neuron": "16",
        "memory": "256Gi",
        "vpc.amazonaws.com/efa": "16",
        "hugepages-2Mi": "5120Mi",
    }
    cfg = kv_config(patch)
    assert cfg["kv_buffer_device"] == "cpu" and cfg["kv_connector_extra_config"]["backends"] == ["LIBFABRIC"]


def test_cpu_and_memory_only_when_set() -> None:
    assert pod()["containers"][0]["resources"]["requests"] == {"nvidia.com/gpu": "1"}
    assert pod({"prefill": {"cpu": "500m"}})["containers"][0]["resources"]["requests"] == {
        "nvidia.com/gpu": "1",
        "cpu": "500m",
    }
