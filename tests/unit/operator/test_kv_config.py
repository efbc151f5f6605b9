"""The NixlConnector --kv-transfer-config each role runs with, the router's derived TTL, and status.effectiveKV."""

from __future__ import annotations

import json

import pytest
from dsv_helpers import spec

from duplex.children.kv_config import (
    ROUTER_TTL_MARGIN,
    backend,
    buffer_device,
    effective,
    kv_transfer_config,
    kv_transfer_json,
    router_ttl,
)

ROLES = ("prefill", "decode")


@pytest.mark.parametrize("role", ROLES)
def test_default_config(role: str) -> None:
    assert kv_transfer_config(spec(), role) == {
        "kv_connector": "NixlConnector",
        "kv_role": "kv_producer" if role == "prefill" else "kv_consumer",
        "kv_buffer_device": "cuda",
        "kv_load_failure_policy": "recompute",
        "kv_connector_extra_config": {
            "backends": ["UCX"],
            "bidirectional_kv_xfer": True,
            "kv_recompute_threshold": 64,
            "decoder_kv_blocks_ttl": 480,
            "kv_lease_duration": 30,
        },
    }


@pytest.mark.parametrize("role", ROLES)
def test_every_kv_field_reaches_both_roles(role: str) -> None:
    s = spec(
        {
            "kvTransfer": {
                "bidirectional": False,
                "decodeBlocksTTL": 900,
                "recomputeThreshold": 0,
                "leaseDuration": 12,
                "loadFailurePolicy": "fail",
                "backend": "LIBFABRIC",
                "bufferDevice": "cpu",
            }
        }
    )
    cfg = kv_transfer_config(s, role)
    assert cfg["kv_load_failure_policy"] == "fail" and cfg["kv_buffer_device"] == "cpu"
    assert cfg["kv_connector_extra_config"] == {
        "backends": ["LIBFABRIC"],
        "bidirectional_kv_xfer": False,
        "kv_recompute_threshold": 0,
        "decoder_kv_blocks_ttl": 900,
        "kv_lease_duration": 12,
    }


def test_both_roles_share_everything_but_role() -> None:
    neuron = {"accelerator": {"type": "aws.amazon.com/neuron"}}
    s = spec({"prefill": neuron, "decode": neuron})
    p, d = kv_transfer_config(s, "prefill"), kv_transfer_config(s, "decode")
    assert (p["kv_role"], d["kv_role"]) == ("kv_producer", "kv_consumer")
    for key in ("kv_connector", "kv_buffer_device", "kv_load_failure_policy", "kv_connector_extra_config"):
        assert p[key] == d[key]


def test_json_is_compact_sorted_and_round_trips() -> None:
    s = spec({"kvTransfer": {"recomputeThreshold": 7}})
    text = kv_transfer_json(s, "decode")
    assert json.loads(text) == kv_transfer_config(s, "decode")
    assert " " not in text and text == json.dumps(json.loads(text), separators=(",", ":"), sort_keys=True)


def test_backend_derivation() -> None:
    efa = {"network": {"efa": {"enabled": True}}, "prefill": {"memory": "1Gi"}, "decode": {"memory": "1Gi"}}
    assert backend(spec()) == "UCX"
    assert backend(spec(efa)) == "LIBFABRIC"
    assert backend(spec({**efa, "kvTransfer": {"backend": "UCX"}})) == "UCX"
    assert backend(spec({"kvTransfer": {"backend": "LIBFABRIC"}})) == "LIBFABRIC"


def test_buffer_device_derivation() -> None:
    on_neuron = {"accelerator": {"type": "aws.amazon.com/neuron"}}
    neuron = spec({"prefill": on_neuron, "decode": on_neuron})
    assert buffer_device(neuron, "decode") == buffer_device(neuron, "prefill") == "cpu"
    assert buffer_device(spec(), "decode") == "cuda"
    assert buffer_device(spec({"kvTransfer": {"bufferDevice": "cpu"}}), "prefill") == "cpu"


@pytest.mark.parametrize("blocks_ttl", [60, 480, 86400])
def test_router_ttl_defaults_below_decode_blocks_ttl(blocks_ttl: int) -> None:
    s = spec({"kvTransfer": {"decodeBlocksTTL": blocks_ttl}})
    assert ROUTER_TTL_MARGIN == 30
    assert router_ttl(s) == blocks_ttl - 30
    assert 0 < router_ttl(s) < blocks_ttl


def test_router_ttl_explicit() -> None:
    assert router_ttl(spec({"router": {"conversation": {"ttl": 300}}})) == 300
    assert router_ttl(spec({"router": {"conversation": {"ttl": 479}}})) == 479


def test_effective_kv() -> None:
    s = spec(
        {
            "network": {"efa": {"enabled": True}},
            "prefill": {"memory": "1Gi"},
            "decode": {"memory": "1Gi"},
            "kvTransfer": {
                "decodeBlocksTTL": 600,
                "recomputeThreshold": 128,
                "bidirectional": False,
                "leaseDuration": 20,
                "loadFailurePolicy": "fail",
            },
        }
    )
    assert effective(s).model_dump(by_alias=True) == {
        "backend": "LIBFABRIC",
        "bidirectional": False,
        "recomputeThreshold": 128,
        "engineRecomputeThreshold": 128,
        "recomputeCalibration": None,  # recomputeThreshold: Auto only
        "decodeBlocksTTL": 600,
        "routerConversationTTL": 570,
        "leaseDuration": 20,
        "loadFailurePolicy": "fail",
    }


def test_effective_kv_keys_are_the_status_model_aliases() -> None:
    from duplex.api.status import EffectiveKV

    kv = effective(spec())
    dumped = kv.model_dump(by_alias=True)
    assert set(dumped) == {f.alias or name for name, f in EffectiveKV.model_fields.items()}
    # every field is set, so a merge patch never leaves one behind; recomputeCalibration goes with Auto, and
    # status.patch_body writes its null
    assert [k for k, v in dumped.items() if v is None] == ["recomputeCalibration"]
    assert EffectiveKV.model_validate(dumped) == kv


def test_seed_example_values(seed_doc: dict) -> None:
    from duplex.render import parse

    s = parse(seed_doc).spec
    for role in ROLES:
        extra = kv_transfer_config(s, role)["kv_connector_extra_config"]
        assert extra["decoder_kv_blocks_ttl"] == 480
        assert extra["kv_recompute_threshold"] == 64
        assert extra["bidirectional_kv_xfer"] is True
        assert extra["backends"] == ["LIBFABRIC"]
        assert extra["kv_lease_duration"] == 30
    assert router_ttl(s) == 450
