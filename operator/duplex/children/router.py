"""The router: its config (the router's own pydantic model), ConfigMap, Deployment and least-privilege RBAC."""

from __future__ import annotations

import json
from typing import Any

from duplex.api.quantity import quantity
from duplex.api.spec import DisaggregatedServingSpec
from duplex.children import engine_key, lifecycle, tracing
from duplex.children.engine import served_model_name
from duplex.children.kinds import CONFIG_MAP, DEPLOYMENT, ROLE, ROLE_BINDING, SERVICE_ACCOUNT
from duplex.children.kv_config import backend, engine_threshold, kv_transfer_config, router_threshold, router_ttl
from duplex.children.labels import ADMIN_PORT, HTTP_PORT, child_name, labels, selector
from duplex_sidecars.router.config import (
    CanaryConfig,
    CapacityConfig,
    ClientLimitsConfig,
    ConversationConfig,
    EndpointSliceDiscovery,
    FabricConfig,
    FabricReportConfig,
    GatewayConfig,
    ReuseConfig,
    RouterConfig,
    StoreConfig,
    TimeoutsConfig,
)

CONFIG_KEY = "router.json"
# Share of the router container's memory limit the conversation store may fill; the rest is the process itself.
CLIENT_KEYS_DIR = "/etc/duplex-client-keys"  # beside CONFIG_DIR: a mount point inside a ConfigMap volume cannot be made
STORE_MEMORY_SHARE = 0.6
BODIES_MEMORY_SHARE = 0.1  # request bodies held at once (client_limits.max_held_body_bytes)
CONFIG_DIR = "/etc/duplex"
REDIS_URL_ENV = "DUPLEX_REDIS_URL"
POD_NAME_ENV = "POD_NAME"
# All the router may do with the API: follow the engines' EndpointSlices, and patch its serving's fabric ConfigMap
# (that one object: router_rbac names it). The operator must hold these rights itself to grant them (RBAC refuses
# escalation), so its ClusterRole is checked against this too.
ROUTER_RULES: tuple[dict[str, list[str]], ...] = (
    {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["get", "list", "watch"]},
    {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["patch"]},
)


def fabric_configmap_name(serving: str) -> str:
    return child_name(serving, "fabric")


def fabric_configmap(serving: str, namespace: str) -> dict[str, Any]:
    """Where each router pod reports its fabric verdict (router/fabric_report.py): the operator owns the object and
    never writes its data, so server-side apply leaves the routers' keys alone; status.kv_transfer reads them."""
    return CONFIG_MAP.manifest(
        {"name": fabric_configmap_name(serving), "namespace": namespace, "labels": labels(serving, "router")}
    )


def router_config(
    spec: DisaggregatedServingSpec, serving: str, namespace: str, auto_threshold: int | None = None
) -> RouterConfig:
    conv = spec.router.conversation
    limits = spec.router.limits
    store = spec.router.store
    redis = store.redis
    return RouterConfig(
        host="0.0.0.0",
        port=HTTP_PORT,
        admin_port=ADMIN_PORT,
        discovery=EndpointSliceDiscovery(
            namespace=namespace,
            prefill_service=child_name(serving, "prefill"),
            decode_service=child_name(serving, "decode"),
            port_name="http",
        ),
        conversation=ConversationConfig(
            keying=conv.keying,
            session_headers=list(conv.session_headers),
            body_field=conv.body_field or None,
            header=conv.header or None,
            tenant_header=conv.tenant_header,
            ttl_seconds=float(router_ttl(spec)),
            engine_blocks_ttl_seconds=float(spec.kv_transfer.decode_blocks_ttl),
        ),
        store=StoreConfig(
            kind=store.type,
            max_entries=store.max_entries,
            max_bytes=int(float(quantity(spec.router.memory)) * STORE_MEMORY_SHARE),
            redis_url=redis.url if redis else None,
            redis_url_env=REDIS_URL_ENV if redis and redis.url_secret else None,
        ),
        max_body_bytes=spec.router.max_body_bytes,
        client_limits=ClientLimitsConfig(
            max_connections=limits.max_connections,
            max_connections_per_source=limits.max_connections_per_source,
            max_inflight_requests=limits.max_inflight_requests,
            head_timeout_seconds=float(limits.head_timeout),
            body_timeout_seconds=float(limits.body_timeout),
            idle_seconds=float(limits.idle_timeout),
            max_held_body_bytes=max(
                spec.router.max_body_bytes, int(float(quantity(spec.router.memory)) * BODIES_MEMORY_SHARE)
            ),
        ),
        timeouts=TimeoutsConfig(replay_prefill_seconds=float(limits.replay_prefill_timeout)),
        shutdown_grace_seconds=float(lifecycle.ROUTER_SHUTDOWN_SECONDS),
        served_model_names=[served_model_name(spec)],
        fabric=FabricConfig(
            backend=backend(spec),
            report=FabricReportConfig(
                namespace=namespace, config_map=fabric_configmap_name(serving), pod_name_env=POD_NAME_ENV
            ),
        ),
        canary=CanaryConfig(enabled=spec.router.canary.enabled, prompt_words=canary_words(spec)),
        reuse=ReuseConfig(
            min_tokens=router_threshold(spec, auto_threshold),
            calibration_min_samples=spec.kv_transfer.recompute_calibration.min_samples,
        ),
        engine_api_key_env=engine_key.ROUTER_ENV,
        client_keys_dir=CLIENT_KEYS_DIR if spec.router.client_keys_secret else None,
        receipts=spec.router.receipts,
        tracing=tracing.router_config(spec, serving),
        capacity=CapacityConfig(prefill_slots=spec.prefill.max_num_seqs, decode_slots=spec.decode.max_num_seqs),
        gateway=(
            GatewayConfig(keys=list(gateway.keys), tenant_header=gateway.tenant_header)
            if (gateway := spec.router.gateway)
            else None
        ),
    )


def canary_words(spec: DisaggregatedServingSpec) -> int:
    """Enough words for the canary's replay to reach the recompute threshold (a word is a token or more), and few
    enough for the model's context (two turns of a few tokens each come on top)."""
    if spec.router.canary.prompt_words is not None:
        return spec.router.canary.prompt_words
    words = min(8192, max(200, 2 * engine_threshold(spec)))  # the router's own threshold does not apply to it
    if spec.model.max_model_len:
        words = min(words, spec.model.max_model_len // 3)
    return max(16, words)


def router_configmap(
    spec: DisaggregatedServingSpec, serving: str, namespace: str, auto_threshold: int | None = None
) -> dict[str, Any]:
    config = router_config(spec, serving, namespace, auto_threshold).model_dump(mode="json")
    data = {
        CONFIG_KEY: json.dumps(config, indent=2, sort_keys=True) + "\n",
        # For humans and diff tools: the connector config each role's engines run with.
        "kv-transfer-prefill.json": json.dumps(kv_transfer_config(spec, "prefill"), indent=2, sort_keys=True) + "\n",
        "kv-transfer-decode.json": json.dumps(kv_transfer_config(spec, "decode"), indent=2, sort_keys=True) + "\n",
    }
    return CONFIG_MAP.manifest(
        {"name": child_name(serving, "router"), "namespace": namespace, "labels": labels(serving, "router")},
        data=data,
    )


def router_deployment(
    spec: DisaggregatedServingSpec, serving: str, namespace: str, key_uid: str | None = None
) -> dict[str, Any]:
    router = spec.router
    name = child_name(serving, "router")
    env: list[dict[str, Any]] = [
        engine_key.env(serving, engine_key.ROUTER_ENV),  # sent to the engines as Bearer
        {"name": POD_NAME_ENV, "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},  # its fabric report's key
    ]
    if router.store.redis and router.store.redis.url_secret:
        ref = router.store.redis.url_secret
        env.append({"name": REDIS_URL_ENV, "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}}})
    amounts = {"cpu": router.cpu, "memory": router.memory}
    mounts: list[dict[str, Any]] = [{"name": "config", "mountPath": CONFIG_DIR, "readOnly": True}]
    container = {
        "name": "router",
        "image": router.image,
        "command": ["duplex", "router", "--config", f"{CONFIG_DIR}/{CONFIG_KEY}"],
        "env": env,
        "ports": [
            {"name": "http", "containerPort": HTTP_PORT, "protocol": "TCP"},
            {"name": "admin", "containerPort": ADMIN_PORT, "protocol": "TCP"},
        ],
        "resources": {"requests": dict(amounts), "limits": dict(amounts)},
        # On the admin port: clients that fill the API port's connection cap must not fail the kubelet's probes
        # (a liveness restart would drop the memory store's conversations).
        "readinessProbe": {"httpGet": {"path": "/ready", "port": "admin"}, "periodSeconds": 5},
        "livenessProbe": {"httpGet": {"path": "/health", "port": "admin"}, "periodSeconds": 10, "failureThreshold": 3},
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": 65532,
            "runAsGroup": 65532,
            "readOnlyRootFilesystem": True,
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "volumeMounts": mounts,
        "lifecycle": {"preStop": lifecycle.router_pre_stop()},  # out of the Service before it stops listening
    }
    volumes: list[dict[str, Any]] = [{"name": "config", "configMap": {"name": name}}]
    if router.client_keys_secret:
        # Mounted as a directory (not subPath), so that the kubelet swaps rotated keys in and the router rereads them.
        volumes.append(
            {"name": "client-keys", "secret": {"secretName": router.client_keys_secret, "defaultMode": 0o440}}
        )
        mounts.append({"name": "client-keys", "mountPath": CLIENT_KEYS_DIR, "readOnly": True})
    pod_spec: dict[str, Any] = {
        "serviceAccountName": name,
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": lifecycle.router_grace_seconds(),
        "containers": [container],
        # The mounted file updates in place; the router reloads it without a restart (no conversation state lost).
        "volumes": volumes,
    }
    if router.node_selector:
        pod_spec["nodeSelector"] = dict(router.node_selector)
    if router.tolerations:
        pod_spec["tolerations"] = list(router.tolerations)
    meta_labels = labels(serving, "router")
    pod_labels = {k: v for k, v in meta_labels.items() if k != "app.kubernetes.io/version"}
    return DEPLOYMENT.manifest(
        {"name": name, "namespace": namespace, "labels": meta_labels},
        spec={
            "replicas": router.replicas,
            "selector": {"matchLabels": selector(serving, "router")},
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
            "template": {"metadata": {"labels": pod_labels, **_annotations(key_uid)}, "spec": pod_spec},
        },
    )


def router_rbac(serving: str, namespace: str) -> list[dict[str, Any]]:
    """A ServiceAccount that may only read EndpointSlices in its own namespace and patch its fabric ConfigMap."""
    name = child_name(serving, "router")
    meta = {"name": name, "namespace": namespace, "labels": labels(serving, "router")}
    rules = []
    for rule in ROUTER_RULES:
        rendered = {k: list(v) for k, v in rule.items()}
        if rule["resources"] == ["configmaps"]:
            rendered["resourceNames"] = [fabric_configmap_name(serving)]
        rules.append(rendered)
    return [
        SERVICE_ACCOUNT.manifest(dict(meta)),
        ROLE.manifest(dict(meta), rules=rules),
        ROLE_BINDING.manifest(
            dict(meta),
            roleRef={"apiGroup": ROLE.group, "kind": ROLE.kind, "name": name},
            subjects=[{"kind": SERVICE_ACCOUNT.kind, "name": name, "namespace": namespace}],
        ),
    ]


def _annotations(key_uid: str | None) -> dict[str, Any]:
    annotations = engine_key.template_annotations(key_uid)
    return {"annotations": annotations} if annotations else {}
