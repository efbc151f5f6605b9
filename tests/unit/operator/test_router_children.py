"""The router's children: a ConfigMap whose router.json is the router's own RouterConfig, a locked-down Deployment,
and RBAC that can only read EndpointSlices in its namespace."""

from __future__ import annotations

import json
from typing import Any

import pytest
from dsv_helpers import children, container, env_map, find, spec

from duplex.children.kv_config import kv_transfer_config
from duplex.children.labels import ROLE_LABEL, SERVING_LABEL
from duplex.children.router import (
    CONFIG_DIR,
    CONFIG_KEY,
    POD_NAME_ENV,
    REDIS_URL_ENV,
    fabric_configmap,
    router_config,
    router_configmap,
    router_deployment,
    router_rbac,
)
from duplex_sidecars.router.config import RouterConfig

REDIS_URL = {"router": {"store": {"type": "redis", "redis": {"url": "redis://redis.cache:6379/2"}}}}
REDIS_SECRET = {"router": {"store": {"type": "redis", "redis": {"urlSecret": {"name": "redis-auth", "key": "url"}}}}}


def parsed_config(patch: dict[str, Any] | None = None, name: str = "demo", namespace: str = "ns1") -> RouterConfig:
    cm = router_configmap(spec(patch), name, namespace)
    return RouterConfig.model_validate_json(cm["data"][CONFIG_KEY])


# --- ConfigMap --------------------------------------------------------------------------------------------------


def test_configmap_object() -> None:
    cm = router_configmap(spec(), "qwen", "inference")
    assert (cm["apiVersion"], cm["kind"]) == ("v1", "ConfigMap")
    assert cm["metadata"]["name"] == "qwen-router" and cm["metadata"]["namespace"] == "inference"
    assert cm["metadata"]["labels"][ROLE_LABEL] == "router" and cm["metadata"]["labels"][SERVING_LABEL] == "qwen"
    assert set(cm["data"]) == {CONFIG_KEY, "kv-transfer-prefill.json", "kv-transfer-decode.json"}
    assert all(isinstance(v, str) and v.endswith("\n") for v in cm["data"].values())


def test_router_json_parses_with_the_routers_model_and_matches_the_builder() -> None:
    s = spec()
    cm = router_configmap(s, "demo", "ns1")
    parsed = RouterConfig.model_validate_json(cm["data"][CONFIG_KEY])
    assert parsed == router_config(s, "demo", "ns1")
    # every key is written out (no reliance on the router's own defaults drifting)
    assert set(json.loads(cm["data"][CONFIG_KEY])) == set(RouterConfig.model_fields)


def test_router_json_discovery_points_at_the_engine_services() -> None:
    cfg = parsed_config(name="qwen", namespace="inference")
    assert cfg.discovery is not None
    assert cfg.discovery.namespace == "inference"
    assert cfg.discovery.prefill_service == "qwen-prefill" and cfg.discovery.decode_service == "qwen-decode"
    assert cfg.discovery.port_name == "http"
    assert cfg.prefill == [] and cfg.decode == []
    assert (cfg.host, cfg.port, cfg.admin_port) == ("0.0.0.0", 8000, 9090)


def test_router_json_conversation_defaults() -> None:
    conv = parsed_config().conversation
    assert conv.body_field == "conversation_id" and conv.header == "X-Conversation-Id"
    assert conv.tenant_header == "Authorization"
    assert conv.ttl_seconds == 450.0 and conv.engine_blocks_ttl_seconds == 480.0


def test_router_json_carries_the_spec_ttls_and_identity() -> None:
    conv = parsed_config(
        {
            "kvTransfer": {"decodeBlocksTTL": 900},
            "router": {"conversation": {"ttl": 600, "header": "", "bodyField": "session", "tenantHeader": "X-Tenant"}},
        }
    ).conversation
    assert conv.ttl_seconds == 600.0 and conv.engine_blocks_ttl_seconds == 900.0
    assert conv.body_field == "session" and conv.header is None and conv.tenant_header == "X-Tenant"


def test_router_json_ttl_defaults_to_thirty_seconds_below_the_engine_ttl() -> None:
    conv = parsed_config({"kvTransfer": {"decodeBlocksTTL": 120}}).conversation
    assert (conv.ttl_seconds, conv.engine_blocks_ttl_seconds) == (90.0, 120.0)


@pytest.mark.parametrize(
    ("patch", "enabled", "words"),
    [
        ({}, True, 200),  # the rendered threshold 64 is far below 200 words
        ({"kvTransfer": {"recomputeThreshold": 1024}}, True, 2048),  # the replay must reach the threshold
        ({"kvTransfer": {"recomputeThreshold": 1024}, "model": {"maxModelLen": 900}}, True, 300),  # and fit the model
        ({"router": {"canary": {"promptWords": 64}}}, True, 64),
        ({"router": {"canary": {"enabled": False}}}, False, 200),
    ],
    ids=["default", "high threshold", "short context", "explicit", "disabled"],
)
def test_router_json_canary(patch: dict[str, Any], enabled: bool, words: int) -> None:
    canary = parsed_config(patch).canary
    assert (canary.enabled, canary.prompt_words) == (enabled, words)


def test_router_json_memory_store() -> None:
    store = parsed_config({"router": {"store": {"maxEntries": 1234}}}).store
    assert store.kind == "memory" and store.max_entries == 1234
    assert store.redis_url is None and store.redis_url_env is None


def test_router_json_redis_url() -> None:
    store = parsed_config(REDIS_URL).store
    assert store.kind == "redis" and store.redis_url == "redis://redis.cache:6379/2" and store.redis_url_env is None


def test_router_json_redis_url_from_secret_never_holds_the_url() -> None:
    cm = router_configmap(spec(REDIS_SECRET), "demo", "ns1")
    store = RouterConfig.model_validate_json(cm["data"][CONFIG_KEY]).store
    assert store.kind == "redis" and store.redis_url is None and store.redis_url_env == REDIS_URL_ENV
    env = env_map(container(router_deployment(spec(REDIS_SECRET), "demo", "ns1")))
    assert env[REDIS_URL_ENV] == {
        "name": REDIS_URL_ENV,
        "valueFrom": {"secretKeyRef": {"name": "redis-auth", "key": "url"}},
    }


def test_no_redis_env_without_a_secret_and_the_engine_key_always() -> None:
    key = {
        "name": "DUPLEX_ENGINE_API_KEY",
        "valueFrom": {"secretKeyRef": {"name": "demo-engine-key", "key": "api-key"}},
    }
    for patch in (None, REDIS_URL):
        env = container(router_deployment(spec(patch), "demo", "ns1"))["env"]
        assert [e for e in env if e["name"] != POD_NAME_ENV] == [key]


def test_the_router_sends_the_engine_key_from_its_env() -> None:
    assert parsed_config().engine_api_key_env == "DUPLEX_ENGINE_API_KEY"


def test_router_json_models_and_body_limit() -> None:
    cfg = parsed_config({"model": {"servedModelName": "qwen"}, "router": {"maxBodyBytes": 4096}})
    assert cfg.served_model_names == ["qwen"] and cfg.max_body_bytes == 4096
    assert parsed_config().served_model_names == ["org/model"]


def test_the_bodies_held_at_once_are_a_tenth_of_the_routers_memory_and_at_least_one_body() -> None:
    assert parsed_config().client_limits.max_held_body_bytes == int(3 * 1024**3 * 0.1)  # router.memory 3Gi
    small = parsed_config({"router": {"memory": "256Mi", "maxBodyBytes": 64 * 1024 * 1024}})
    assert small.client_limits.max_held_body_bytes == 64 * 1024 * 1024
    assert parsed_config().max_body_bytes == 8 * 1024 * 1024


def test_the_router_judges_the_fabric_by_the_engines_nixl_backend() -> None:
    efa = {"network": {"efa": {"enabled": True}}, "prefill": {"memory": "256Gi"}, "decode": {"memory": "256Gi"}}
    for patch, expected in ((None, "UCX"), (efa, "LIBFABRIC"), ({**efa, "kvTransfer": {"backend": "UCX"}}, "UCX")):
        s = spec(patch)
        assert (
            parsed_config(patch).fabric.backend
            == expected
            == kv_transfer_config(s, "decode")["kv_connector_extra_config"]["backends"][0]
        )


def test_kv_transfer_files_show_what_each_role_runs() -> None:
    s = spec({"kvTransfer": {"recomputeThreshold": 9}})
    data = router_configmap(s, "demo", "ns1")["data"]
    assert json.loads(data["kv-transfer-prefill.json"]) == kv_transfer_config(s, "prefill")
    assert json.loads(data["kv-transfer-decode.json"]) == kv_transfer_config(s, "decode")


def test_engine_only_change_does_not_touch_router_json() -> None:
    before = router_configmap(spec(), "demo", "ns1")["data"][CONFIG_KEY]
    after = router_configmap(
        spec(
            {
                "prefill": {"replicas": 5, "tensorParallelSize": 1},
                "model": {"image": "x/y:z", "extraArgs": ["--enforce-eager"]},
            }
        ),
        "demo",
        "ns1",
    )["data"][CONFIG_KEY]
    assert before == after


# --- Deployment -------------------------------------------------------------------------------------------------


def test_router_deployment_shape() -> None:
    d = router_deployment(
        spec({"router": {"image": "ghcr.io/x/duplex:1", "cpu": "2", "memory": "3Gi"}}), "qwen", "inference"
    )
    assert (d["apiVersion"], d["kind"]) == ("apps/v1", "Deployment")
    assert d["metadata"]["name"] == "qwen-router" and d["metadata"]["namespace"] == "inference"
    assert d["spec"]["replicas"] == 1
    assert d["spec"]["selector"]["matchLabels"] == {SERVING_LABEL: "qwen", ROLE_LABEL: "router"}
    pod_labels = d["spec"]["template"]["metadata"]["labels"]
    assert d["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    assert "app.kubernetes.io/version" not in pod_labels
    assert d["metadata"]["labels"]["app.kubernetes.io/name"] == "duplex-router"
    ctr = container(d)
    assert ctr["image"] == "ghcr.io/x/duplex:1"
    assert ctr["command"] == ["duplex", "router", "--config", f"{CONFIG_DIR}/{CONFIG_KEY}"]
    assert ctr["resources"] == {"requests": {"cpu": "2", "memory": "3Gi"}, "limits": {"cpu": "2", "memory": "3Gi"}}
    assert ctr["ports"] == [
        {"name": "http", "containerPort": 8000, "protocol": "TCP"},
        {"name": "admin", "containerPort": 9090, "protocol": "TCP"},
    ]
    # the admin port: a client filling the API port's connection cap cannot fail them
    assert ctr["readinessProbe"]["httpGet"] == {"path": "/ready", "port": "admin"}
    assert ctr["livenessProbe"]["httpGet"] == {"path": "/health", "port": "admin"}


def test_a_router_pod_leaves_its_service_before_it_stops_and_lets_what_is_in_flight_finish() -> None:
    d = router_deployment(spec(), "qwen", "inference")
    assert container(d)["lifecycle"] == {"preStop": {"sleep": {"seconds": 5}}}  # out of every kube-proxy first
    assert parsed_config().shutdown_grace_seconds == 120  # then a streamed turn in flight may finish
    assert d["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == 5 + 120 + 10


def test_router_mounts_its_configmap_read_only() -> None:
    d = router_deployment(spec(), "qwen", "ns1")
    ps = d["spec"]["template"]["spec"]
    assert ps["volumes"] == [{"name": "config", "configMap": {"name": "qwen-router"}}]
    assert container(d)["volumeMounts"] == [{"name": "config", "mountPath": CONFIG_DIR, "readOnly": True}]
    assert ps["serviceAccountName"] == "qwen-router"
    assert ps["enableServiceLinks"] is False


def test_router_security_context_is_locked_down() -> None:
    ctx = container(router_deployment(spec(), "demo", "ns1"))["securityContext"]
    assert ctx["runAsNonRoot"] is True and ctx["runAsUser"] != 0 and ctx["runAsGroup"] != 0
    assert ctx["readOnlyRootFilesystem"] is True
    assert ctx["allowPrivilegeEscalation"] is False
    assert ctx["capabilities"] == {"drop": ["ALL"]}
    assert ctx["seccompProfile"] == {"type": "RuntimeDefault"}
    assert "privileged" not in ctx


def test_router_replicas_and_placement() -> None:
    d = router_deployment(
        spec(
            {
                "router": {
                    "replicas": 3,
                    "nodeSelector": {"pool": "cpu"},
                    "tolerations": [{"key": "k", "operator": "Exists"}],
                    "store": {"type": "redis", "redis": {"url": "redis://r"}},
                }
            }
        ),
        "demo",
        "ns1",
    )
    assert d["spec"]["replicas"] == 3
    ps = d["spec"]["template"]["spec"]
    assert ps["nodeSelector"] == {"pool": "cpu"} and ps["tolerations"] == [{"key": "k", "operator": "Exists"}]
    plain = router_deployment(spec(), "demo", "ns1")["spec"]["template"]["spec"]
    assert "nodeSelector" not in plain and "tolerations" not in plain


def test_router_rolls_one_at_a_time_without_losing_capacity() -> None:
    strategy = router_deployment(spec(), "demo", "ns1")["spec"]["strategy"]
    assert strategy == {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}


# --- RBAC -------------------------------------------------------------------------------------------------------


def test_rbac_objects() -> None:
    sa, role, binding = router_rbac("qwen", "inference")
    for obj in (sa, role, binding):
        assert obj["metadata"]["name"] == "qwen-router" and obj["metadata"]["namespace"] == "inference"
        assert obj["metadata"]["labels"][ROLE_LABEL] == "router"
    assert (sa["apiVersion"], sa["kind"]) == ("v1", "ServiceAccount")
    assert (role["apiVersion"], role["kind"]) == ("rbac.authorization.k8s.io/v1", "Role")
    assert (binding["apiVersion"], binding["kind"]) == ("rbac.authorization.k8s.io/v1", "RoleBinding")


def test_role_grants_reading_endpointslices_and_patching_its_fabric_configmap_only() -> None:
    _, role, _ = router_rbac("qwen", "inference")
    assert role["rules"] == [
        {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["get", "list", "watch"]},
        {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["patch"], "resourceNames": ["qwen-fabric"]},
    ]
    writes = [r for r in role["rules"] if set(r["verbs"]) & {"create", "update", "patch", "delete", "deletecollection"}]
    assert all(r.get("resourceNames") == ["qwen-fabric"] for r in writes)
    assert not any("*" in r["verbs"] or "*" in r["resources"] for r in role["rules"])


def test_the_router_reports_the_fabric_into_the_configmap_its_role_names() -> None:
    cm = router_configmap(spec(None), "qwen", "inference")
    report = RouterConfig.model_validate_json(cm["data"][CONFIG_KEY]).fabric.report
    assert report is not None and (report.namespace, report.config_map) == ("inference", "qwen-fabric")
    env = env_map(container(router_deployment(spec(None), "qwen", "inference")))
    assert env[report.pod_name_env] == {
        "name": report.pod_name_env,
        "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}},
    }
    fabric = fabric_configmap("qwen", "inference")
    assert fabric["metadata"]["name"] == "qwen-fabric" and "data" not in fabric


def test_binding_ties_the_service_account_to_the_role() -> None:
    _, _, binding = router_rbac("qwen", "inference")
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "qwen-router"}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "qwen-router", "namespace": "inference"}]


def test_rbac_metadata_objects_are_independent() -> None:
    sa, role, binding = router_rbac("qwen", "inference")
    sa["metadata"]["name"] = "changed"
    assert role["metadata"]["name"] == binding["metadata"]["name"] == "qwen-router"


@pytest.mark.parametrize(
    "patch",
    [
        None,
        REDIS_URL,
        REDIS_SECRET,
        {"router": {"conversation": {"bodyField": None}}},
        {"kvTransfer": {"decodeBlocksTTL": 60}},
    ],
)
def test_router_config_always_valid_for_the_router(patch: dict[str, Any] | None) -> None:
    cfg = parsed_config(patch)
    assert cfg.conversation.ttl_seconds < cfg.conversation.engine_blocks_ttl_seconds


@pytest.mark.parametrize("memory,store_bytes", [("3Gi", int(3 * 2**30 * 0.6)), ("256Mi", int(256 * 2**20 * 0.6))])
def test_router_store_is_bounded_by_the_router_memory(memory: str, store_bytes: int) -> None:
    from duplex.children.router import router_config
    from duplex.render import parse_spec

    spec_ = parse_spec({"model": {"name": "m"}, "router": {"memory": memory}})
    assert router_config(spec_, "s", "ns").store.max_bytes == store_bytes


@pytest.mark.parametrize("memory", ["255Mi", "128Mi", "1"])
def test_router_memory_minimum(memory: str) -> None:
    from duplex.render import InvalidSpec, parse_spec

    with pytest.raises(InvalidSpec) as err:
        parse_spec({"model": {"name": "m"}, "router": {"memory": memory}})
    assert "router.memory must be at least 256Mi" in str(err.value)


def test_client_keys_come_from_a_secret_mounted_as_a_directory() -> None:
    assert parsed_config().client_keys_dir is None
    keyed = {"router": {"clientKeysSecret": "api-keys"}}
    assert parsed_config(keyed).client_keys_dir == "/etc/duplex-client-keys"
    pod = find(children(keyed), "Deployment", "demo-router")["spec"]["template"]["spec"]
    assert {"name": "client-keys", "secret": {"secretName": "api-keys", "defaultMode": 0o440}} in pod["volumes"]
    (ctr,) = pod["containers"]
    # a directory, not subPath: the kubelet swaps rotated keys in, and the router rereads them without a restart
    assert {"name": "client-keys", "mountPath": "/etc/duplex-client-keys", "readOnly": True} in ctr["volumeMounts"]


def test_a_gateway_is_rendered_into_the_router_config_and_needs_client_keys() -> None:
    from duplex.render import InvalidSpec, parse_spec

    assert parsed_config().gateway is None
    gated = {"router": {"clientKeysSecret": "api-keys", "gateway": {"keys": ["envoy"]}}}
    gateway = parsed_config(gated).gateway
    assert gateway is not None and gateway.keys == ["envoy"] and gateway.tenant_header == "X-Duplex-Tenant"
    with pytest.raises(InvalidSpec) as err:
        parse_spec({"model": {"name": "m"}, "router": {"gateway": {"keys": ["envoy"]}}})
    assert "router.gateway needs router.clientKeysSecret" in str(err.value)


def test_the_roles_slots_come_from_max_num_seqs_for_the_saturation_gauge() -> None:
    assert parsed_config().capacity.prefill_slots is None
    capacity = parsed_config({"prefill": {"maxNumSeqs": 8}, "decode": {"maxNumSeqs": 64}}).capacity
    assert (capacity.prefill_slots, capacity.decode_slots) == (8, 64)
