"""Spec documents and value tables shared by the spec, CRD and schema tests: one place to extend when a field is added."""

from __future__ import annotations

import typing
from collections.abc import Iterator
from typing import Any

from dsv_helpers import merge
from pydantic import BaseModel

import duplex
from duplex.api.spec import DisaggregatedServingSpec

# Every field set to a value other than its default. Exactly-one-of pairs are split across FULL and FULL_ALT.
FULL: dict[str, Any] = {
    "model": {
        "name": "Qwen/Qwen3-32B",
        "servedModelName": "qwen",
        "image": "registry.example/vllm:1",
        "imagePullPolicy": "Always",
        "dtype": "bfloat16",
        "maxModelLen": 32768,
        "blockSize": 32,
        "hfTokenSecret": {"name": "hf", "key": "token"},
        "cache": {"pvc": {"claimName": "weights", "readOnly": False}, "mountPath": "/cache"},
        "toolCallParser": "hermes",
        "reasoningParser": "qwen3",
        "env": [{"name": "A", "value": "1"}, {"name": "B", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}],
        "extraArgs": ["--enforce-eager"],
    },
    "prefill": {
        "replicas": 2,
        "scaling": {"mode": "Fixed", "minReplicas": 2, "maxReplicas": 6},
        "tensorParallelSize": 4,
        "pipelineParallelSize": 2,
        "nodesPerInstance": 2,
        "instanceTopologyKey": "topology.kubernetes.io/zone",
        "accelerator": {"type": "nvidia.com/gpu", "count": 4},
        "cpu": "32",
        "memory": "256Gi",
        "gpuMemoryUtilization": 0.85,
        "enablePrefixCaching": False,
        "maxNumSeqs": 16,
        "maxNumBatchedTokens": 8192,
        "nodeSelector": {"node.kubernetes.io/instance-type": "p5.48xlarge"},
        "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "llm", "effect": "NoSchedule"}],
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [{"matchExpressions": [{"key": "k", "operator": "In", "values": ["v"]}]}]
                }
            }
        },
        "topologySpreadConstraints": [
            {"maxSkew": 1, "topologyKey": "kubernetes.io/hostname", "whenUnsatisfiable": "ScheduleAnyway"}
        ],
        "priorityClassName": "high",
        "rollout": {"maxSurge": 0, "maxUnavailable": 1, "progressDeadlineSeconds": 1800},
        "env": [{"name": "P", "value": "p"}, {"name": "P2", "valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}}}],
        "extraArgs": ["--max-num-partial-prefills", "2"],
        "drain": {"deadlineSeconds": 300},
    },
    "decode": {
        "replicas": 3,
        "scaling": {"mode": "Fixed", "minReplicas": 0, "maxReplicas": 12},
        "tensorParallelSize": 8,
        "pipelineParallelSize": 2,
        "nodesPerInstance": 2,
        "instanceTopologyKey": "topology.k8s.aws/network-node-layer-3",
        "accelerator": {"type": "nvidia.com/gpu", "count": 8},
        "cpu": "64",
        "memory": "512Gi",
        "gpuMemoryUtilization": 0.8,
        "enablePrefixCaching": False,
        "maxNumSeqs": 64,
        "maxNumBatchedTokens": 4096,
        "nodeSelector": {"pool": "decode"},
        "tolerations": [{"key": "dedicated", "operator": "Exists"}],
        "affinity": {"podAntiAffinity": {}},
        "topologySpreadConstraints": [
            {"maxSkew": 2, "topologyKey": "topology.kubernetes.io/zone", "whenUnsatisfiable": "DoNotSchedule"}
        ],
        "priorityClassName": "higher",
        "rollout": {"maxSurge": 2, "maxUnavailable": 1, "progressDeadlineSeconds": 900},
        "env": [{"name": "D", "value": "d"}, {"name": "D2", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}],
        "extraArgs": ["--swap-space", "8"],
        "drain": {"deadlineSeconds": 120, "activeSeconds": 30},
    },
    "network": {
        "efa": {
            "enabled": True,
            "devicesPerPod": 32,
            "hugepages2Mi": "8Gi",
            "shmSize": "32Gi",
            "privileged": True,
            "forkSafe": False,
            "libraryPath": "/opt/efa/lib",
            "sameZone": False,
        },
        "networkPolicy": {"enabled": False, "metricsNamespaces": ["observability", "prometheus"]},
        "preflight": {"enabled": False, "strict": True, "image": "registry.example/duplex:pinned"},
    },
    "kvTransfer": {
        "connector": "NixlConnector",
        "backend": "UCX",
        "bufferDevice": "cpu",
        "bidirectional": False,
        "decodeBlocksTTL": 900,
        "recomputeThreshold": 0,
        "recomputeCalibration": {
            "initial": 100,
            "minTokens": 32,
            "maxTokens": 4096,
            "margin": 0.5,
            "minIntervalSeconds": 1800,
            "minSamples": 64,
        },
        "leaseDuration": 45,
        "loadFailurePolicy": "fail",
        "sideChannelPort": 5700,
        "allowDecodeTPBelowPrefill": True,
    },
    "router": {
        "replicas": 3,
        "image": "registry.example/duplex:2",
        "cpu": "2",
        "memory": "2Gi",
        "service": {"type": "LoadBalancer", "port": 80, "annotations": {"a": "b"}},
        "conversation": {
            "keying": "id",
            "sessionHeaders": ["X-Session"],
            "bodyField": "conv",
            "header": "X-Conv",
            "tenantHeader": "X-Tenant",
            "ttl": 600,
        },
        "store": {"type": "redis", "maxEntries": 10, "redis": {"url": "redis://redis:6379/0"}},
        "nodeSelector": {"pool": "cpu"},
        "tolerations": [{"key": "cpu", "operator": "Exists"}],
        "maxBodyBytes": 2048,
        "limits": {
            "maxConnections": 100,
            "maxConnectionsPerSource": 50,
            "maxInflightRequests": 10,
            "headTimeout": 5,
            "bodyTimeout": 30,
            "idleTimeout": 20,
            "replayPrefillTimeout": 15,
        },
        "clientKeysSecret": "api-keys",
        "gateway": {"keys": ["envoy"], "tenantHeader": "X-User"},
        "receipts": False,
        "canary": {"enabled": False, "promptWords": 500},
        "inferencePool": {
            "enabled": True,
            "endpointPicker": {"name": "qwen-epp", "port": 9102, "failureMode": "FailClose"},
        },
    },
    "autoscaling": {
        "targetSaturation": 0.9,
        "ttftP90Seconds": 2.0,
        "prefillPerDecode": {"min": 0.5, "max": 2.0},
        "scaleDownSeconds": 600,
        "dryRun": True,
    },
    "tracing": {"endpoint": "http://otel-collector.observability:4318", "sampleRatio": 0.25, "engines": False},
}

FULL_ALT: dict[str, Any] = merge(
    FULL,
    {
        "model": {"cache": {"pvc": None, "hostPath": {"path": "/mnt/raid0"}}},
        # prefill and decode always on one accelerator kind: FULL has both on GPU, each spanning two nodes; cpu runs
        # without EFA, on one node, where prefill's replicas are external and decode's planned
        "prefill": {
            "accelerator": {"type": "cpu", "count": None, "kvCacheGiB": 2},
            "scaling": {"mode": "External"},
            "pipelineParallelSize": None,
            "nodesPerInstance": None,
            "instanceTopologyKey": None,
        },
        "decode": {
            "accelerator": {"type": "cpu", "count": None, "kvCacheGiB": 3},
            "scaling": {"mode": "Automatic"},
            "pipelineParallelSize": None,
            "nodesPerInstance": None,
            "instanceTopologyKey": None,
        },
        "network": {"efa": {"enabled": False}},
        "kvTransfer": {"backend": "LIBFABRIC", "bufferDevice": "cuda"},
        "router": {"store": {"redis": {"url": None, "urlSecret": {"name": "redis", "key": "url"}}}},
    },
)


def drop_none(d: Any) -> Any:
    if isinstance(d, dict):
        return {k: drop_none(v) for k, v in d.items() if v is not None}
    if isinstance(d, list):
        return [drop_none(v) for v in d]
    return d


FULL_ALT = drop_none(FULL_ALT)

DEFAULTS: dict[str, Any] = {
    "model": {
        "name": "org/model",
        "servedModelName": None,
        "image": "vllm/vllm-openai:v0.33.0",
        "imagePullPolicy": "IfNotPresent",
        "dtype": "auto",
        "maxModelLen": None,
        "blockSize": 16,
        "hfTokenSecret": None,
        "cache": None,
        "toolCallParser": None,
        "reasoningParser": None,
        "env": [],
        "extraArgs": [],
    },
    **{
        role: {
            "replicas": 1,
            "scaling": {"mode": "Fixed", "minReplicas": 1, "maxReplicas": 8},
            "tensorParallelSize": 1,
            "pipelineParallelSize": 1,
            "nodesPerInstance": 1,
            "instanceTopologyKey": None,
            "accelerator": {"type": "nvidia.com/gpu", "count": None, "kvCacheGiB": None},
            "cpu": None,
            "memory": None,
            "gpuMemoryUtilization": 0.9,
            "enablePrefixCaching": True,
            "maxNumSeqs": None,
            "maxNumBatchedTokens": None,
            "nodeSelector": {},
            "tolerations": [],
            "affinity": None,
            "topologySpreadConstraints": [],
            "priorityClassName": None,
            "rollout": {"maxSurge": 1, "maxUnavailable": 0, "progressDeadlineSeconds": 600},
            "env": [],
            "extraArgs": [],
            "drain": (
                {"deadlineSeconds": None, "activeSeconds": 120} if role == "decode" else {"deadlineSeconds": 600}
            ),
        }
        for role in ("prefill", "decode")
    },
    "network": {
        "efa": {
            "enabled": False,
            "devicesPerPod": 16,
            "hugepages2Mi": "5120Mi",
            "shmSize": "64Gi",
            "privileged": False,
            "forkSafe": True,
            "libraryPath": "/opt/amazon/efa/lib:/opt/amazon/efa/lib64",
            "sameZone": True,
        },
        "networkPolicy": {"enabled": True, "metricsNamespaces": ["monitoring"]},
        "preflight": {"enabled": None, "strict": False, "image": duplex.IMAGE},
    },
    "kvTransfer": {
        "connector": "NixlConnector",
        "backend": None,
        "bufferDevice": None,
        "bidirectional": True,
        "decodeBlocksTTL": 480,
        "recomputeThreshold": 64,
        "recomputeCalibration": {
            "initial": 64,
            "minTokens": 16,
            "maxTokens": 8192,
            "margin": 0.25,
            "minIntervalSeconds": 600,
            "minSamples": 16,
        },
        "leaseDuration": 30,
        "loadFailurePolicy": "recompute",
        "sideChannelPort": 5600,
        "allowDecodeTPBelowPrefill": False,
    },
    "router": {
        "replicas": 1,
        "image": duplex.IMAGE,
        "cpu": "1",
        "memory": "3Gi",
        "service": {"type": "ClusterIP", "port": 8000, "annotations": {}},
        "conversation": {
            "keying": "both",
            "sessionHeaders": ["X-Claude-Code-Session-Id"],
            "bodyField": "conversation_id",
            "header": "X-Conversation-Id",
            "tenantHeader": "Authorization",
            "ttl": None,
        },
        "store": {"type": "memory", "maxEntries": 1_000_000, "redis": None},
        "nodeSelector": {},
        "tolerations": [],
        "maxBodyBytes": 8 * 1024 * 1024,
        "limits": {
            "maxConnections": 4096,
            "maxConnectionsPerSource": 1024,
            "maxInflightRequests": 512,
            "headTimeout": 10,
            "bodyTimeout": 60,
            "idleTimeout": 75,
            "replayPrefillTimeout": 30,
        },
        "clientKeysSecret": None,
        "gateway": None,
        "receipts": True,
        "canary": {"enabled": True, "promptWords": None},
        "inferencePool": {"enabled": False, "endpointPicker": None},
    },
    "autoscaling": {
        "targetSaturation": 0.75,
        "ttftP90Seconds": None,
        "prefillPerDecode": {"min": None, "max": None},
        "scaleDownSeconds": 300,
        "dryRun": False,
    },
    "tracing": {"endpoint": None, "sampleRatio": 1.0, "engines": True},
}


def _models_in(annotation: Any) -> list[tuple[type[BaseModel], bool]]:
    """(model class, inside a list) for every model an annotation refers to."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [(annotation, False)]
    origin = typing.get_origin(annotation)
    found = []
    for arg in typing.get_args(annotation):
        for cls, in_list in _models_in(arg):
            found.append((cls, in_list or origin is list))
    return found


def model_paths(
    cls: type[BaseModel] = DisaggregatedServingSpec, path: tuple[Any, ...] = ()
) -> Iterator[tuple[tuple[Any, ...], type[BaseModel]]]:
    """Every place in a spec document where an API model (not a pass-through Kubernetes object) sits."""
    yield path, cls
    for name, field in cls.model_fields.items():
        alias = field.alias or name
        for sub, in_list in _models_in(field.annotation):
            yield from model_paths(sub, path + ((alias, 0) if in_list else (alias,)))


def get_in(d: Any, path: tuple[Any, ...]) -> Any:
    for p in path:
        d = d[p]
    return d


def fmt(path: tuple[Any, ...]) -> str:
    return "spec" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path)


def field_paths(cls: type[BaseModel] = DisaggregatedServingSpec, prefix: str = "") -> set[str]:
    out = set()
    for name, field in cls.model_fields.items():
        path = prefix + (field.alias or name)
        out.add(path)
        for sub, in_list in _models_in(field.annotation):
            out |= field_paths(sub, path + ("[]." if in_list else "."))
    return out


ALLOW_TP = {"kvTransfer": {"allowDecodeTPBelowPrefill": True}}
REDIS = {"router": {"store": {"type": "redis", "redis": {"url": "redis://r:6379"}}}}

# (field path, too low, lowest accepted, highest accepted, too high, patch making the accepted values valid)
BOUNDS: list[tuple[str, Any, Any, Any, Any, dict[str, Any]]] = [
    ("prefill.replicas", -1, 0, 1000, 1001, {}),
    ("decode.replicas", -1, 0, 1000, 1001, {}),
    ("prefill.tensorParallelSize", 0, 1, 64, 65, ALLOW_TP),
    ("decode.tensorParallelSize", 0, 1, 64, 65, {}),
    ("prefill.accelerator.count", 0, 1, 64, 65, {}),
    ("decode.accelerator.count", 0, 1, 64, 65, {}),
    ("prefill.gpuMemoryUtilization", 0, 0.01, 1, 1.01, {}),
    ("decode.gpuMemoryUtilization", -0.5, 0.01, 1, 1.5, {}),
    ("prefill.maxNumSeqs", 0, 1, 65536, 65537, {}),
    ("decode.maxNumBatchedTokens", 0, 1, 16_777_216, 16_777_217, {}),
    ("prefill.rollout.maxSurge", -1, 0, 100, 101, {"prefill": {"rollout": {"maxUnavailable": 1}}}),
    ("decode.rollout.maxUnavailable", -1, 0, 100, 101, {}),
    ("prefill.rollout.progressDeadlineSeconds", 9, 10, 86_400, 86_401, {}),
    ("model.maxModelLen", 0, 1, 16_777_216, 16_777_217, {}),
    ("network.efa.devicesPerPod", 0, 1, 64, 65, {}),
    ("kvTransfer.decodeBlocksTTL", 59, 60, 86400, 86401, {}),
    # kvTransfer.recomputeThreshold is an int-or-string: its bounds are a CEL rule (test_crd VIOLATIONS)
    ("kvTransfer.leaseDuration", 5, 6, 3600, 3601, {}),
    ("kvTransfer.sideChannelPort", 1023, 1024, 65535, 65536, {}),
    ("router.replicas", -1, 0, 100, 101, REDIS),
    ("router.service.port", 0, 1, 65535, 65536, {}),
    ("router.conversation.ttl", 0, 1, 86399, 86401, {"kvTransfer": {"decodeBlocksTTL": 86400}}),
    ("router.store.maxEntries", 0, 1, 100_000_000, 100_000_001, {}),
    ("router.maxBodyBytes", 1023, 1024, 1024**3, 1024**3 + 1, {}),
]


ENUMS: list[tuple[str, Any, list[Any]]] = [
    ("model.imagePullPolicy", "Sometimes", ["Always", "IfNotPresent", "Never"]),
    ("model.dtype", "int8", ["auto", "half", "float16", "bfloat16", "float", "float32"]),
    ("model.blockSize", 24, [1, 8, 16, 32, 64, 128]),
    ("prefill.accelerator.type", "amd.com/gpu", ["nvidia.com/gpu"]),  # Neuron needs decode on Neuron too
    ("decode.accelerator.type", "amd.com/gpu", ["nvidia.com/gpu"]),
    ("kvTransfer.connector", "LMCacheConnectorV1", ["NixlConnector"]),
    ("kvTransfer.backend", "GDS", ["UCX", "LIBFABRIC"]),
    ("kvTransfer.bufferDevice", "xpu", ["cuda", "cpu"]),
    ("kvTransfer.loadFailurePolicy", "retry", ["recompute", "fail"]),
    ("router.service.type", "ExternalName", ["ClusterIP", "NodePort", "LoadBalancer"]),
    ("router.store.type", "etcd", ["memory"]),
]

# router.memory also has a 256Mi minimum (test_router_memory_minimum), so it is not among the free-form quantities.
QUANTITIES = ["prefill.cpu", "decode.memory", "network.efa.hugepages2Mi", "network.efa.shmSize", "router.cpu"]
