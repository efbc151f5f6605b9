"""The NixlConnector `--kv-transfer-config` each role runs with, and the settings derived from the spec."""

from __future__ import annotations

import json
from typing import Any, Literal

from duplex.api.spec import AUTO, GPU, DisaggregatedServingSpec
from duplex.api.status import EffectiveKV, RecomputeCalibration
from duplex.children.roles import EngineRole
from duplex_sidecars.router.config import TTL_MARGIN_SECONDS as ROUTER_TTL_MARGIN  # noqa: F401 (the tests' name)
from duplex_sidecars.router.config import default_conversation_ttl


def backend(spec: DisaggregatedServingSpec) -> Literal["UCX", "LIBFABRIC"]:
    if spec.kv_transfer.backend:
        return spec.kv_transfer.backend
    return "LIBFABRIC" if spec.network.efa.enabled else "UCX"


def buffer_device(spec: DisaggregatedServingSpec, role: str) -> str:
    if spec.kv_transfer.buffer_device:
        return spec.kv_transfer.buffer_device
    accelerator = EngineRole.of(spec, role).spec.accelerator.type
    return "cuda" if accelerator == GPU else "cpu"  # Neuron stages KV in host memory; a cpu engine keeps it there


def is_auto(spec: DisaggregatedServingSpec) -> bool:
    return spec.kv_transfer.recompute_threshold == AUTO


def engine_threshold(spec: DisaggregatedServingSpec) -> int:
    """The engines' kv_recompute_threshold: the spec's, or with Auto the calibration's floor (the router applies the
    calibrated value above it, so that a new value never restarts an engine)."""
    kv = spec.kv_transfer
    return kv.recompute_calibration.min_tokens if isinstance(kv.recompute_threshold, str) else kv.recompute_threshold


def router_threshold(spec: DisaggregatedServingSpec, auto: int | None = None) -> int:
    """The threshold the router applies: the spec's, or with Auto the value decided (duplex.auto_threshold), the
    initial one until then."""
    kv = spec.kv_transfer
    if not isinstance(kv.recompute_threshold, str):
        return kv.recompute_threshold
    cal = kv.recompute_calibration
    return min(max(cal.initial if auto is None else auto, cal.min_tokens), cal.max_tokens)


def router_ttl(spec: DisaggregatedServingSpec) -> int:
    explicit = spec.router.conversation.ttl
    return explicit if explicit is not None else default_conversation_ttl(spec.kv_transfer.decode_blocks_ttl)


def kv_transfer_config(spec: DisaggregatedServingSpec, role: str) -> dict[str, Any]:
    kv = spec.kv_transfer
    return {
        "kv_connector": kv.connector,
        # NixlConnector decides P or D per request from kv_transfer_params; vLLM 0.33 deprecates kv_both and asks
        # for the role the engine is deployed as.
        "kv_role": "kv_producer" if role == "prefill" else "kv_consumer",
        "kv_buffer_device": buffer_device(spec, role),
        "kv_load_failure_policy": kv.load_failure_policy,
        "kv_connector_extra_config": {
            "backends": [backend(spec)],
            "bidirectional_kv_xfer": kv.bidirectional,
            "kv_recompute_threshold": engine_threshold(spec),
            "decoder_kv_blocks_ttl": kv.decode_blocks_ttl,
            "kv_lease_duration": kv.lease_duration,
        },
    }


def kv_transfer_json(spec: DisaggregatedServingSpec, role: str) -> str:
    return json.dumps(kv_transfer_config(spec, role), separators=(",", ":"), sort_keys=True)


def effective(
    spec: DisaggregatedServingSpec, auto: int | None = None, calibration: RecomputeCalibration | None = None
) -> EffectiveKV:
    """status.effectiveKV: what the engines and the router actually run with; with Auto, the value decided and why."""
    kv = spec.kv_transfer
    return EffectiveKV(
        backend=backend(spec),
        bidirectional=kv.bidirectional,
        recompute_threshold=router_threshold(spec, auto),
        engine_recompute_threshold=engine_threshold(spec),
        recompute_calibration=calibration if is_auto(spec) else None,
        decode_blocks_ttl=kv.decode_blocks_ttl,
        router_conversation_ttl=router_ttl(spec),
        lease_duration=kv.lease_duration,
        load_failure_policy=kv.load_failure_policy,
    )
