"""The simulator's settings: one dataclass filled by the CLI and read by every part of the engine."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

from duplex_sidecars.sim.cost import CostModel


@dataclass(frozen=True)
class SimConfig:
    role: str = "prefill"  # informative only: like vLLM, behaviour follows each request's kv_transfer_params
    host: str = "127.0.0.1"
    port: int = 8000
    side_channel_host: str | None = None  # advertised as remote_host; defaults to host
    side_channel_port: int = 5600
    engine_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    model: str = "sim"
    api_key: str | None = None  # vLLM's --api-key / VLLM_API_KEY: /v1/* needs it as a Bearer token
    key_on_every_path: bool = False  # duplex's engine guard: every path but /health and /metrics needs the key
    kv_revision: str | None = None  # sent on every answer in X-Duplex-KV-Revision, as the engine guard does
    max_model_len: int = 32768
    block_size: int = 16
    num_blocks: int = 4096
    block_bytes: int = 4096
    enable_prefix_caching: bool = True
    bidirectional: bool = True
    kv_recompute_threshold: int = 64
    decoder_kv_blocks_ttl: float = 480.0
    kv_lease_duration: float = 30.0
    kv_load_failure_policy: str = "fail"  # vLLM's default; routers should run prefill with "recompute"
    nixl_backend: str = "UCX"
    fail_on_corrupt: bool = False
    # vLLM 0.33 streams kv_transfer_params: null on every token chunk and the params on the finishing one; 0.32 sends
    # none in a stream (False).
    stream_kv_params: bool = True
    cost: CostModel = field(default_factory=CostModel)
    # vLLM's --otlp-traces-endpoint: a span per request, parented by its traceparent (sim/tracing.py); None: off.
    otlp_traces_endpoint: str | None = None
    otlp_traces_protocol: str = "grpc"  # vLLM's OTEL_EXPORTER_OTLP_TRACES_PROTOCOL: grpc or http/protobuf

    @property
    def advertised_host(self) -> str:
        return self.side_channel_host or self.host
