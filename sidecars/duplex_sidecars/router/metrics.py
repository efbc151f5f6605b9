"""The router's Prometheus metrics, in a registry of their own so that several routers can live in one process."""

from __future__ import annotations

from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.openmetrics import exposition as openmetrics

OPENMETRICS = "application/openmetrics-text"

# Every reason a request's prefill leg goes out without replayed blocks.
MISS_REASONS: tuple[str, ...] = (
    "no_conversation_id",
    "no_entry",
    "expired",
    "history_mismatch",
    "scope_mismatch",
    "endpoint_gone",
    "endpoint_unhealthy",
    "side_channel_mismatch",
    "revision_changed",
    "endpoint_draining",
    "store_error",
    "not_replayable",
    "prefill_retry",
    "no_params",
    "stream_no_params",
    "reasoning",
    "no_prior_turn",
    "below_threshold",
)


class _Children:
    """A labelled metric for the hot path: each label set's child is looked up once (prometheus-client validates
    the values and takes a lock on every `labels` call). Only for label sets that are never removed."""

    def __init__(self, metric: Any):
        self.metric = metric
        self._children: dict[tuple[str, ...], Any] = {}

    def labels(self, *values: str) -> Any:
        child = self._children.get(values)
        if child is None:
            child = self._children[values] = self.metric.labels(*values)
        return child

    def remove_where(self, position: int, value: str) -> None:
        """Drop every label set whose value at `position` is `value` (an engine that left)."""
        for values in [v for v in self._children if v[position] == value]:
            del self._children[values]
            self.metric.remove(*values)


_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
# Gaps between an agent's turns: tool calls of seconds to minutes, people of minutes; 420 and 480 s bracket the
# default TTLs (vLLM's decoder_kv_blocks_ttl 480 s, the router's a margin below it).
_TURN_GAP_BUCKETS = (1, 2, 5, 10, 20, 30, 60, 120, 180, 300, 420, 480, 600, 900, 1800, 3600)


class RouterMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = _Children(
            Counter(
                "duplex_router_requests",
                "Client requests by route and final HTTP status.",
                ["route", "status"],
                registry=r,
            )
        )
        self.ttft = _Children(
            Histogram(
                "duplex_router_time_to_first_token_seconds",
                "From request arrival to the first byte sent to the client, by route, stream mode and whether the "
                "prefill leg read decode's blocks back (reuse hit or miss).",
                ["route", "stream", "reuse"],
                buckets=_LATENCY_BUCKETS,
                registry=r,
            )
        )
        self.e2e = _Children(
            Histogram(
                "duplex_router_request_duration_seconds",
                "From request arrival to the last byte sent to the client.",
                ["route", "stream"],
                buckets=_LATENCY_BUCKETS,
                registry=r,
            )
        )
        self.leg_duration = _Children(
            Histogram(
                "duplex_router_leg_duration_seconds",
                "Prefill leg until its reply; decode leg until its response headers.",
                ["leg"],
                buckets=_LATENCY_BUCKETS,
                registry=r,
            )
        )
        self.reuse_hits = Counter(
            "duplex_router_kv_reuse_hits", "Prefill legs that carried decode's retained blocks.", registry=r
        )
        self.reuse_misses = _Children(
            Counter(
                "duplex_router_kv_reuse_misses",
                "Prefill legs sent with the miss payload, by reason.",
                ["reason"],
                registry=r,
            )
        )
        self.reused_tokens = Counter(
            "duplex_router_kv_reused_tokens",
            "Sum of remote_num_tokens replayed to prefill (tokens offered for the D->P pull).",
            registry=r,
        )
        self.turn_gap = Histogram(
            "duplex_router_turn_gap_seconds",
            "From a conversation's stored turn to its next turn, for each stored entry a turn found (the router's "
            "TTL minus what was left of it): gaps past the TTL are in the expired misses while the store keeps the "
            "entry, then in no_entry. What decodeBlocksTTL would need to cover a share of the turns.",
            buckets=_TURN_GAP_BUCKETS,
            registry=r,
        )
        self.captures = _Children(
            Counter(
                "duplex_router_kv_captures",
                "Decode replies by what was stored (stored, not_replayable, no_params, store_error, not_stored: no id "
                "or failed), by stream mode and decode engine.",
                ["outcome", "stream", "endpoint"],
                registry=r,
            )
        )
        self.retries = Counter("duplex_router_retries", "Leg retries, by leg.", ["leg"], registry=r)
        self.resends = _Children(
            Counter(
                "duplex_router_leg_resends",
                "Legs sent a second time because their pooled keep-alive connection was closed by the engine before "
                "any answer (never a prefill carrying decode's blocks).",
                ["leg"],
                registry=r,
            )
        )
        self.backend_errors = Counter(
            "duplex_router_backend_errors",
            "Failed legs by leg and kind (connect, timeout, status_5xx, status_4xx, broken_stream).",
            ["leg", "kind"],
            registry=r,
        )
        self.inflight = Gauge(
            "duplex_router_inflight_requests", "Requests in flight per engine.", ["role", "endpoint"], registry=r
        )
        self.endpoints = Gauge(
            "duplex_router_endpoints",
            "Known engines by role and state: healthy, unhealthy, unknown (not probed yet), draining (a terminating "
            "decode pod whose blocks are still read; it takes no new legs).",
            ["role", "state"],
            registry=r,
        )
        self.store_entries = Gauge(
            "duplex_router_store_entries",
            "Entries in the conversation store (Redis: refreshed every 30 s).",
            registry=r,
        )
        self.store_errors = Counter(
            "duplex_router_store_errors", "Store operations that failed, by operation.", ["op"], registry=r
        )
        self.store_dropped = Counter(
            "duplex_router_store_dropped_entries",
            "Entries turned into tombstones because their decode engine left.",
            registry=r,
        )
        self.rejected = _Children(
            Counter(
                "duplex_router_rejected_requests",
                "Client connections or requests refused at the edge, by reason: connections (503), inflight (503), "
                "bodies (503: the request bodies held are at client_limits.max_held_body_bytes), "
                "head_timeout and body_timeout (408), unauthorized (401), write_timeout (a client that stopped "
                "reading, cut), source_connections (503: one client address holds "
                "client_limits.max_connections_per_source).",
                ["reason"],
                registry=r,
            )
        )
        reasons = (
            "connections",
            "source_connections",
            "inflight",
            "bodies",
            "head_timeout",
            "body_timeout",
            "unauthorized",
            "write_timeout",
        )
        for reason in reasons:
            self.rejected.labels(reason)
        self.kv_transfer_healthy = Gauge(
            "duplex_router_kv_transfer_healthy",
            "1 while every engine's KV reads run above the backend's floor and rarely fail (router/fabric.py).",
            registry=r,
        )
        self.kv_transfer_healthy.set(1)
        self.kv_read_bandwidth = _Children(
            Gauge(
                "duplex_router_kv_read_bandwidth_bytes_per_second",
                "Bandwidth of the KV reads an engine initiated in the last interval that had any (vLLM's NIXL "
                "counters).",
                ["role", "endpoint"],
                registry=r,
            )
        )
        self.kv_pair_bandwidth = _Children(
            Gauge(
                "duplex_router_kv_pair_bandwidth_bytes_per_second",
                "A reading engine's bandwidth, for each engine whose blocks it read in that interval.",
                ["reader", "owner"],
                registry=r,
            )
        )
        self.kv_transfer_failures = _Children(
            Counter(
                "duplex_router_kv_transfer_failures",
                "KV transfers an engine reports failed (vllm:nixl_num_failed_transfers), as seen by the router.",
                ["role", "endpoint"],
                registry=r,
            )
        )
        self.kv_expired_reads = _Children(
            Counter(
                "duplex_router_kv_expired_reads",
                "An engine's expired KV (vllm:nixl_num_kv_expired_reqs): on prefill, declined reads of (nearly) expired decode "
                "blocks and its own blocks unread within the lease; on decode, retained blocks aged out unread.",
                ["role", "endpoint"],
                registry=r,
            )
        )
        self.config_reloads = Counter(
            "duplex_router_config_reloads",
            "Config file reloads by outcome (applied, invalid, failed: valid but not applied, tried again).",
            ["outcome"],
            registry=r,
        )
        for reason in MISS_REASONS:
            self.reuse_misses.labels(reason)
        # Signals for autoscalers, per engine role (docs/install.md, "Autoscaling a role").
        self.saturation = _Children(
            Gauge(
                "duplex_router_saturation",
                "Legs in flight on the role's serving engines over what they run at once (capacity.*_slots, vLLM's "
                "--max-num-seqs, per engine): 1 is full, above 1 legs queue inside the engines. NaN when the slots "
                "are not known.",
                ["role"],
                registry=r,
            )
        )
        self.expected_wait = _Children(
            Gauge(
                "duplex_router_expected_wait_seconds",
                "The compute a leg sent now would wait behind on the role's least loaded serving engine, from the "
                "legs in flight and what each was expected to compute (router/leg_costs.py; prefill).",
                ["role"],
                registry=r,
            )
        )
        self.prompt_tokens = _Children(
            Counter(
                "duplex_router_prefill_prompt_tokens",
                "Prompt tokens of the prefill legs that answered, by source: read_back (decode's blocks replayed to "
                "prefill) and computed (the rest, including prefill's own prefix cache hits).",
                ["source"],
                registry=r,
            )
        )
        for source in ("read_back", "computed"):
            self.prompt_tokens.labels(source)
        self.store_max_bytes = Gauge(
            "duplex_router_store_max_bytes",
            "The memory store's bound in bytes (store.max_bytes); what duplex_router_store_bytes may reach.",
            registry=r,
        )
        self.store_bytes = Gauge(
            "duplex_router_store_bytes",
            "Bytes the memory store's entries are counted as against store.max_bytes, as of its last put or take.",
            registry=r,
        )

    def forget_endpoint(self, url: str) -> None:
        """Drop the per-engine series of an engine that left the endpoint set."""
        self.captures.remove_where(2, url)
        for children, position in (
            (self.kv_transfer_failures, 1),
            (self.kv_expired_reads, 1),
            (self.kv_read_bandwidth, 1),
            (self.kv_pair_bandwidth, 0),
            (self.kv_pair_bandwidth, 1),
        ):
            children.remove_where(position, url)

    def miss(self, reason: str) -> None:
        self.reuse_misses.labels(reason).inc()

    def total(self, name: str, **labels: str) -> float:
        """The sum of the samples called `name` whose labels include `labels` (0 when there is none)."""
        return sum(
            sample.value
            for family in self.registry.collect()
            for sample in family.samples
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items())
        )

    def render(self, accept: str = "") -> tuple[bytes, str]:
        """The exposition and its content type: OpenMetrics, which carries the TTFT histogram's exemplars (trace ids),
        when the scraper accepts it (Prometheus does by default), else the classic text format."""
        if OPENMETRICS in accept:
            body: bytes = openmetrics.generate_latest(self.registry)  # type: ignore[no-untyped-call]
            return body, openmetrics.CONTENT_TYPE_LATEST
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
