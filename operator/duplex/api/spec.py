"""spec of a DisaggregatedServing: model, prefill and decode roles, network (EFA), KV transfer, router.

Field descriptions become the CRD's `kubectl explain` text; defaults become schema defaults.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Final, Literal

from pydantic import ConfigDict, Field
from pydantic.alias_generators import to_camel

from duplex import IMAGE
from duplex.api.owned_args import owned_arg_rules
from duplex.api.pairing import paired_rules
from duplex.api.quantity import quantity
from duplex.api.rules import Checked, Rule
from duplex_sidecars.router.config import (
    ENGINE_BLOCKS_TTL_SECONDS,
    MAX_BODY_BYTES,
    TTL_MARGIN_SECONDS,
    ttl_below_engines,
)

# Kubernetes-native structures (tolerations, affinity, ...) are passed through as-is; the API server validates them.
K8sObject = Annotated[dict[str, Any], Field(json_schema_extra={"x-kubernetes-preserve-unknown-fields": True})]
Quantity = Annotated[
    str,
    Field(pattern=r"^[0-9]+(\.[0-9]+)?(m|k|Ki|Mi|Gi|Ti|Pi|M|G|T|P)?$", max_length=32),
]
Name = Annotated[str, Field(min_length=1, max_length=253)]
ExtraArgs = Annotated[list[Annotated[str, Field(max_length=1024)]], Field(max_length=64)]

GPU: Final = "nvidia.com/gpu"
NEURON: Final = "aws.amazon.com/neuron"
CPU: Final = "cpu"


class Model(Checked):
    model_config = ConfigDict(alias_generator=to_camel)


class SecretKeyRef(Model):
    """A key of a Secret in the same namespace."""

    name: Name = Field(description="Secret name.")
    key: Name = Field(description="Key within the Secret.")


class EnvVar(Model):
    """An environment variable: a literal value or a Kubernetes valueFrom source."""

    RULES = (
        Rule(
            cel="!(has(self.value) && has(self.valueFrom))",
            message="env: set value or valueFrom, not both",
            holds=lambda e: not (e.value is not None and e.value_from is not None),
        ),
    )

    name: Annotated[str, Field(min_length=1, max_length=256, pattern=r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")] = Field(
        description="Variable name; overrides a variable duplex sets with the same name."
    )
    value: str | None = Field(None, description="Literal value.")
    value_from: K8sObject | None = Field(None, description="A Kubernetes EnvVarSource (secretKeyRef, fieldRef, ...).")


EnvList = Annotated[list[EnvVar], Field(max_length=128)]


class PVCSource(Model):
    claim_name: Name = Field(description="PersistentVolumeClaim holding the model weights/cache.")
    read_only: bool = Field(True, description="Mount the claim read-only.")


class HostPathSource(Model):
    path: Annotated[str, Field(min_length=1, max_length=4096, pattern=r"^/")] = Field(
        description="Node directory with the model weights/cache (e.g. a RAID0 instance store)."
    )


class ModelCache(Model):
    """Where the engines find model weights. Exactly one of pvc or hostPath."""

    RULES = (
        Rule(
            cel="has(self.pvc) != has(self.hostPath)",
            message="model.cache needs exactly one of pvc or hostPath",
            holds=lambda c: (c.pvc is None) != (c.host_path is None),
        ),
    )

    pvc: PVCSource | None = Field(None, description="Mount a PersistentVolumeClaim.")
    host_path: HostPathSource | None = Field(None, description="Mount a node directory.")
    mount_path: Annotated[str, Field(pattern=r"^/", max_length=4096)] = Field(
        "/models", description="Where the cache is mounted in engine containers; HF_HOME points here."
    )


class ModelSpec(Model):
    """The model the engines serve and how they load it."""

    RULES = owned_arg_rules(role=None)

    name: Annotated[str, Field(min_length=1, max_length=1024)] = Field(
        description="Hugging Face model id or a path inside the model cache (vllm serve's model argument)."
    )
    served_model_name: Annotated[str, Field(min_length=1, max_length=256)] | None = Field(
        None, description="Name clients send in `model`; defaults to name."
    )
    image: Annotated[str, Field(min_length=1, max_length=1024)] = Field(
        "vllm/vllm-openai:v0.33.0", description="vLLM engine image (with NIXL, and the EFA libraries when EFA is on)."
    )
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = Field(
        "IfNotPresent", description="Pull policy of the engine image."
    )
    dtype: Literal["auto", "half", "float16", "bfloat16", "float", "float32"] = Field(
        "auto", description="vLLM --dtype."
    )
    max_model_len: int | None = Field(None, ge=1, le=16_777_216, description="vLLM --max-model-len (tokens).")
    block_size: Literal[1, 8, 16, 32, 64, 128] = Field(
        16, description="KV cache block size in tokens; prefill and decode always share it."
    )
    hf_token_secret: SecretKeyRef | None = Field(
        None, description="Secret key holding a Hugging Face token (HF_TOKEN)."
    )
    cache: ModelCache | None = Field(None, description="Volume with model weights/cache.")
    tool_call_parser: Annotated[str, Field(pattern=r"^[a-z0-9_]+$", max_length=64)] | None = Field(
        None,
        description="vLLM --tool-call-parser (e.g. hermes), with --enable-auto-tool-choice: without it the engines "
        "refuse requests with tools and the default tool_choice auto, which agentic clients send.",
    )
    reasoning_parser: Annotated[str, Field(pattern=r"^[a-z0-9_]+$", max_length=64)] | None = Field(
        None, description="vLLM --reasoning-parser (e.g. qwen3)."
    )
    env: EnvList = Field(default_factory=list, description="Extra environment for both roles' engines.")
    extra_args: ExtraArgs = Field(
        default_factory=list,
        description="Extra vLLM arguments for both roles. Flags duplex owns are rejected; use their typed fields.",
    )


class Accelerator(Model):
    type: Literal["nvidia.com/gpu", "aws.amazon.com/neuron", "cpu"] = Field(
        GPU,
        description="Device-plugin resource of the accelerator, or cpu: vLLM's CPU build on CPU nodes, for small "
        "models (KV in host memory, moved over UCX).",
    )
    count: int | None = Field(
        None,
        ge=1,
        le=64,
        description="Devices per pod; defaults to tensorParallelSize (GPU; tensorParallelSize x pipelineParallelSize "
        "/ nodesPerInstance when those are set) or TP/2 rounded up (Neuron). Not with cpu.",
    )
    kv_cache_gib: int | None = Field(
        None,
        alias="kvCacheGiB",
        ge=1,
        le=4096,
        description="cpu only: GiB of host memory for the KV cache (vLLM's VLLM_CPU_KVCACHE_SPACE; the CPU platform "
        "ignores gpuMemoryUtilization); default 4. Counts against the role's memory.",
    )

    RULES = (
        Rule(
            cel="self.type == 'cpu' || (!has(self.kvCacheGiB))",
            message="accelerator.kvCacheGiB is for type cpu (GPU and Neuron size the KV cache by gpuMemoryUtilization)",
            holds=lambda a: a.type == CPU or a.kv_cache_gib is None,
        ),
        Rule(
            cel="self.type != 'cpu' || !has(self.count)",
            message="accelerator.count is for devices: a cpu engine takes the role's cpu request",
            holds=lambda a: a.type != CPU or a.count is None,
        ),
    )


class RolloutSpec(Model):
    max_surge: int = Field(1, ge=0, le=100, description="Extra pods allowed during a roll (needs spare nodes).")
    max_unavailable: int = Field(0, ge=0, le=100, description="Pods that may be down during a roll.")
    progress_deadline_seconds: int = Field(
        600,
        ge=10,
        le=86_400,
        description=(
            "How long a roll or a first start may go without progress before the role counts as failed (Degraded in "
            "Argo CD) rather than starting (the Deployment's progressDeadlineSeconds). Loading a large model can "
            "take longer than the default."
        ),
    )

    RULES = (
        Rule(
            cel="self.maxSurge + self.maxUnavailable > 0",
            message="rollout needs maxSurge or maxUnavailable above 0",
            holds=lambda r: r.max_surge + r.max_unavailable > 0,
        ),
    )


class ScalingSpec(Model):
    """Who writes the role's replicas: exactly one writer, so that no two controllers undo each other."""

    RULES = (
        Rule(
            cel="self.minReplicas <= self.maxReplicas",
            message="scaling.minReplicas must not be above scaling.maxReplicas",
            holds=lambda s: s.min_replicas <= s.max_replicas,
        ),
    )

    mode: Literal["Fixed", "External", "Automatic"] = Field(
        "Fixed",
        description="Fixed: the operator keeps the role's workload (its Deployment, or the LeaderWorkerSet of a role "
        "whose instances span nodes) at `replicas` and sets it back if anyone else changes it (an Event says so). "
        "External: something else (a HorizontalPodAutoscaler, a KEDA ScaledObject, kubectl scale) owns the "
        "workload's replicas through its scale subresource; the operator creates the workload with `replicas`, then "
        "never writes them, and hands its ownership of the field over without changing the value, so that switching "
        "modes scales nothing. Automatic: the operator's planner sets them from the routers' measurements, between "
        "minReplicas and maxReplicas (spec.autoscaling). Replicas count instances: pods, or groups of "
        "nodesPerInstance pods.",
    )
    min_replicas: int = Field(1, ge=0, le=1000, description="Automatic: the fewest instances the planner keeps.")
    max_replicas: int = Field(8, ge=1, le=1000, description="Automatic: the most instances the planner asks for.")

    def bound(self, replicas: int) -> int:
        """`replicas` within minReplicas..maxReplicas."""
        return min(max(replicas, self.min_replicas), self.max_replicas)


class RatioSpec(Model):
    RULES = (
        Rule(
            cel="!has(self.min) || !has(self.max) || self.min <= self.max",
            message="autoscaling.prefillPerDecode.min must not be above its max",
            holds=lambda r: r.min is None or r.max is None or r.min <= r.max,
        ),
    )

    min: float | None = Field(None, gt=0, le=64, description="The fewest prefill pods per decode pod.")
    max: float | None = Field(None, gt=0, le=64, description="The most prefill pods per decode pod.")


class AutoscalingSpec(Model):
    """The planner of roles in scaling.mode Automatic: each role is sized so that its saturation (legs in flight over
    what its engines run at once, as the routers measure it over the last minute) meets the target; prefill grows
    too while the time to first token misses its objective. Up at once, down only after a stable window."""

    target_saturation: float = Field(
        0.75,
        gt=0,
        le=4,
        description="Saturation each role is sized for (needs the role's maxNumSeqs, which sets what an engine runs "
        "at once).",
    )
    ttft_p90_seconds: float | None = Field(
        None, gt=0, le=3600, description="Objective for the routers' time to first token, 90th percentile."
    )
    prefill_per_decode: RatioSpec = Field(
        default_factory=RatioSpec, description="Bounds on prefill pods per decode pod: the smaller role is raised."
    )
    scale_down_seconds: int = Field(
        300,
        ge=0,
        le=86_400,
        description="A role shrinks only after its recommendation has stayed below its size this long, and then to "
        "the highest recommendation of that window (a decode pod leaving drains for minutes: do not flap).",
    )
    dry_run: bool = Field(
        False, description="Compute and report each decision (status.autoscaling, Events) without scaling."
    )


class RoleSpec(Model):
    """One engine role (prefill or decode)."""

    replicas: int = Field(
        1,
        ge=0,
        le=1000,
        description="Engine instances of this role (a pod each, or nodesPerInstance pods). With scaling.mode "
        "External: the size the role starts at.",
    )
    scaling: ScalingSpec = Field(default_factory=ScalingSpec, description="Who writes this role's replicas.")

    def starting_replicas(self) -> int:
        """The size the role's workload is created with: `replicas`, within the planner's bounds when Automatic."""
        return self.scaling.bound(self.replicas) if self.scaling.mode == "Automatic" else self.replicas

    tensor_parallel_size: int = Field(1, ge=1, le=64, description="vLLM --tensor-parallel-size.")
    pipeline_parallel_size: int = Field(
        1,
        ge=1,
        le=16,
        description="vLLM --pipeline-parallel-size. Across nodes, vLLM's documented shape is tensorParallelSize the "
        "devices of one node and pipelineParallelSize the nodes (tensorParallelSize across nodes works too).",
    )
    nodes_per_instance: int = Field(
        1,
        ge=1,
        le=16,
        description="Nodes one engine instance spans. Above 1 the role is a LeaderWorkerSet "
        "(leaderworkerset.x-k8s.io/v1; its CRD must be installed) of `replicas` groups, one pod per node; the "
        "leader serves HTTP and the NIXL handshake of every rank, and only leaders are behind the role's Service. "
        "accelerator.count x nodesPerInstance must equal tensorParallelSize x pipelineParallelSize.",
    )
    instance_topology_key: Annotated[str, Field(min_length=1, max_length=317)] | None = Field(
        None,
        description="nodesPerInstance above 1: a node label whose value all nodes of an instance share, e.g. "
        "topology.k8s.aws/network-node-layer-3 (one EFA spine). LWS's exclusive-topology: each instance gets a "
        "domain of its own (no two instances in one domain).",
    )
    accelerator: Accelerator = Field(default_factory=Accelerator, description="Accelerator resource per pod.")
    cpu: Quantity | None = Field(None, description="CPU request and limit per pod.")
    memory: Quantity | None = Field(None, description="Memory request and limit per pod.")
    gpu_memory_utilization: float = Field(0.9, gt=0, le=1, description="vLLM --gpu-memory-utilization.")
    enable_prefix_caching: bool = Field(True, description="vLLM prefix caching (keep on in production).")
    max_num_seqs: int | None = Field(None, ge=1, le=65536, description="vLLM --max-num-seqs.")
    max_num_batched_tokens: int | None = Field(None, ge=1, le=16_777_216, description="vLLM --max-num-batched-tokens.")
    node_selector: dict[str, Annotated[str, Field(max_length=63)]] = Field(
        default_factory=dict, description="Extra node labels the pods require (e.g. instance type)."
    )
    tolerations: Annotated[list[K8sObject], Field(max_length=32)] = Field(
        default_factory=list,
        description="Extra tolerations (the accelerator taint is tolerated automatically); only of the taint keys the "
        "operator's policy allows (chart value policy.allowedTolerationKeys).",
    )
    affinity: K8sObject | None = Field(None, description="Kubernetes affinity, merged with EFA co-placement.")
    topology_spread_constraints: Annotated[list[K8sObject], Field(max_length=16)] = Field(
        default_factory=list, description="Kubernetes topologySpreadConstraints."
    )
    priority_class_name: Annotated[str, Field(max_length=253)] | None = Field(None, description="PriorityClass.")
    rollout: RolloutSpec = Field(default_factory=RolloutSpec, description="Rolling update bounds.")
    env: EnvList = Field(default_factory=list, description="Extra environment for this role's engines.")
    extra_args: ExtraArgs = Field(
        default_factory=list,
        description="Extra vLLM arguments for this role. Flags duplex owns are rejected; use their typed fields.",
    )


def _automatic_rules(role: str) -> tuple[Rule, ...]:
    return (
        Rule(
            cel="self.scaling.mode != 'Automatic' || has(self.maxNumSeqs)",
            message=f"{role}.scaling.mode Automatic needs {role}.maxNumSeqs: it is what an engine runs at once, "
            "which the routers measure saturation against",
            holds=lambda r: r.scaling.mode != "Automatic" or r.max_num_seqs is not None,
        ),
    )


def _ranks(r: RoleSpec) -> int:
    return r.tensor_parallel_size * r.pipeline_parallel_size


_ONE_RANK_PER_DEVICE = "an instance runs one rank per GPU, the same number on every node"


def _multinode_rules(role: str) -> tuple[Rule, ...]:
    return (
        Rule(
            cel="self.nodesPerInstance == 1 || self.accelerator.type == 'nvidia.com/gpu'",
            message=f"{role}.nodesPerInstance above 1 needs accelerator.type nvidia.com/gpu: vLLM's multi-node "
            "launch spans GPU nodes",
            holds=lambda r: r.nodes_per_instance == 1 or r.accelerator.type == GPU,
        ),
        # One node without a pipeline is a single-node engine as before: accelerator.count may exceed its ranks.
        Rule(
            cel="self.accelerator.type != 'nvidia.com/gpu' || !has(self.accelerator.count) || "
            "(self.nodesPerInstance == 1 && self.pipelineParallelSize == 1) || "
            "self.accelerator.count * self.nodesPerInstance == self.tensorParallelSize * self.pipelineParallelSize",
            message=f"{role}.accelerator.count x nodesPerInstance must equal tensorParallelSize x "
            f"pipelineParallelSize: {_ONE_RANK_PER_DEVICE}",
            holds=lambda r: (
                r.accelerator.type != GPU
                or r.accelerator.count is None
                or (r.nodes_per_instance == 1 and r.pipeline_parallel_size == 1)
                or r.accelerator.count * r.nodes_per_instance == _ranks(r)
            ),
        ),
        Rule(
            cel="self.accelerator.type != 'nvidia.com/gpu' || has(self.accelerator.count) || "
            "self.tensorParallelSize * self.pipelineParallelSize % self.nodesPerInstance == 0",
            message=f"{role}.tensorParallelSize x pipelineParallelSize must be a multiple of nodesPerInstance: "
            f"{_ONE_RANK_PER_DEVICE} (accelerator.count defaults to the quotient)",
            holds=lambda r: (
                r.accelerator.type != GPU or r.accelerator.count is not None or _ranks(r) % r.nodes_per_instance == 0
            ),
        ),
        Rule(
            cel="!has(self.instanceTopologyKey) || self.nodesPerInstance > 1",
            message=f"{role}.instanceTopologyKey is for nodesPerInstance above 1",
            holds=lambda r: r.instance_topology_key is None or r.nodes_per_instance > 1,
        ),
    )


class PrefillDrainSpec(Model):
    """What happens when the last prefill pod new turns can use goes away (a node drain or an eviction of a single
    prefill): it keeps taking turns until a replacement serves, so that no request finds no prefill."""

    deadline_seconds: int = Field(
        600,
        ge=0,
        le=86_400,
        description="The most a terminating prefill pod waits, in its preStop hook, while no other prefill pod of "
        "its KV revision serves: it takes new turns meanwhile (the routers use it only when nothing else is left) and "
        "ends as soon as another serves. A rollout's new pod is Ready before the old one goes, so it never waits "
        "then. The default leaves a replacement time to load a large model. 0: no wait.",
    )


class PrefillSpec(RoleSpec):
    RULES = owned_arg_rules(role="prefill") + paired_rules() + _automatic_rules("prefill") + _multinode_rules("prefill")

    drain: PrefillDrainSpec = Field(
        default_factory=PrefillDrainSpec, description="A terminating prefill pod that is the last one serving."
    )


class DrainSpec(Model):
    """What happens to the conversations bound to a decode pod that is going away (rollout, scale-in, node drain,
    eviction): the pod takes no new turns, and each bound conversation's next turn reads its blocks from it once and
    binds to another decode pod."""

    deadline_seconds: int | None = Field(
        None,
        ge=0,
        le=86_400,
        description="The most a terminating decode pod waits, in its preStop hook, until no conversation is bound to "
        "it (it ends as soon as none is). Default: kvTransfer.decodeBlocksTTL, after which the pod holds no blocks "
        "(and the router's TTL is below it). "
        "0: no wait (bound conversations recompute their next turn). The pod's grace period is this plus the "
        "engine's shutdown time.",
    )
    active_seconds: int = Field(
        120,
        ge=0,
        le=86_400,
        description="A binding stored within this many seconds is a conversation still going, which the pod waits "
        "for; older ones are taken as finished (agents that stop leave their last binding behind until the TTL). "
        "The default is well past the gap between an agent's turns in coding-agent traces (p90 24 s), and bounds "
        "a drain to about this long after the pod's last active turn.",
    )


class DecodeSpec(RoleSpec):
    RULES = owned_arg_rules(role="decode") + paired_rules() + _automatic_rules("decode") + _multinode_rules("decode")

    drain: DrainSpec = Field(
        default_factory=DrainSpec, description="Conversation-aware draining of decode pods that are going away."
    )


class EFASpec(Model):
    """AWS Elastic Fabric Adapter: one switch derives resources, hugepages, IPC_LOCK, /dev/shm, FI_* env and LIBFABRIC."""

    enabled: bool = Field(False, description="Attach EFA devices and use NIXL's LIBFABRIC backend.")
    devices_per_pod: int = Field(
        16, ge=1, le=64, description="vpc.amazonaws.com/efa per pod (p5en.48xlarge: 16; p5.48xlarge: 32; trn2: 16)."
    )
    hugepages2_mi: Quantity = Field("5120Mi", alias="hugepages2Mi", description="hugepages-2Mi per pod.")
    shm_size: Quantity = Field("64Gi", description="Size of the in-memory /dev/shm volume.")
    privileged: bool = Field(
        False, description="Run engines privileged (some drivers need it for fi_mr_reg of device memory)."
    )
    fork_safe: bool = Field(True, description="FI_EFA_FORK_SAFE.")
    library_path: Annotated[str, Field(max_length=4096)] = Field(
        "/opt/amazon/efa/lib:/opt/amazon/efa/lib64", description="Prepended to LD_LIBRARY_PATH."
    )
    same_zone: bool = Field(True, description="Require prefill and decode pods in one availability zone.")


NamespaceName = Annotated[str, Field(min_length=1, max_length=63, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")]


class NetworkPolicySpec(Model):
    """NetworkPolicies that leave the engines reachable only by this serving's router (HTTP) and by each other (NIXL).

    EFA traffic (SRD) bypasses the kernel network stack, so no NetworkPolicy sees it: the EFA security group
    bounds it instead."""

    enabled: bool = Field(True, description="Render the NetworkPolicies (needs a CNI that enforces them).")
    metrics_namespaces: Annotated[list[NamespaceName], Field(max_length=32)] = Field(
        ["monitoring"],
        description="Namespaces whose pods (e.g. Prometheus') may reach the engines' HTTP port, where vLLM serves "
        "/metrics (every other path needs the engine API key), and the router's admin port (its /metrics and "
        "/ready's detail). [] leaves the engines to the router and the admin port to kubelet.",
    )


class PreflightSpec(Model):
    """`duplex preflight` as an init container of engine pods: it proves the fabric before vLLM starts (EFA devices,
    libfabric's efa provider, hugepages, memlock, fabric env, NIXL backend and a loopback READ); the result becomes
    the FabricReady condition."""

    enabled: bool | None = Field(
        None, description="Run the preflight init container; default: when network.efa.enabled."
    )
    strict: bool = Field(False, description="Warnings fail the engine pod too (duplex preflight --strict).")
    image: Annotated[str, Field(min_length=1, max_length=1024)] = Field(
        IMAGE,
        description="duplex image that hands the preflight package to the engine image; apart from router.image "
        "so that rolling the router leaves engines alone (changing this rolls them once).",
    )


class NetworkSpec(Model):
    efa: EFASpec = Field(default_factory=EFASpec, description="EFA settings.")
    preflight: PreflightSpec = Field(default_factory=PreflightSpec, description="Fabric checks before engines start.")
    network_policy: NetworkPolicySpec = Field(
        default_factory=NetworkPolicySpec, description="Who may reach the engines and the router."
    )


AUTO: Final = "Auto"
MAX_THRESHOLD: Final = 1_048_576


class RecomputeCalibrationSpec(Model):
    """recomputeThreshold: Auto. The router fits what a computed and a read token cost from its prefill legs; the
    operator takes the break-even, within [minTokens, maxTokens], and changes the router's threshold only when it
    moved by more than `margin`, at most once per `minIntervalSeconds`. The engines keep minTokens."""

    RULES = (
        Rule(
            cel="self.minTokens <= self.initial && self.initial <= self.maxTokens",
            message="kvTransfer.recomputeCalibration needs minTokens <= initial <= maxTokens",
            holds=lambda c: c.min_tokens <= c.initial <= c.max_tokens,
        ),
    )

    initial: int = Field(64, ge=0, le=MAX_THRESHOLD, description="The threshold until the first measurement.")
    min_tokens: int = Field(
        16, ge=0, le=MAX_THRESHOLD, description="Lowest threshold; also the engines' kv_recompute_threshold."
    )
    max_tokens: int = Field(
        8192, ge=0, le=MAX_THRESHOLD, description="Highest threshold; used when reading never pays (a token reads "
        "slower than it computes).",
    )  # fmt: skip
    margin: float = Field(0.25, ge=0.05, le=1.0, description="Relative change below which the threshold stays.")
    min_interval_seconds: int = Field(600, ge=60, le=86400, description="Least time between two changes.")
    min_samples: int = Field(
        16, ge=4, le=10000, description="Prefill legs of each kind (read, recompute) a measurement needs."
    )


class KVTransferSpec(Model):
    """NixlConnector settings shared by both roles (rendered into --kv-transfer-config)."""

    RULES = (
        Rule(
            cel="type(self.recomputeThreshold) == string ? self.recomputeThreshold == 'Auto' : "
            "(self.recomputeThreshold >= 0 && self.recomputeThreshold <= 1048576)",
            message="kvTransfer.recomputeThreshold must be Auto or a number of tokens from 0 to 1048576",
            holds=lambda k: (
                k.recompute_threshold == AUTO
                if isinstance(k.recompute_threshold, str)
                else 0 <= k.recompute_threshold <= MAX_THRESHOLD
            ),
            field_path=".recomputeThreshold",
        ),
        Rule(
            cel="self.sideChannelPort != 8000",
            message="kvTransfer.sideChannelPort must differ from 8000, the engines' HTTP port",
            holds=lambda k: k.side_channel_port != 8000,
        ),
    )

    connector: Literal["NixlConnector"] = Field("NixlConnector", description="vLLM KV connector.")
    backend: Literal["UCX", "LIBFABRIC"] | None = Field(
        None, description="NIXL backend; derived from network.efa (LIBFABRIC with EFA, else UCX) unless set."
    )
    buffer_device: Literal["cuda", "cpu"] | None = Field(
        None,
        description="kv_buffer_device; derived from the accelerator (cuda on GPU, cpu on Neuron and CPU) unless set.",
    )
    bidirectional: bool = Field(
        True,
        description="bidirectional_kv_xfer on both roles: decode keeps KV after generation; prefill reads it back.",
    )
    decode_blocks_ttl: int = Field(
        ENGINE_BLOCKS_TTL_SECONDS,
        ge=60,
        le=86400,
        alias="decodeBlocksTTL",
        description="decoder_kv_blocks_ttl: seconds decode keeps blocks.",
    )
    recompute_threshold: int | Annotated[str, Field(max_length=8)] = Field(
        64,
        description="Fewer reusable tokens than this are recomputed rather than read from decode (0: always read), "
        "applied by the router and rendered as the engines' kv_recompute_threshold. Auto: the break-even the router "
        "measures from its own prefill legs (kvTransfer.recomputeCalibration), applied without restarting engines.",
    )
    recompute_calibration: RecomputeCalibrationSpec = Field(
        default_factory=lambda: RecomputeCalibrationSpec(), description="How recomputeThreshold: Auto is found."
    )
    lease_duration: int = Field(30, ge=6, le=3600, description="kv_lease_duration: seconds of prefill's block lease.")
    load_failure_policy: Literal["recompute", "fail"] = Field(
        "recompute",
        description="kv_load_failure_policy on both roles: recompute a failed/declined read, or fail the request.",
    )
    side_channel_port: int = Field(5600, ge=1024, le=65535, description="VLLM_NIXL_SIDE_CHANNEL_PORT.")
    allow_decode_tp_below_prefill: bool = Field(
        False,
        alias="allowDecodeTPBelowPrefill",
        description="Allow decode TP < prefill TP (NixlConnector does not support it; only for patched builds).",
    )


class ServiceSpec(Model):
    type: Literal["ClusterIP", "NodePort", "LoadBalancer"] = Field("ClusterIP", description="Router Service type.")
    port: int = Field(8000, ge=1, le=65535, description="Router Service port.")
    annotations: dict[str, Annotated[str, Field(max_length=4096)]] = Field(
        default_factory=dict, description="Annotations (e.g. for the AWS load balancer controller)."
    )


class ConversationSpec(Model):
    """How the router identifies a conversation and how long it may replay decode's blocks."""

    RULES = (
        Rule(
            cel="self.keying != 'id' || self.bodyField != '' || self.header != ''",
            message="router.conversation.keying id needs bodyField or header to read the conversation id",
            holds=lambda c: c.keying != "id" or bool(c.body_field) or bool(c.header),
        ),
    )

    keying: Literal["id", "history", "both"] = Field(
        "both",
        description="How a turn finds decode's blocks from the previous turn: by the conversation id the client "
        "sends (id), by a digest of its history up to its last assistant turn (history: no client change needed), "
        "or by the id when there is one and the history otherwise (both).",
    )
    session_headers: Annotated[list[Annotated[str, Field(min_length=1, max_length=128)]], Field(max_length=8)] = Field(
        ["X-Claude-Code-Session-Id"],
        description="Headers of agent harnesses naming a session; they scope history-keyed state (a session holds "
        "several conversations, such as subagents, so it never names one).",
    )
    body_field: Annotated[str, Field(max_length=128)] = Field(
        "conversation_id",
        description="Top-level request body field with the conversation id (stripped before forwarding); '' disables.",
    )
    header: Annotated[str, Field(max_length=128)] = Field(
        "X-Conversation-Id", description="Request header with the conversation id; '' disables."
    )
    tenant_header: Annotated[str, Field(min_length=1, max_length=128)] = Field(
        "Authorization", description="Header whose digest scopes conversation state to a tenant."
    )
    ttl: int | None = Field(
        None,
        ge=1,
        le=86400,
        description="Seconds the router may replay decode's blocks; must be below kvTransfer.decodeBlocksTTL "
        f"(default: decodeBlocksTTL - {TTL_MARGIN_SECONDS}).",
    )


class RouterLimitsSpec(Model):
    """What one client can make a router hold. Each refusal is counted in duplex_router_rejected_requests_total."""

    max_connections: int = Field(4096, ge=1, le=1_000_000, description="Open client connections (one more: 503).")
    max_connections_per_source: int = Field(
        1024,
        ge=1,
        le=1_000_000,
        description="Open client connections from one address (one more: 503), so that one client leaves room for "
        "the rest. Behind a gateway whose few pods carry every client, raise it to maxConnections.",
    )
    max_inflight_requests: int = Field(
        512, ge=1, le=100_000, description="Completions served at once (one more: 503 with Retry-After)."
    )
    head_timeout: int = Field(10, ge=1, le=600, description="Seconds from a request's first byte to its head's end.")
    body_timeout: int = Field(60, ge=1, le=3600, description="Seconds from a request's head to its body's end.")
    idle_timeout: int = Field(75, ge=1, le=3600, description="Seconds a connection may stay silent.")
    replay_prefill_timeout: int = Field(
        30,
        ge=1,
        le=600,
        description="Seconds a prefill leg that reads decode's blocks may take before the router abandons the read "
        "and recomputes (vLLM 0.32 leaves a request whose read failed waiting for ever).",
    )


class RedisSpec(Model):
    RULES = (
        Rule(
            cel="has(self.url) != has(self.urlSecret)",
            message="router.store.redis needs exactly one of url or urlSecret",
            holds=lambda r: (r.url is None) != (r.url_secret is None),
        ),
        # The inline URL lands in the router's ConfigMap, readable by whoever may read ConfigMaps.
        Rule(
            cel="!has(self.url) || !self.url.matches('^rediss?://[^/]*@')",
            message="router.store.redis.url must not carry credentials (user:password@): put the URL in a Secret "
            "and name it in urlSecret",
            holds=lambda r: r.url is None or not re.match(r"^rediss?://[^/]*@", r.url),
        ),
    )

    url: Annotated[str, Field(pattern=r"^rediss?://", max_length=1024)] | None = Field(
        None, description="redis://host:port/db, without credentials (those go in urlSecret)"
    )
    url_secret: SecretKeyRef | None = Field(None, description="Secret key holding the Redis URL (with credentials).")


class StoreSpec(Model):
    RULES = (
        Rule(
            cel="self.type != 'redis' || has(self.redis)",
            message="router.store.type redis needs router.store.redis",
            holds=lambda s: s.type != "redis" or s.redis is not None,
        ),
    )

    type: Literal["memory", "redis"] = Field("memory", description="Conversation state store.")
    max_entries: int = Field(
        1_000_000,
        ge=1,
        le=100_000_000,
        description="Memory store bound in entries (it is also bounded in bytes by 60% of router.memory).",
    )
    redis: RedisSpec | None = Field(None, description="Redis connection (type redis).")


class CanarySpec(Model):
    """The router's canary: after each change of the healthy engines, a two-turn conversation checked against the
    engines' own counters (the DisaggregationVerified condition)."""

    enabled: bool = Field(True, description="Verify every new set of engines with a canary conversation.")
    prompt_words: int | None = Field(
        None,
        ge=16,
        le=8192,
        description="Words of the canary's first prompt; default: 200, or twice kvTransfer.recomputeThreshold "
        "when that is more (the replay must reach the threshold for prefill to read it).",
    )


def _router_memory_ok(r: RouterSpec) -> bool:
    return quantity(r.memory) >= quantity("256Mi")


class GatewaySpec(Model):
    """Gateways in front of the router that authenticate their own users: each holds a client key, and names the
    user of each request in a header; that user is the conversation's tenant, within the gateway's key."""

    keys: Annotated[list[Name], Field(min_length=1, max_length=16)] = Field(
        description="Names of the keys in router.clientKeysSecret that belong to gateways."
    )
    tenant_header: Annotated[str, Field(pattern=r"^[A-Za-z0-9-]+$", max_length=128)] = Field(
        "X-Duplex-Tenant",
        description="The header a gateway names its user in (at most 256 characters); a gateway request without it "
        "is refused (400). Other clients' copies of it are ignored.",
    )


ServiceName = Annotated[str, Field(min_length=1, max_length=63, pattern=r"^[a-z]([-a-z0-9]*[a-z0-9])?$")]


class EndpointPickerSpec(Model):
    """The Endpoint Picker (EPP) a Gateway asks which router pod takes each request: a Service of yours, in the
    serving's namespace. Its pick only balances the routers: they are no vLLM servers (their API port exports no vLLM
    metrics), and they still choose the engines."""

    name: ServiceName = Field(description="Name of the EPP's Service, in the serving's namespace.")
    port: int = Field(9002, ge=1, le=65535, description="Port of the EPP's Service (its ext-proc gRPC port).")
    failure_mode: Literal["FailOpen", "FailClose"] = Field(
        "FailOpen",
        description="When the EPP does not answer: FailOpen lets the Gateway pick a router itself (any router serves "
        "any conversation: replicated routers share the Redis store), FailClose drops the request.",
    )


class InferencePoolSpec(Model):
    """An InferencePool (Gateway API Inference Extension, inference.networking.k8s.io/v1) named <name>-router that
    selects the router pods, for Gateways whose HTTPRoutes name InferencePools as backends. An HTTPRoute to the
    router Service needs none of this."""

    enabled: bool = Field(
        False,
        description="Render the InferencePool (the extension's CRDs must be installed), and label engine pods "
        "llm-d.ai/role prefill or decode. Turning it on or off rolls the engines once, keeping their KV.",
    )
    endpoint_picker: EndpointPickerSpec | None = Field(
        None,
        description="The EPP the Gateway calls for the pool. Unset: the pool has no endpointPickerRef, which most "
        "Gateway implementations refuse (Accepted False, EndpointPickerRefMissing).",
    )


class RouterSpec(Model):
    RULES = (
        Rule(
            cel="quantity(self.memory).compareTo(quantity('256Mi')) >= 0",
            message="router.memory must be at least 256Mi (the conversation store takes 60% of it)",
            holds=_router_memory_ok,
        ),
        Rule(
            cel="self.replicas <= 1 || self.store.type == 'redis'",
            message="router.replicas above 1 needs router.store.type redis, so that replicas share conversation state",
            holds=lambda r: r.replicas <= 1 or r.store.type == "redis",
        ),
        Rule(
            cel="!has(self.gateway) || has(self.clientKeysSecret)",
            message="router.gateway needs router.clientKeysSecret: a gateway is known by its client key",
            holds=lambda r: r.gateway is None or r.client_keys_secret is not None,
        ),
    )

    replicas: int = Field(1, ge=0, le=100, description="Router pods.")
    image: Annotated[str, Field(min_length=1, max_length=1024)] = Field(
        IMAGE, description="duplex image (runs `duplex router`)."
    )
    cpu: Quantity = Field("1", description="CPU request and limit.")
    memory: Quantity = Field(
        "3Gi",
        description="Memory request and limit. The in-memory conversation store may fill 60% of it "
        "(about 1M conversations with 32k-token histories at 3Gi).",
    )
    service: ServiceSpec = Field(default_factory=ServiceSpec, description="Router Service.")
    conversation: ConversationSpec = Field(
        default_factory=ConversationSpec, description="Conversation identity and TTL."
    )
    store: StoreSpec = Field(default_factory=StoreSpec, description="Conversation state store.")
    node_selector: dict[str, Annotated[str, Field(max_length=63)]] = Field(
        default_factory=dict, description="Node labels router pods require (routers need no accelerator)."
    )
    tolerations: Annotated[list[K8sObject], Field(max_length=32)] = Field(
        default_factory=list, description="Kubernetes tolerations of router pods."
    )
    max_body_bytes: int = Field(
        MAX_BODY_BYTES,
        ge=1024,
        le=1024**3,
        description="Largest accepted request body (default 8 MiB: four times a 128k-token agent history). Bodies "
        "held at once are bounded too, by a tenth of router.memory (at least one such body).",
    )
    limits: RouterLimitsSpec = Field(default_factory=RouterLimitsSpec, description="Client limits and deadlines.")
    client_keys_secret: Name | None = Field(
        None,
        description="A Secret of client API keys in the serving's namespace, one key per tenant (the key's name is "
        "the tenant, its value the API key). When set, completions and /v1/models need a known key (Authorization: "
        "Bearer, or x-api-key), checked as soon as a request's head is in, and a conversation's tenant is its key's "
        "name. Keys added, removed or rotated in the Secret apply without a restart. Unset: clients are not "
        "authenticated, and those without Authorization share one anonymous tenant.",
    )
    gateway: GatewaySpec | None = Field(
        None, description="Trusted gateways among the client keys (unset: every key is a tenant of its own)."
    )
    receipts: bool = Field(
        True,
        description="A Server-Timing receipt on every answer: the router's, prefill's and decode's time to the first "
        "byte and whether the turn read decode's KV back (or why not). It names no engine or address, and the "
        "anonymous tenant's misses carry no reason.",
    )
    canary: CanarySpec = Field(default_factory=CanarySpec, description="Verified disaggregation after each rollout.")
    inference_pool: InferencePoolSpec = Field(
        default_factory=InferencePoolSpec, description="An InferencePool of the router pods, for a Gateway in front."
    )


def _decode_tp_ok(s: DisaggregatedServingSpec) -> bool:
    return (
        s.decode.tensor_parallel_size >= s.prefill.tensor_parallel_size or s.kv_transfer.allow_decode_tp_below_prefill
    )


def _router_ttl_ok(s: DisaggregatedServingSpec) -> bool:
    ttl = s.router.conversation.ttl
    return ttl is None or ttl_below_engines(ttl, s.kv_transfer.decode_blocks_ttl)


class TracingSpec(Model):
    """OpenTelemetry traces: the routers' spans (a request, each leg, the reuse verdict) and the engines' own, joined
    into one trace per request by the W3C traceparent the router sends each leg."""

    endpoint: str | None = Field(
        None,
        pattern=r"^https?://[^\s/]+(/\S*)?$",
        description="OTLP/HTTP base URL of a trace collector, e.g. http://otel-collector.observability:4318; spans "
        "go to <endpoint>/v1/traces. Unset: nothing is traced.",
    )
    sample_ratio: float = Field(
        1.0,
        ge=0,
        le=1,
        description="Share of requests the routers trace, by trace id; a request whose client sent a traceparent "
        "follows the client's decision. The engines follow the router's.",
    )
    engines: bool = Field(
        True,
        description="Also render vLLM's --otlp-traces-endpoint on the engine pods (their image must hold vLLM's "
        "OpenTelemetry packages). Changing it rolls the engines, KV-compatibly.",
    )


class DisaggregatedServingSpec(Model):
    """Desired state of a prefill-decode disaggregated vLLM deployment with bidirectional KV transfer."""

    RULES = (
        Rule(
            cel="self.decode.tensorParallelSize >= self.prefill.tensorParallelSize || "
            "self.kvTransfer.allowDecodeTPBelowPrefill",
            message="decode.tensorParallelSize must be >= prefill.tensorParallelSize (NixlConnector limitation); "
            "set kvTransfer.allowDecodeTPBelowPrefill to override",
            holds=_decode_tp_ok,
        ),
        Rule(
            cel="!self.network.efa.enabled || (has(self.prefill.memory) && has(self.decode.memory))",
            message="network.efa.enabled needs prefill.memory and decode.memory: "
            "Kubernetes requires a memory request beside hugepages",
            holds=lambda s: not s.network.efa.enabled or (s.prefill.memory is not None and s.decode.memory is not None),
        ),
        Rule(
            cel="self.prefill.accelerator.type == self.decode.accelerator.type",
            message="prefill.accelerator.type and decode.accelerator.type must be the same: NixlConnector pairs "
            "only engines on the same kind of accelerator (same platform, KV layout and buffer device)",
            holds=lambda s: s.prefill.accelerator.type == s.decode.accelerator.type,
            field_path=".decode",
        ),
        Rule(
            cel="self.prefill.accelerator.type != 'cpu' || !self.network.efa.enabled",
            message="accelerator.type cpu runs without EFA: vLLM's CPU build moves KV over UCX "
            "(set network.efa.enabled false)",
            holds=lambda s: s.prefill.accelerator.type != CPU or not s.network.efa.enabled,
            field_path=".network",
        ),
        Rule(
            cel="self.prefill.accelerator.type != 'cpu' || self.model.blockSize % 32 == 0",
            message="accelerator.type cpu needs model.blockSize 32, 64 or 128: vLLM's CPU attention takes only "
            "multiples of 32",
            holds=lambda s: s.prefill.accelerator.type != CPU or s.model.block_size % 32 == 0,
            field_path=".model",
        ),
        Rule(
            cel="!has(self.router.conversation.ttl) || self.router.conversation.ttl < self.kvTransfer.decodeBlocksTTL",
            message="router.conversation.ttl must be strictly below kvTransfer.decodeBlocksTTL, "
            "or the router would replay blocks decode has already freed",
            holds=_router_ttl_ok,
        ),
        Rule(
            cel="(self.prefill.nodesPerInstance == 1 && self.decode.nodesPerInstance == 1) || self.network.efa.enabled",
            message="nodesPerInstance above 1 needs network.efa.enabled: the ranks of an instance exchange "
            "activations over the fabric, and every rank reads and serves KV over it",
            holds=lambda s: (
                (s.prefill.nodes_per_instance == 1 and s.decode.nodes_per_instance == 1) or s.network.efa.enabled
            ),
            field_path=".network",
        ),
    )

    model: ModelSpec = Field(description="Model and engine image.")
    prefill: PrefillSpec = Field(default_factory=PrefillSpec, description="Prefill role.")
    decode: DecodeSpec = Field(default_factory=DecodeSpec, description="Decode role.")
    network: NetworkSpec = Field(default_factory=NetworkSpec, description="Fabric settings.")
    kv_transfer: KVTransferSpec = Field(default_factory=KVTransferSpec, description="KV transfer (NixlConnector).")
    router: RouterSpec = Field(default_factory=RouterSpec, description="KV-aware router.")
    autoscaling: AutoscalingSpec = Field(
        default_factory=AutoscalingSpec, description="The planner of roles in scaling.mode Automatic."
    )
    tracing: TracingSpec = Field(default_factory=TracingSpec, description="OpenTelemetry traces.")
