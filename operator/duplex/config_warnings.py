"""Specs that are valid but may quietly defeat the fabric: user env overriding what NIXL, libfabric and UCX run on.

The classic case is FI_PROVIDER=tcp on an EFA spec: everything still answers 200, with KV moved over TCP at a
fraction of EFA's bandwidth. The operator accepts such specs (there are real reasons, such as debugging) and says
so: ConfigValid=True with reason ValidWithWarnings, and a Warning Event ConfigWarning. Pure: spec -> messages.
"""

from __future__ import annotations

from duplex.api.spec import DisaggregatedServingSpec, EnvVar
from duplex.children import efa
from duplex.children.kv_config import backend

# Variables that decide which fabric NIXL moves KV over, or how the peers find each other.
FABRIC_VARS = ("FI_PROVIDER", "UCX_TLS", "UCX_NET_DEVICES")
FABRIC_PREFIXES = ("FI_EFA_", "NIXL_", "VLLM_NIXL_")


def is_fabric_critical(name: str) -> bool:
    return name in FABRIC_VARS or name.startswith(FABRIC_PREFIXES)


_HOST_LOCAL_TLS = {"self", "sm", "shm", "cma", "posix", "sysv", "xpmem", "knem"}  # no use between two pods


def _tcp_only(tls: str) -> bool:
    transports = {t.strip().lstrip("^") for t in tls.split(",") if t.strip()}
    return not tls.startswith("^") and "tcp" in transports and transports <= _HOST_LOCAL_TLS | {"tcp"}


def _why(spec: DisaggregatedServingSpec, var: EnvVar) -> str:
    on_efa = spec.network.efa.enabled
    value = var.value
    if var.name == "FI_PROVIDER" and on_efa and value is not None and value != "efa":
        return f"libfabric uses {value!r} instead of efa: KV moves over TCP (a silent TCP fallback)"
    if var.name == "UCX_TLS" and value is not None and _tcp_only(value):
        return f"UCX_TLS={value!r} leaves UCX only TCP to move KV over"
    if var.name == "VLLM_NIXL_SIDE_CHANNEL_PORT":
        return "the Services and NetworkPolicies open spec.kvTransfer.sideChannelPort, not this port: set that instead"
    if var.name == "VLLM_NIXL_SIDE_CHANNEL_HOST":
        return "duplex advertises the pod IP, which the peer engine connects to"
    if var.name.startswith("FI_EFA_") and on_efa:
        return "it overrides what network.efa sets for EFA"
    source = f"={value!r}" if value is not None else " from valueFrom"
    return f"it decides the fabric NIXL uses ({var.name}{source}); check it is what {backend(spec)} needs"


def config_warnings(spec: DisaggregatedServingSpec) -> list[str]:
    """One message per fabric-critical variable set by the user to other than what duplex sets, naming the field."""
    ours = {e["name"]: e.get("value") for e in efa.env(spec)}
    ours["VLLM_NIXL_SIDE_CHANNEL_PORT"] = str(spec.kv_transfer.side_channel_port)
    out = []
    for where, env in (("model", spec.model.env), ("prefill", spec.prefill.env), ("decode", spec.decode.env)):
        for i, var in enumerate(env):
            same = var.value is not None and ours.get(var.name) == var.value
            if is_fabric_critical(var.name) and not same:
                out.append(f"spec.{where}.env[{i}] sets {var.name}: {_why(spec, var)}")
    return out
