"""The prefill-decode compatibility contract at admission: what NixlConnector can never pair is refused with the
field named; env overrides that can silently move KV off the fabric are accepted with a warning (ConfigValid
ValidWithWarnings and a ConfigWarning Event, once), which `duplex render` prints too."""

from __future__ import annotations

import pytest
from dsv_helpers import doc, spec, spec_dict
from sync_helpers import LIVE, T0, T1, parent

from duplex import status
from duplex.api.pairing import PAIRED_FLAGS
from duplex.config_warnings import config_warnings
from duplex.render import InvalidSpec
from duplex.sync import Event, sync

NEURON = {"accelerator": {"type": "aws.amazon.com/neuron"}}
EFA = {"network": {"efa": {"enabled": True}}, "prefill": {"memory": "1Gi"}, "decode": {"memory": "1Gi"}}


def errors(patch: dict) -> list[str]:
    with pytest.raises(InvalidSpec) as info:
        spec(patch)
    return info.value.errors


# --- refused: can never pair --------------------------------------------------------------------------------------


@pytest.mark.parametrize("patch", [{"prefill": NEURON}, {"decode": NEURON}])
def test_prefill_and_decode_on_different_accelerators_are_refused(patch: dict) -> None:
    (err,) = errors(patch)
    assert err.startswith("spec.decode: prefill.accelerator.type and decode.accelerator.type must be the same")


def test_both_roles_on_neuron_pair() -> None:
    s = spec({"prefill": NEURON, "decode": NEURON})
    assert s.prefill.accelerator.type == s.decode.accelerator.type == "aws.amazon.com/neuron"


@pytest.mark.parametrize("role", ["prefill", "decode"])
@pytest.mark.parametrize("args", [["--kv-cache-dtype", "fp8"], ["--kv_cache_dtype=fp8"], ["--kv-cache=fp8"],
                                  ["--attention-backend", "FLASHINFER"], ["-q", "fp8"], ["--speculative-config={}"],
                                  ["--revision", "main"]])  # fmt: skip
def test_a_role_may_not_set_alone_what_both_must_share(role: str, args: list[str]) -> None:
    (err,) = errors({role: {"extraArgs": args}})
    assert err.startswith(f"spec.{role}.extraArgs: ") and "must be the same on prefill and decode" in err
    assert "set it in spec.model.extraArgs" in err
    assert spec({"model": {"extraArgs": args}}).model.extra_args == args  # shared: both roles run it


def test_every_paired_flag_has_its_reason() -> None:
    for flags, what in PAIRED_FLAGS:
        (err,) = errors({"decode": {"extraArgs": [flags[0], "x"]}})
        assert what in err


def test_the_attention_backend_env_is_shared_only() -> None:
    (err,) = errors({"prefill": {"env": [{"name": "VLLM_ATTENTION_BACKEND", "value": "FLASHINFER"}]}})
    assert err.startswith("spec.prefill.env: VLLM_ATTENTION_BACKEND must be the same on prefill and decode")
    assert spec({"model": {"env": [{"name": "VLLM_ATTENTION_BACKEND", "value": "FLASHINFER"}]}})


def test_per_role_settings_vllm_supports_differing_stay_per_role() -> None:
    s = spec({"prefill": {"gpuMemoryUtilization": 0.5, "enablePrefixCaching": False, "extraArgs": ["--enforce-eager"]},
              "decode": {"maxNumSeqs": 8, "extraArgs": ["--swap-space", "8"]}})  # fmt: skip
    assert s.prefill.gpu_memory_utilization != s.decode.gpu_memory_utilization


# --- warned: valid, but may move KV off the fabric ----------------------------------------------------------------


def test_fi_provider_tcp_on_an_efa_spec_is_a_silent_tcp_fallback() -> None:
    (warning,) = config_warnings(spec({**EFA, "model": {"env": [{"name": "FI_PROVIDER", "value": "tcp"}]}}))
    assert warning.startswith("spec.model.env[0] sets FI_PROVIDER: ") and "silent TCP fallback" in warning


@pytest.mark.parametrize(
    "where,var,says",
    [
        ("decode", {"name": "UCX_TLS", "value": "tcp,self"}, "only TCP"),
        ("prefill", {"name": "UCX_NET_DEVICES", "value": "eth0"}, "decides the fabric"),
        ("model", {"name": "FI_EFA_USE_DEVICE_RDMA", "value": "0"}, "overrides what network.efa sets"),
        ("model", {"name": "NIXL_PLUGIN_DIR", "value": "/x"}, "decides the fabric"),
        ("decode", {"name": "VLLM_NIXL_SIDE_CHANNEL_PORT", "value": "7000"}, "spec.kvTransfer.sideChannelPort"),
        ("prefill", {"name": "VLLM_NIXL_SIDE_CHANNEL_HOST", "value": "0.0.0.0"}, "pod IP"),
        ("model", {"name": "FI_PROVIDER", "valueFrom": {"configMapKeyRef": {"name": "c", "key": "k"}}}, "valueFrom"),
    ],
)
def test_fabric_critical_overrides_are_named(where: str, var: dict, says: str) -> None:
    (warning,) = config_warnings(spec({**EFA, where: {**EFA.get(where, {}), "env": [var]}}))
    assert warning.startswith(f"spec.{where}.env[0] sets {var['name']}: ") and says in warning


def test_no_warning_for_other_variables_or_the_value_duplex_sets() -> None:
    env = [{"name": "HF_HUB_OFFLINE", "value": "1"}, {"name": "FI_PROVIDER", "value": "efa"},
           {"name": "UCX_TLS_X", "value": "tcp"}]  # fmt: skip
    assert config_warnings(spec({**EFA, "model": {"env": env}})) == []
    assert config_warnings(spec({"model": {"env": [{"name": "UCX_TLS", "value": "rc,cuda_copy"}]}})) != []


def test_warnings_become_config_valid_with_warnings_and_one_event() -> None:
    warned = parent({"decode": {"env": [{"name": "UCX_TLS", "value": "tcp"}]}})
    first = sync(warned, LIVE, None, at=T0)
    (valid,) = [c for c in first.status.conditions if c.type == "ConfigValid"]
    assert (valid.status, valid.reason) == ("True", "ValidWithWarnings")
    assert valid.message == "spec.decode.env[0] sets UCX_TLS: UCX_TLS='tcp' leaves UCX only TCP to move KV over"
    assert Event("Warning", "ConfigWarning", valid.message) in first.events
    again = sync(warned, LIVE, status.patch_body(first.status), at=T1)
    assert not [e for e in again.events if e.reason == "ConfigWarning"]  # said once, not on every pass
    fixed = sync(parent(), LIVE, status.patch_body(first.status), at=T1)
    assert [(c.reason, c.message) for c in fixed.status.conditions if c.type == "ConfigValid"] == [
        ("Valid", "spec accepted")
    ]
    assert first.ready and first.ready == sync(parent(), LIVE, None, at=T0).ready  # a warning does not block Ready


def test_render_prints_the_warnings(tmp_path, capsys) -> None:
    import yaml

    from duplex.render_cli import main

    path = tmp_path / "warned.yaml"
    path.write_text(
        yaml.safe_dump(doc(spec_dict({**EFA, "model": {"env": [{"name": "FI_PROVIDER", "value": "tcp"}]}})))
    )
    assert main(["-f", str(path)]) == 0
    err = capsys.readouterr().err
    assert 'DisaggregatedServing "demo": warning: spec.model.env[0] sets FI_PROVIDER' in err and "TCP fallback" in err
