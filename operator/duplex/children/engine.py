"""The prefill and decode engine workloads: vLLM serve with NixlConnector, one builder for both roles; a Deployment,
or a LeaderWorkerSet (lws.py) for a role whose instance spans nodes."""

from __future__ import annotations

from typing import Any

from duplex.api.spec import DisaggregatedServingSpec, RoleSpec
from duplex.children import efa, engine_guard, engine_key, inference_pool, lifecycle, lws, preflight, tracing
from duplex.children.kinds import DEPLOYMENT
from duplex.children.kv_config import kv_transfer_json
from duplex.children.labels import ENGINE_HASH_ANNOTATION, HTTP_PORT, child_name, config_hash, labels, selector
from duplex.children.roles import EngineRole

ROLES = ("prefill", "decode")


def served_model_name(spec: DisaggregatedServingSpec) -> str:
    return spec.model.served_model_name or spec.model.name


def vllm_args(spec: DisaggregatedServingSpec, role: EngineRole) -> list[str]:
    """Arguments of `vllm serve` for one role (the container's args; command is ["vllm", "serve"])."""
    model = spec.model
    args = [
        model.name,
        "--served-model-name", served_model_name(spec),
        "--port", str(HTTP_PORT),
        "--tensor-parallel-size", str(role.spec.tensor_parallel_size),
        "--dtype", model.dtype,
        "--block-size", str(model.block_size),
        "--gpu-memory-utilization", f"{role.spec.gpu_memory_utilization:g}",
        "--enable-prefix-caching" if role.spec.enable_prefix_caching else "--no-enable-prefix-caching",
    ]  # fmt: skip
    if role.spec.pipeline_parallel_size > 1:
        args += ["--pipeline-parallel-size", str(role.spec.pipeline_parallel_size)]
    if model.max_model_len is not None:
        args += ["--max-model-len", str(model.max_model_len)]
    if role.spec.max_num_seqs is not None:
        args += ["--max-num-seqs", str(role.spec.max_num_seqs)]
    if role.spec.max_num_batched_tokens is not None:
        args += ["--max-num-batched-tokens", str(role.spec.max_num_batched_tokens)]
    if model.tool_call_parser is not None:
        args += ["--enable-auto-tool-choice", "--tool-call-parser", model.tool_call_parser]
    if model.reasoning_parser is not None:
        args += ["--reasoning-parser", model.reasoning_parser]
    args += ["--kv-transfer-config", kv_transfer_json(spec, role.name)]
    args += engine_guard.args()  # the engine key on every path but /health and /metrics
    args += lifecycle.args(spec, role.name)  # keep stepping after SIGTERM for the work still owed
    args += tracing.engine_args(spec)  # vLLM's own spans, in the router's traces
    return args + list(model.extra_args) + list(role.spec.extra_args)


def _env(spec: DisaggregatedServingSpec, role: RoleSpec, serving: str, role_name: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [
        # vLLM refuses /v1/* without this Bearer token; only the router holds it.
        engine_key.env(serving, engine_key.ENGINE_ENV),
        # NIXL's side channel must advertise the pod IP: the peer engine connects to it directly.
        {"name": "VLLM_NIXL_SIDE_CHANNEL_HOST", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {"name": "VLLM_NIXL_SIDE_CHANNEL_PORT", "value": str(spec.kv_transfer.side_channel_port)},
        *engine_guard.env(),
    ]
    if spec.model.hf_token_secret:
        ref = spec.model.hf_token_secret
        out.append({"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}}})
    if spec.model.cache:
        out.append({"name": "HF_HOME", "value": spec.model.cache.mount_path})
    out += efa.env(spec) + efa.accelerator_env(role) + tracing.engine_env(spec, serving, role_name)
    # The role's entry of a name overrides the model's (one entry per name: server-side apply refuses two).
    user = {e.name: e.model_dump(by_alias=True, exclude_none=True) for e in (*spec.model.env, *role.env)}
    return [e for e in out if e["name"] not in user] + list(user.values())


def _volumes(spec: DisaggregatedServingSpec, serving: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    volumes = [efa.shm_volume(spec), engine_guard.volume(serving)]
    mounts: list[dict[str, Any]] = [{"name": "dshm", "mountPath": "/dev/shm"}, engine_guard.mount()]
    cache = spec.model.cache
    if cache:
        if cache.pvc:
            source = {"persistentVolumeClaim": {"claimName": cache.pvc.claim_name, "readOnly": cache.pvc.read_only}}
        else:
            assert cache.host_path is not None
            source = {"hostPath": {"path": cache.host_path.path, "type": "Directory"}}
        volumes.append({"name": "model-cache", **source})
        mounts.append({"name": "model-cache", "mountPath": cache.mount_path})
    return volumes, mounts


def _probes() -> dict[str, Any]:
    health = {"httpGet": {"path": "/health", "port": "http"}}
    return {
        # Loading a large model takes minutes; the startup probe gives it up to 30 min before liveness applies.
        "startupProbe": {**health, "periodSeconds": 10, "failureThreshold": 180},
        "readinessProbe": {**health, "periodSeconds": 5, "failureThreshold": 3},
        "livenessProbe": {**health, "periodSeconds": 10, "failureThreshold": 6, "timeoutSeconds": 5},
    }


def engine_container(
    spec: DisaggregatedServingSpec, role: EngineRole, serving: str, namespace: str = "default"
) -> dict[str, Any]:
    _, mounts = _volumes(spec, serving)
    pre_stop = lifecycle.pre_stop(spec, serving, namespace, role.name)
    return {
        "name": "vllm",
        "image": spec.model.image,
        "imagePullPolicy": spec.model.image_pull_policy,
        "command": ["vllm", "serve"],
        "args": vllm_args(spec, role),
        "env": _env(spec, role.spec, serving, role.name),
        "ports": [
            {"name": "http", "containerPort": HTTP_PORT, "protocol": "TCP"},
            {"name": "nixl-side", "containerPort": spec.kv_transfer.side_channel_port, "protocol": "TCP"},
        ],
        "resources": efa.resources(spec, role.spec),
        "securityContext": efa.security_context(spec),
        "volumeMounts": mounts,
        **_probes(),
        **({"lifecycle": {"preStop": pre_stop}} if pre_stop else {}),
    }


def engine_pod_template(
    spec: DisaggregatedServingSpec, serving: str, namespace: str, role: EngineRole, key_uid: str | None = None
) -> dict[str, Any]:
    """The pod template of one engine instance on one node: what a Deployment runs, and what a LeaderWorkerSet's
    leader and workers start from (lws.py)."""
    volumes, _ = _volumes(spec, serving)
    engine = engine_container(spec, role, serving, namespace)
    pod_spec: dict[str, Any] = {
        "automountServiceAccountToken": False,  # engines never talk to the API server
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": lifecycle.grace_seconds(spec, role.name),
    }
    checks = preflight.init_containers(spec, role.spec, engine["env"], engine["securityContext"])
    if checks:
        pod_spec["initContainers"] = checks
    pod_spec |= {
        "containers": [engine],
        "volumes": volumes + preflight.volumes(spec),
        "tolerations": efa.tolerations(role.spec),
    }
    if role.spec.node_selector:
        pod_spec["nodeSelector"] = dict(role.spec.node_selector)
    affinity = efa.affinity(spec, serving, role.spec)
    if affinity:
        pod_spec["affinity"] = affinity
    if role.spec.topology_spread_constraints:
        pod_spec["topologySpreadConstraints"] = list(role.spec.topology_spread_constraints)
    if role.spec.priority_class_name:
        pod_spec["priorityClassName"] = role.spec.priority_class_name
    # No version label on pods: upgrading the operator alone must not roll GPU engines. llm-d's role label only
    # with router.inferencePool.enabled, for the same reason.
    pod_labels = {k: v for k, v in labels(serving, role.name).items() if k != "app.kubernetes.io/version"}
    pod_labels |= inference_pool.engine_pod_labels(spec, role.name)
    return {
        "metadata": {
            "labels": pod_labels,
            "annotations": {ENGINE_HASH_ANNOTATION: config_hash(pod_spec), **engine_key.template_annotations(key_uid)},
        },
        "spec": pod_spec,
    }


def engine_workload(
    spec: DisaggregatedServingSpec,
    serving: str,
    namespace: str,
    role_name: str,
    key_uid: str | None = None,
    planned: int | None = None,
) -> dict[str, Any]:
    """The workload of the role named `role_name` (prefill or decode): its Deployment, or its LeaderWorkerSet when an
    instance spans nodes (lws.py). `planned`: its replicas as the planner set them (scaling.mode Automatic)."""
    role = EngineRole.of(spec, role_name)
    template = engine_pod_template(spec, serving, namespace, role, key_uid)
    meta = {"name": child_name(serving, role.name), "namespace": namespace, "labels": labels(serving, role.name)}
    # scaling.mode External: another controller writes replicas (the operator hands them over, duplex.replicas).
    mode = role.spec.scaling.mode
    replicas = {} if mode == "External" else {"replicas": role.spec.replicas}
    if mode == "Automatic":
        replicas = {"replicas": planned if planned is not None else role.spec.starting_replicas()}
    if role.multinode:
        return lws.leader_worker_set(role, meta, template, replicas, lifecycle.worker_pre_stop(spec, role.name))
    return DEPLOYMENT.manifest(
        meta,
        spec={
            **replicas,
            "selector": {"matchLabels": selector(serving, role.name)},
            "progressDeadlineSeconds": role.spec.rollout.progress_deadline_seconds,
            "strategy": {
                "type": "RollingUpdate",
                "rollingUpdate": {
                    "maxSurge": role.spec.rollout.max_surge,
                    "maxUnavailable": role.spec.rollout.max_unavailable,
                },
            },
            "template": template,
        },
    )


def engine_config_hash(spec: DisaggregatedServingSpec, serving: str, namespace: str) -> str:
    """One hash over both roles' pod templates: it changes exactly when engine pods must roll."""
    parts = [engine_pod_template(spec, serving, namespace, EngineRole.of(spec, r))["spec"] for r in ROLES]
    return config_hash({"roles": parts})
