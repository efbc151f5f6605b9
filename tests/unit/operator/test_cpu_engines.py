"""`accelerator.type: cpu`: vLLM's CPU build on CPU nodes. What the CPU platform needs is rendered by the operator
(KV cache size in GiB, KV kept in host memory, UCX), no device resource or device taint, and what it cannot do is
refused at admission with the reason."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from dsv_helpers import arg_value, env_map, spec

from duplex.children.engine import engine_workload
from duplex.render import InvalidSpec

ROOT = Path(__file__).resolve().parents[3]
CPU = {
    "model": {"blockSize": 32},
    "prefill": {"accelerator": {"type": "cpu"}, "cpu": "4", "memory": "8Gi"},
    "decode": {"accelerator": {"type": "cpu", "kvCacheGiB": 6}, "cpu": "4", "memory": "16Gi"},
}


def engine(patch: dict[str, Any], role: str) -> dict[str, Any]:
    pod = engine_workload(spec(patch), "demo", "ns1", role)["spec"]["template"]["spec"]
    return {"pod": pod, "ctr": pod["containers"][0]}


@pytest.mark.parametrize(("role", "gib"), [("prefill", "4"), ("decode", "6")])
def test_a_cpu_engine_gets_what_the_cpu_platform_needs_and_no_device(role: str, gib: str) -> None:
    e = engine(CPU, role)
    assert env_map(e["ctr"])["VLLM_CPU_KVCACHE_SPACE"]["value"] == gib
    kv = json.loads(arg_value(e["ctr"]["args"], "--kv-transfer-config"))
    assert kv["kv_buffer_device"] == "cpu"
    assert kv["kv_connector_extra_config"]["backends"] == ["UCX"]
    for section in ("requests", "limits"):
        assert set(e["ctr"]["resources"][section]) == {"cpu", "memory"}
    assert e["pod"]["tolerations"] == []


def test_gpu_engines_get_no_cpu_settings() -> None:
    assert "VLLM_CPU_KVCACHE_SPACE" not in env_map(engine({}, "prefill")["ctr"])


@pytest.mark.parametrize(
    ("patch", "message"),
    [
        ({"model": {"blockSize": 16}}, "vLLM's CPU attention takes only multiples of 32"),
        ({"network": {"efa": {"enabled": True}}}, "vLLM's CPU build moves KV over UCX"),
        ({"prefill": {"accelerator": {"count": 2}}}, "a cpu engine takes the role's cpu request"),
    ],
)
def test_what_a_cpu_engine_cannot_do_is_refused(patch: dict[str, Any], message: str) -> None:
    body = json.loads(json.dumps(CPU))
    for key, value in patch.items():
        body.setdefault(key, {})
        for inner, v in value.items():
            body[key][inner] = {**body[key].get(inner, {}), **v} if isinstance(v, dict) else v
    with pytest.raises(InvalidSpec) as err:
        spec(body)
    assert any(message in e for e in err.value.errors), err.value.errors


def test_kv_cache_size_is_for_cpu_engines_only() -> None:
    with pytest.raises(InvalidSpec, match="kvCacheGiB is for type cpu"):
        spec({"prefill": {"accelerator": {"kvCacheGiB": 2}}})


def test_the_local_example_runs_on_cpu_on_the_real_node() -> None:
    doc = yaml.safe_load((ROOT / "examples/local.yaml").read_text())
    parsed = spec(doc["spec"], base={})
    for role in (parsed.prefill, parsed.decode):
        assert role.accelerator.type == "cpu"
        assert role.node_selector == {"duplex.dev/real-node": "true"}
    assert parsed.router.node_selector == {"duplex.dev/real-node": "true"}
    assert parsed.model.image_pull_policy == "IfNotPresent"
