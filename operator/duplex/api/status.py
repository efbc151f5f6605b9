"""status of a DisaggregatedServing: per-role counts, router endpoint, effective KV settings and conditions."""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field
from pydantic.alias_generators import to_camel

from duplex.api.rules import Checked

CONDITION_TYPES = (
    "Ready",
    "ConfigValid",
    "PrefillReady",
    "DecodeReady",
    "RouterReady",
    "Progressing",
    "FabricReady",
    "KVTransferHealthy",
    "DisaggregationVerified",
)


class _Status(Checked):
    model_config = ConfigDict(alias_generator=to_camel, extra="allow")


class Condition(_Status):
    type: str = Field(
        description="One of Ready, ConfigValid, PrefillReady, DecodeReady, RouterReady, Progressing, FabricReady, "
        "KVTransferHealthy, DisaggregationVerified."
    )
    status: Literal["True", "False", "Unknown"]
    reason: str = Field(description="CamelCase reason.")
    message: str = Field("", description="Human-readable detail.")
    observed_generation: int | None = Field(None, description="Generation the condition was computed from.")
    last_transition_time: str | None = Field(None, description="When status last changed (RFC 3339).")


class RoleStatus(_Status):
    """Counts of pods, or of instances for a role whose instances span nodes (nodesPerInstance above 1)."""

    replicas: int = Field(0, description="Desired pods (instances).")
    ready_replicas: int = Field(0, description="Pods passing readiness (instances whose every pod does).")
    updated_replicas: int = Field(0, description="Pods (instances) on the current template.")
    summary: str = Field("0/0", description="ready/desired, for printer columns.")


class RecomputeCalibration(_Status):
    """recomputeThreshold: Auto: the threshold the router applies, and the measurements it came from."""

    reason: str = Field(description="Initial, Measured, WithinMargin, Waiting (minIntervalSeconds) or NotMeasured.")
    message: str = ""
    measured_threshold: int | None = Field(None, description="The routers' break-even, within the spec's bounds.")
    compute_seconds_per_token: float | None = None
    read_seconds_per_token: float | None = None
    replay_overhead_seconds: float | None = None
    samples: int | None = Field(None, description="Prefill legs behind the measurement, over every router.")
    routers: int = Field(0, description="Routers whose fresh reports carried a measurement.")
    changed_at: str | None = Field(None, description="When the threshold last changed (RFC 3339).")


class EffectiveKV(_Status):
    backend: str | None = None
    bidirectional: bool | None = None
    recompute_threshold: int | None = Field(None, description="The threshold the router applies.")
    engine_recompute_threshold: int | None = Field(None, description="The engines' kv_recompute_threshold.")
    recompute_calibration: RecomputeCalibration | None = Field(None, description="With recomputeThreshold: Auto.")
    decode_blocks_ttl: int | None = Field(None, alias="decodeBlocksTTL")
    router_conversation_ttl: int | None = Field(None, alias="routerConversationTTL")
    lease_duration: int | None = None
    load_failure_policy: str | None = None


class EngineChange(_Status):
    """The last change that rolled engine pods, and what it did to the KV they hold (duplex/kv_change.py)."""

    kv: Literal["Compatible", "Incompatible"] = Field(
        description="Compatible: old and new pods exchange blocks, conversations keep their reuse through the roll. "
        "Incompatible: they cannot; each conversation recomputes its next turn once, on the new pods."
    )
    roles: list[str] = Field(default_factory=list, description="The engine roles that rolled.")
    fields: list[str] = Field(default_factory=list, description="What made it incompatible.")
    observed_generation: int | None = Field(None, description="The spec generation that made the change.")


class RolePlan(_Status):
    """The planner's view of one role in scaling.mode Automatic (duplex/planner.py)."""

    replicas: int = Field(description="What the planner set (in dry run: what it would set).")
    recommended: int = Field(description="What the measurements alone ask for, within minReplicas..maxReplicas.")
    demand: float | None = Field(None, description="Legs in flight in engines' worth, summed over routers.")
    saturation: float | None = Field(None, description="The routers' saturation of the role, summed over routers.")
    reason: str = Field(description="Why replicas is what it is: ScaleUp, ScaleDown, Hold, Waiting, NoMeasurements.")
    lower_since: str | None = Field(None, description="Since when the recommendation has stayed below the size.")
    lower_peak: int | None = Field(None, description="The highest recommendation since lowerSince.")
    scaled_up_at: str | None = Field(
        None, description="When the planner last added pods to the role: a TTFT measured before it asks for no more."
    )


class Autoscaling(_Status):
    """The planner's last decision, with its inputs."""

    at: str = Field(description="When it was made (RFC 3339).")
    dry_run: bool = False
    ttft_p90_seconds: float | None = Field(None, description="The routers' time to first token, p90, worst router.")
    routers: int = Field(0, description="Routers whose fresh load went into the decision.")
    prefill: RolePlan | None = None
    decode: RolePlan | None = None


class DisaggregatedServingStatus(_Status):
    observed_generation: int | None = Field(None, description="Generation of the spec last reconciled.")
    prefill: RoleStatus | None = None
    decode: RoleStatus | None = None
    router: RoleStatus | None = None
    router_endpoint: str | None = Field(None, description="In-cluster URL of the router Service.")
    effective_kv: EffectiveKV | None = Field(None, alias="effectiveKV", description="KV settings the engines run with.")
    engine_config_hash: str | None = Field(None, description="Hash of the engine-facing configuration.")
    engine_change: EngineChange | None = Field(None, description="The last change that rolled engine pods.")
    autoscaling: Autoscaling | None = Field(None, description="The planner's last decision (scaling.mode Automatic).")
    conditions: list[Condition] = Field(default_factory=list)
