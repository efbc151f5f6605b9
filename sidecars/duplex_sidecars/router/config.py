"""The router's configuration model: the file format of `duplex router --config` and of the operator's ConfigMap.

The operator imports this model to render the router's ConfigMap, so the two can never disagree.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

# Decode keeps a turn's blocks for the engines' decoder_kv_blocks_ttl (vLLM's default: 480 s). The router replays
# them for a margin less, so that a replay never asks for blocks decode has freed. The operator's CRD defaults and
# checks come from here too.
ENGINE_BLOCKS_TTL_SECONDS = 480
TTL_MARGIN_SECONDS = 30


def default_conversation_ttl(engine_blocks_ttl: int) -> int:
    """How long the router replays decode's blocks when not told: the engines' block TTL less the margin."""
    return engine_blocks_ttl - TTL_MARGIN_SECONDS


def ttl_below_engines(ttl: float, engine_blocks_ttl: float) -> bool:
    """The router may replay blocks only while decode holds them: its TTL strictly below the engines'."""
    return ttl < engine_blocks_ttl


# The largest request body by default: a 128k-token agent history is about 0.5 MB of text, and JSON escaping, tool
# schemas and tool output at most double it; 8 MiB leaves four times that. maxBodyBytes raises it (e.g. images).
MAX_BODY_BYTES = 8 * 1024 * 1024


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class EndpointSliceDiscovery(_Strict):
    """Discover engines from the EndpointSlices of the per-role headless Services (namespaced watch)."""

    namespace: str
    prefill_service: str = Field(description="Headless Service of the prefill role.")
    decode_service: str = Field(description="Headless Service of the decode role.")
    port_name: str = Field("http", description="EndpointSlice port name of the engines' HTTP API.")
    scheme: Literal["http", "https"] = "http"
    kubeconfig: str | None = Field(
        None, description="Kubeconfig file for the watch; unset means the in-cluster service account."
    )


class ConversationConfig(_Strict):
    keying: Literal["id", "history", "both"] = Field(
        "both",
        description="How a turn finds decode's blocks from the previous one: by the conversation id the client sends "
        "(id), by the digest of its history up to its last assistant turn (history), or by the id when there is one "
        "and by the history otherwise (both).",
    )
    body_field: str | None = Field("conversation_id", description="Top-level body field holding the conversation id.")
    header: str | None = Field("X-Conversation-Id", description="Request header holding the conversation id.")
    session_headers: list[str] = Field(
        default_factory=lambda: ["X-Claude-Code-Session-Id"],
        description="Headers of agent harnesses naming a session: they scope history-keyed entries (a session holds "
        "several conversations, e.g. subagents, so it never names one). Defaults to the headers the harnesses "
        "document (Claude Code: X-Claude-Code-Session-Id).",
    )
    tenant_header: str = Field(
        "Authorization", description="Header whose digest scopes conversation state to a tenant."
    )
    ttl_seconds: float = Field(
        float(default_conversation_ttl(ENGINE_BLOCKS_TTL_SECONDS)),
        gt=0,
        description="How long a stored decode reply may be replayed.",
    )
    engine_blocks_ttl_seconds: float = Field(
        float(ENGINE_BLOCKS_TTL_SECONDS),
        gt=0,
        description="decoder_kv_blocks_ttl of the decode engines; ttl_seconds must stay below it.",
    )

    @model_validator(mode="after")
    def _ttl_below_engine(self) -> ConversationConfig:
        if not ttl_below_engines(self.ttl_seconds, self.engine_blocks_ttl_seconds):
            raise ValueError(
                f"conversation ttl_seconds ({self.ttl_seconds:g}) must be strictly below the engines' "
                f"decoder_kv_blocks_ttl ({self.engine_blocks_ttl_seconds:g})"
            )
        if self.keying == "id" and self.body_field is None and self.header is None:
            raise ValueError("keying 'id' needs body_field or header to name where the conversation id is read")
        return self


class StoreConfig(_Strict):
    kind: Literal["memory", "redis"] = "memory"
    max_entries: int = Field(1_000_000, gt=0, description="Memory store bound; the oldest entries go first.")
    max_bytes: int = Field(
        2 * 2**30,
        gt=0,
        description="Memory store bound in bytes (each entry's compact params plus a fixed per-entry overhead); "
        "the oldest entries go first.",
    )
    redis_url: str | None = Field(None, description="redis://host:port/db; may also come from redis_url_env.")
    redis_url_env: str | None = Field(None, description="Environment variable holding the Redis URL (a Secret).")
    key_prefix: str = "duplex:conv:"
    op_timeout_seconds: float = Field(
        0.5, gt=0, description="Longest wait for one store operation; past it the request recomputes."
    )
    error_backoff_seconds: float = Field(
        1.0, ge=0, description="After a store error, skip the store (recompute) for this long before trying again."
    )

    @model_validator(mode="after")
    def _redis_needs_url(self) -> StoreConfig:
        if self.kind == "redis" and not (self.redis_url or self.redis_url_env):
            raise ValueError("store kind 'redis' needs redis_url or redis_url_env")
        return self


class TimeoutsConfig(_Strict):
    connect_seconds: float = Field(5.0, gt=0)
    prefill_seconds: float = Field(600.0, gt=0, description="Whole prefill leg.")
    replay_prefill_seconds: float = Field(
        30.0,
        gt=0,
        description="Whole prefill leg that carries decode's blocks. Past it the read is abandoned and prefill "
        "recomputes: vLLM 0.32 leaves a request whose read failed or was declined waiting for ever, and a read slower "
        "than this would lose to recomputing anyway.",
    )
    decode_first_byte_seconds: float = Field(600.0, gt=0, description="Until decode's response headers arrive.")
    decode_idle_seconds: float = Field(120.0, gt=0, description="Longest gap between decode stream chunks.")


class ClientLimitsConfig(_Strict):
    """What a client can make the router hold: connections, requests in flight, and time (bodies: max_body_bytes)."""

    max_connections: int = Field(4096, ge=1, description="Open client connections; one more is answered 503.")
    max_connections_per_source: int = Field(
        1024,
        ge=1,
        description="Open client connections from one address; one more is answered 503. Below max_connections, so "
        "that one client (a runaway agent pool, a scanner) leaves room for the others; behind a gateway whose few "
        "pods carry every client, raise it to max_connections.",
    )
    max_inflight_requests: int = Field(
        512,
        ge=1,
        description="Completions being served at once; one more is answered 503 with Retry-After (health, readiness "
        "and metrics are not counted).",
    )
    head_timeout_seconds: float = Field(10.0, gt=0, description="From a request's first byte to the end of its head.")
    body_timeout_seconds: float = Field(
        60.0, gt=0, description="From the end of a request's head to the end of its body."
    )
    idle_seconds: float = Field(
        75.0, gt=0, description="A connection with nothing from its client for this long closes."
    )
    write_stall_seconds: float = Field(
        60.0,
        gt=0,
        description="A client that reads nothing of an answer for this long while the router's write buffer for it "
        "is full (over its high-water mark) is cut, and its request's decode leg with it (as nginx's send_timeout).",
    )
    max_header_fields: int = Field(
        100, ge=1, description="Header fields in a request's head (and trailer); one more is answered 431."
    )
    max_held_body_bytes: int = Field(
        256 * 1024 * 1024,
        ge=1,
        description="Request bodies held at once across every connection (being read, queued or served), reserved "
        "from a head's Content-Length; one more is answered 503 with Retry-After.",
    )


class PlacementConfig(_Strict):
    """How the prefill engine of a leg is chosen. `cost` picks the engine that can start the leg soonest: the
    compute still ahead of it (each leg in flight: its new tokens at the compute rate less what the engine has
    worked off since, and a fixed part), plus
    reading the conversation's blocks from decode, which the engine of the previous turn (whose prefix cache may hold
    them) does not have to do (router/leg_costs.py). Its rates come from here until the router's calibration has a
    fit, then from the fit."""

    prefill: Literal["least_outstanding", "round_robin", "cost"] = "least_outstanding"
    queue_ms_per_leg: float = Field(20.0, ge=0, description="cost: the fixed wait behind each leg in flight.")
    compute_ms_per_1k_tokens: float = Field(
        100.0, ge=0, description="cost: computing 1k new prompt tokens (until the calibration has a fit)."
    )
    read_ms_per_1k_tokens: float = Field(
        10.0, ge=0, description="cost: reading 1k tokens of KV from decode (until the calibration has a fit)."
    )
    read_latency_ms: float = Field(
        2.0,
        ge=0,
        description="cost: the fixed part of a read, handshake and posting (until the calibration has a fit).",
    )
    calibrated: bool = Field(True, description="cost: take the rates from the calibration's fit once it has one.")


class ReuseConfig(_Strict):
    """When a turn replays decode's blocks, and the fit of what that saves (router/calibration.py)."""

    min_tokens: int = Field(
        0,
        ge=0,
        description="Replay only when at least this many tokens are reusable; fewer are a `below_threshold` "
        "miss that prefill recomputes. The operator renders kvTransfer.recomputeThreshold here, or the value Auto "
        "calibrated, so that it takes effect without restarting an engine. 0: every entry is replayed and the "
        "engines' kv_recompute_threshold decides.",
    )
    check_side_channel_host: bool = Field(
        True,
        description="Replay only when the stored side channel (remote_host) is the address of the decode engine that "
        "stored it, when that engine's URL names an IP address (a `side_channel_mismatch` miss otherwise). Turn off "
        "for static engines whose side channel listens on another interface than their HTTP API.",
    )
    calibrate: bool = Field(True, description="Fit what a computed and a read token cost from the prefill legs.")
    calibration_window: int = Field(512, ge=32, le=65536, description="Prefill legs the fit looks at, latest first.")
    calibration_min_samples: int = Field(
        16, ge=4, description="Legs of each kind (replay, recompute) the fit needs before it says anything."
    )


class FabricReportConfig(_Strict):
    """Where the router publishes its fabric verdict for the operator's KVTransferHealthy condition: its own key in
    one ConfigMap that the operator owns (router/fabric_report.py)."""

    namespace: str
    config_map: str = Field(description="The ConfigMap; the router's Role may patch this one object only.")
    pod_name_env: str = Field("POD_NAME", description="Environment variable holding this router's pod name (its key).")
    heartbeat_seconds: float = Field(
        120.0,
        gt=0,
        description="A verdict that has not changed is written again this often, so that a report "
        "the operator reads is never older than this (it treats reports older than 5 heartbeats as gone).",
    )
    load_seconds: float = Field(
        15.0,
        gt=0,
        description="While the router has traffic (and once after), its report is written this often: its load is "
        "what the operator's planner scales on (spec.autoscaling).",
    )
    kubeconfig: str | None = Field(None, description="Kubeconfig file; unset means the in-cluster service account.")


class FabricConfig(_Strict):
    """The engines' NIXL counters, read off their /metrics: the bandwidth KV reads get, and whether it is what the
    backend promises (router/fabric.py)."""

    backend: Literal["UCX", "LIBFABRIC"] = Field("UCX", description="The engines' NIXL backend.")
    interval_seconds: float = Field(15.0, gt=0, description="How often the engines' counters are read.")
    floor_gbps: float | None = Field(
        None,
        gt=0,
        description="Read bandwidth below which the fabric is unhealthy (default: 1 for LIBFABRIC, 0.1 for UCX).",
    )
    min_read_bytes: float = Field(
        32 * 2**20,
        ge=0,
        description="Reads smaller than this on average measure latency, not bandwidth: they are "
        "not held to the floor.",
    )
    report: FabricReportConfig | None = Field(None, description="Publish the verdict for the operator.")


class CanaryConfig(_Strict):
    """A two-turn conversation the router sends itself whenever its set of healthy engines changes, checked against
    the engines' own counters (router/canary.py; the operator's DisaggregationVerified condition)."""

    enabled: bool = Field(False, description="Run the canary (the operator renders it on unless router.canary says).")
    check_seconds: float = Field(10.0, gt=0, description="How often the set of healthy engines is looked at.")
    retry_seconds: float = Field(300.0, gt=0, description="A failed canary runs again after this, changes or not.")
    prompt_words: int = Field(
        200, ge=16, le=8192, description="Words of turn 1's prompt: its tokens must reach kv_recompute_threshold."
    )
    max_tokens: int = Field(4, ge=2, le=64, description="Tokens each canary turn generates.")
    max_pairs: int = Field(4, ge=1, le=64, description="Prefill-decode pairs per run (each engine in one at least).")
    turn_timeout_seconds: float = Field(120.0, gt=0, description="A canary turn slower than this fails the run.")
    model: str | None = Field(
        None,
        description="Model to ask for; default: the first served model name, else "
        "what prefill's /v1/models lists first.",
    )


class HealthCheckConfig(_Strict):
    path: str = Field("/health", description="Engine liveness path probed by the router.")
    interval_seconds: float = Field(5.0, gt=0, description="Time between probes of each engine.")
    timeout_seconds: float = Field(
        2.0, gt=0, description="Probe timeout; a failed probe takes the engine out of rotation."
    )


class CapacityConfig(_Strict):
    """What one engine of each role runs at once (vLLM's --max-num-seqs), for the saturation gauge autoscalers read;
    None: not known (the gauge is NaN)."""

    prefill_slots: int | None = Field(None, ge=1)
    decode_slots: int | None = Field(None, ge=1)


class GatewayConfig(_Strict):
    """Trusted gateways: a request authenticated with one of `keys` (client keys held by gateways, which authenticate
    their own users) names its end user in `tenant_header`, and that user is the conversation's tenant (scoped to
    the gateway's key: two gateways' users never meet). A gateway request without the header is refused (400); the
    header from any other client is ignored."""

    keys: list[str] = Field(min_length=1, description="Names of the client keys that belong to gateways.")
    tenant_header: str = Field(
        "X-Duplex-Tenant", pattern=r"^[A-Za-z0-9-]+$", description="Header in which a gateway names its user."
    )


def traces_url(endpoint: str) -> str:
    """The OTLP/HTTP traces URL of a collector's base URL (one that names /v1/traces already is kept)."""
    base = endpoint.rstrip("/")
    return base if base.endswith("/v1/traces") else base + "/v1/traces"


class TracingConfig(_Strict):
    """OpenTelemetry traces of the requests the router serves (router/tracing.py): a span per request, one per leg
    attempt, and the W3C traceparent of each leg sent to its engine, whose own spans (vLLM's
    --otlp-traces-endpoint) join the same trace. Exported over OTLP/HTTP in batches."""

    endpoint: str | None = Field(
        None,
        pattern=r"^https?://[^\s/]+(/\S*)?$",
        description="OTLP/HTTP base URL of the collector, e.g. http://collector:4318; spans go to <endpoint>/v1/traces "
        "(a URL that already ends in /v1/traces is used as it is). Unset: no tracing, and nothing is created on the "
        "request path.",
    )
    sample_ratio: float = Field(
        1.0,
        ge=0,
        le=1,
        description="Share of requests traced, by trace id; a request whose client sent a traceparent follows the "
        "client's sampling decision instead (a parent-based ratio sampler).",
    )
    service_name: str = Field("duplex-router", min_length=1, description="The service.name of the router's spans.")


class RouterConfig(_Strict):
    host: str = "0.0.0.0"
    port: int = Field(8000, ge=1, le=65535)
    admin_port: int | None = Field(
        None,
        ge=0,
        le=65535,
        description="Port of /metrics and /ready's detail (engine URLs, store, fabric, placement rates); 0 picks a "
        "free one. Set (the operator sets 9090), the API port serves /v1, /health and a bare /ready "
        '({"ready": true}) only, so that API clients learn nothing of the topology. Unset, both are on the API '
        "port: for local runs.",
    )
    prefill: list[str] = Field(default_factory=list, description="Static prefill engine base URLs.")
    decode: list[str] = Field(default_factory=list, description="Static decode engine base URLs.")
    discovery: EndpointSliceDiscovery | None = None
    conversation: ConversationConfig = Field(default_factory=ConversationConfig)
    store: StoreConfig = Field(default_factory=StoreConfig)
    timeouts: TimeoutsConfig = Field(default_factory=TimeoutsConfig)
    max_body_bytes: int = Field(MAX_BODY_BYTES, gt=0)
    client_limits: ClientLimitsConfig = Field(default_factory=ClientLimitsConfig)
    prefill_retries: int = Field(1, ge=0, le=5, description="Extra prefill attempts on another endpoint, no reuse.")
    decode_retries: int = Field(1, ge=0, le=5, description="Extra decode attempts before the first byte.")
    served_model_names: list[str] = Field(default_factory=list, description="Models listed by /v1/models.")
    health_check: HealthCheckConfig = Field(default_factory=HealthCheckConfig)
    placement: PlacementConfig = Field(default_factory=PlacementConfig)
    fabric: FabricConfig = Field(default_factory=FabricConfig)
    canary: CanaryConfig = Field(default_factory=CanaryConfig)
    reuse: ReuseConfig = Field(default_factory=ReuseConfig)
    client_keys_dir: str | None = Field(
        None,
        description="Directory of client API keys, one file per tenant (name: the tenant, content: the key), e.g. "
        "a mounted Secret. When set, completions and /v1/models need a known key (401 otherwise), and a "
        "conversation's tenant is its key's name.",
    )
    gateway: GatewayConfig | None = Field(None, description="Trusted gateways among the client keys.")
    capacity: CapacityConfig = Field(default_factory=CapacityConfig)
    receipts: bool = Field(
        True,
        description="Answer every completion with a Server-Timing receipt: the router's, prefill's and decode's time "
        "to the first byte and the reuse verdict (router/receipt.py). It names no engine, and the anonymous "
        "tenant's misses carry no reason.",
    )
    tracing: TracingConfig = Field(default_factory=TracingConfig)
    engine_api_key_env: str | None = Field(
        None, description="Environment variable whose value is sent to the engines as a Bearer token."
    )
    reload_interval_seconds: float = Field(2.0, gt=0, description="How often the config file is checked for changes.")
    shutdown_grace_seconds: float = Field(
        30.0,
        ge=0,
        le=3600,
        description="On SIGTERM the router stops listening and lets requests and streams in flight finish for up "
        "to this long before it closes their connections.",
    )

    @model_validator(mode="after")
    def _gateway_needs_keys(self) -> RouterConfig:
        if self.gateway is not None and self.client_keys_dir is None:
            raise ValueError("gateway needs client_keys_dir: a gateway is known by its client key")
        return self
