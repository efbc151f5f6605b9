"""Every engine command line `duplex render` produces is accepted by vLLM's own parser and config classes, and vLLM
reads our bidirectional KV settings back as we meant them. The negative cases prove the checker can say no."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.vllm

ROLES = ("prefill", "decode")
# What each example asks for, with the API defaults spelled out where the example leaves a field unset.
EXPECTED: dict[str, dict[str, Any]] = {
    "examples/seed.yaml": {
        "engines": {"qwen3-32b-prefill", "qwen3-32b-decode"},
        "model": "Qwen/Qwen3-32B",
        "kv_buffer_device": "cuda",
        "kv_load_failure_policy": "recompute",
        "extra": {
            "backends": ["LIBFABRIC"],
            "bidirectional_kv_xfer": True,
            "kv_recompute_threshold": 64,
            "decoder_kv_blocks_ttl": 480,
            "kv_lease_duration": 30,
        },
        "engine_config": {
            "tensor_parallel_size": 8,
            "block_size": 16,
            "max_model_len": 32768,
            "served_model_name": "Qwen",
        },
    },
    "examples/trainium.yaml": {
        "engines": {"llama-70b-trn2-prefill", "llama-70b-trn2-decode"},
        "model": "meta-llama/Llama-3.3-70B-Instruct",
        "kv_buffer_device": "cpu",
        "kv_load_failure_policy": "recompute",
        "extra": {
            "backends": ["LIBFABRIC"],
            "bidirectional_kv_xfer": True,
            "kv_recompute_threshold": 128,
            "decoder_kv_blocks_ttl": 600,
            "kv_lease_duration": 30,
        },
        "engine_config": {
            "tensor_parallel_size": 32,
            "block_size": 32,
            "max_model_len": 16384,
            "served_model_name": "llama-70b",
        },
    },
    "examples/local.yaml": {
        "engines": {"local-prefill", "local-decode"},
        "model": "Qwen/Qwen3-0.6B",
        "kv_buffer_device": "cpu",
        "kv_load_failure_policy": "recompute",
        "extra": {
            "backends": ["UCX"],
            "bidirectional_kv_xfer": True,
            "kv_recompute_threshold": 64,
            "decoder_kv_blocks_ttl": 480,
            "kv_lease_duration": 30,
        },
        "engine_config": {
            "tensor_parallel_size": 1,
            "block_size": 32,
            "max_model_len": 32768,
            "served_model_name": "qwen3-0.6b",
        },
    },
}
# Checks that must pass for a rendered command line; kv_buffer_device is skipped for out-of-tree (Neuron) devices.
REQUIRED_CHECKS = (
    "parse",
    "validate_parsed_serve_args",
    "kv_transfer_config",
    "kv_connector",
    "extra_config",
    "extra_config_keys_read",
    "engine_args",
    "engine_config",
    "engine_config_values",
    "nixl_scheduler",
)


def _device(container: dict[str, Any]) -> str | None:
    limits = (container.get("resources") or {}).get("limits") or {}
    if "nvidia.com/gpu" in limits:
        return "cuda"
    if "aws.amazon.com/neuron" in limits:
        return "neuron"
    if any(e["name"] == "VLLM_CPU_KVCACHE_SPACE" for e in container.get("env") or []):
        return "cpu"  # accelerator.type: cpu
    return None


def _rendered(example: str) -> list[dict[str, Any]]:
    duplex = Path(sys.executable).with_name("duplex")
    proc = subprocess.run([str(duplex), "render", "-f", example], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"duplex render -f {example} failed:\n{proc.stderr}"
    return [obj for obj in yaml.safe_load_all(proc.stdout) if obj]


def _entry(name: str, role: str, example: str, template: dict[str, Any], env: dict[str, str]) -> dict[str, Any]:
    """The pod template's vllm container as a checker entry, its $(VAR) references expanded from `env` as the
    kubelet expands them."""
    containers = [c for c in template["spec"]["containers"] if c["name"] == "vllm"]
    assert len(containers) == 1, f"{name}: expected one container named vllm"
    c = containers[0]
    argv = [*(c.get("command") or []), *(c.get("args") or [])]
    for var, value in env.items():
        argv = [a.replace(f"$({var})", value) for a in argv]
    return {"name": name, "role": role, "example": example, "argv": argv, "device": _device(c)}


def rendered_engines(example: str) -> list[dict[str, Any]]:
    """The vllm container of every prefill and decode Deployment `duplex render -f example` prints."""
    entries = []
    for obj in _rendered(example):
        role = obj["metadata"].get("labels", {}).get("duplex.dev/role")
        if obj.get("kind") == "Deployment" and role in ROLES:
            entries.append(_entry(obj["metadata"]["name"], role, example, obj["spec"]["template"], {}))
    return entries


def rendered_ranks(example: str) -> list[dict[str, Any]]:
    """The leader and a worker of every LeaderWorkerSet `duplex render -f example` prints, with the environment
    LWS gives a group's second pod."""
    entries = []
    for obj in _rendered(example):
        if obj.get("kind") != "LeaderWorkerSet":
            continue
        name, lwt = obj["metadata"]["name"], obj["spec"]["leaderWorkerTemplate"]
        env = {"LWS_WORKER_INDEX": "1", "LWS_LEADER_ADDRESS": f"{name}-0.{name}-0.default"}
        for rank in ("leader", "worker"):
            template = lwt[f"{rank}Template"]
            entries.append(
                _entry(f"{name}-{rank}", obj["metadata"]["labels"]["duplex.dev/role"], example, template, env)
            )
    return entries


MULTINODE = "examples/multinode-decode.yaml"  # every role's instance spans two nodes: a leader and a worker each


@pytest.fixture(scope="module")
def rendered() -> dict[str, dict[str, Any]]:
    engines = [e for example in EXPECTED for e in rendered_engines(example)] + rendered_ranks(MULTINODE)
    return {e["name"]: e for e in engines}


@pytest.fixture(scope="module")
def rendered_run(rendered, vllm_check):
    run = vllm_check([{k: e[k] for k in ("name", "argv", "device")} for e in rendered.values()])
    print(f"\nvllm_check: {len(run.results)} rendered command lines in {run.seconds:.1f} s")
    return run


def test_render_has_a_prefill_and_a_decode_engine_per_example(rendered):
    for example, want in EXPECTED.items():
        got = {n for n, e in rendered.items() if e["example"] == example}
        assert got == want["engines"], f"{example}: rendered engines {sorted(got)}"
        assert {rendered[n]["role"] for n in got} == set(ROLES)


def test_vllm_accepts_every_rendered_command_line(rendered, rendered_run):
    failures = {r["name"]: r["errors"] for r in rendered_run.results if not r["ok"]}
    assert not failures, "vLLM rejected rendered command lines:\n" + json.dumps(failures, indent=2)
    assert rendered_run.returncode == 0, rendered_run.stderr[-4000:]
    assert set(rendered_run.by_name()) == set(rendered)
    for result in rendered_run.results:
        status = {c["check"]: c["status"] for c in result["checks"]}
        missing = [c for c in REQUIRED_CHECKS if status.get(c) != "passed"]
        assert not missing, f"{result['name']}: checks that did not pass: {missing}\n{result['checks']}"
        # Deprecations of flags or values we set are not failures yet, but they should be seen.
        deprecations = [line for line in result["warnings"] if "deprecated" in line.lower()]
        assert not deprecations, f"{result['name']}: vLLM deprecates something we render: {deprecations}"


@pytest.mark.parametrize("example", list(EXPECTED))
def test_vllm_reads_the_kv_transfer_config_we_meant(example, rendered, rendered_run):
    want = EXPECTED[example]
    results = rendered_run.by_name()
    for name in sorted(want["engines"]):
        result = results[name]
        kv = result["kv_transfer_config"]
        assert kv is not None, f"{name}: {result['errors']}"
        assert kv["kv_connector"] == "NixlConnector"
        # vLLM 0.33 deprecates kv_both for NixlConnector: prefill produces, decode consumes.
        assert kv["kv_role"] == ("kv_producer" if "prefill" in name else "kv_consumer"), name
        assert kv["kv_buffer_device"] == want["kv_buffer_device"]
        assert kv["kv_load_failure_policy"] == want["kv_load_failure_policy"]
        extra = kv["kv_connector_extra_config"]
        assert extra["bidirectional_kv_xfer"] is True
        for key, value in want["extra"].items():
            assert extra.get(key) == value, f"{name}: {key} = {extra.get(key)!r}, want {value!r}"
        assert result["model"] == want["model"]
        engine = result["engine_config"]
        for key, value in want["engine_config"].items():
            got = engine[key]
            got = got[0] if key == "served_model_name" and isinstance(got, list) else got
            assert got == value, f"{name}: engine config {key} = {got!r}, want {value!r}"
        scheduler = next(c for c in result["checks"] if c["check"] == "nixl_scheduler")
        assert "'bidirectional_kv_xfer': True" in scheduler["detail"]


def test_vllm_reads_the_multinode_launch_of_every_rank(rendered, rendered_run):
    """Each rank of a LeaderWorkerSet, as the kubelet runs it, is one vLLM instance of TP 8 x PP 2 over two nodes
    with the multiprocessing backend: rank 0 the leader, rank 1 a worker that reaches it at LWS's leader address."""
    ranks = {n: e for n, e in rendered.items() if e["example"] == MULTINODE}
    assert set(ranks) == {f"kimi-k2-{r}-{k}" for r in ROLES for k in ("leader", "worker")}
    results = rendered_run.by_name()
    for name, entry in ranks.items():
        engine = results[name]["engine_config"]
        assert engine is not None, f"{name}: {results[name]['errors']}"
        leader = name.endswith("-leader")
        want = {
            "tensor_parallel_size": 8,
            "pipeline_parallel_size": 2,
            "world_size": 16,
            "nnodes": 2,
            "node_rank": 0 if leader else 1,
            "master_addr": f"kimi-k2-{entry['role']}-0.kimi-k2-{entry['role']}-0.default",
            "distributed_executor_backend": "mp",
            "max_model_len": 131072,
        }
        assert {k: engine[k] for k in want} == want, name
        assert ("--headless" in entry["argv"]) is not leader, name
        kv = results[name]["kv_transfer_config"]
        assert kv["kv_role"] == ("kv_producer" if entry["role"] == "prefill" else "kv_consumer"), name
        assert kv["kv_connector_extra_config"]["bidirectional_kv_xfer"] is True


# A hand-written command line (the reference launch of the protocol doc, section 4.1, with the keys vLLM 0.33 still
# has) for the negative cases: each case changes one thing, and the unchanged line must pass.
GOOD_KV = {
    "kv_connector": "NixlConnector",
    "kv_buffer_device": "cuda",
    "kv_role": "kv_producer",
    "engine_id": "prefill-engine-001",
    "kv_load_failure_policy": "recompute",
    "kv_connector_extra_config": {
        "backends": ["LIBFABRIC"],
        "kv_recompute_threshold": 64,
        "decoder_kv_blocks_ttl": 480,
        "kv_lease_duration": 30,
        "bidirectional_kv_xfer": True,
    },
}


def _hand_written(name: str, kv: dict[str, Any] | None = None, tp: str = "8") -> dict[str, Any]:
    argv = [
        "vllm",
        "serve",
        "Qwen/Qwen3-32B",
        "--served-model-name",
        "Qwen",
        "--dtype",
        "bfloat16",
        "--tensor-parallel-size",
        tp,
        "--max-model-len",
        "32768",
        "--max-num-seqs",
        "8",
        "--port",
        "8100",
        "--kv-transfer-config",
        json.dumps(GOOD_KV if kv is None else kv),
    ]
    return {"name": name, "argv": argv, "device": "cuda"}


def _extra(**changes: Any) -> dict[str, Any]:
    return {**GOOD_KV, "kv_connector_extra_config": {**GOOD_KV["kv_connector_extra_config"], **changes}}


NEGATIVE = {
    # name: (entry, the check that must fail, words its message must contain)
    "kv-role-bogus": (_hand_written("kv-role-bogus", {**GOOD_KV, "kv_role": "kv_bogus"}), "parse", "kv_role"),
    "tp-not-an-int": (_hand_written("tp-not-an-int", tp="eight"), "parse", "--tensor-parallel-size"),
    "unknown-kv-key": (_hand_written("unknown-kv-key", {**GOOD_KV, "kv_bogus_field": 1}), "parse", "kv_bogus_field"),
    # The blog's launch line carries kv_rank / kv_parallel_size, which KVTransferConfig no longer has.
    "legacy-kv-rank": (
        _hand_written("legacy-kv-rank", {**GOOD_KV, "kv_rank": 0, "kv_parallel_size": 2}),
        "parse",
        "kv_rank",
    ),
    # vLLM ignores extra keys it does not read, so a typo would silently switch the feature off.
    "extra-key-typo": (
        _hand_written("extra-key-typo", _extra(bidirectional_kv_transfer=True)),
        "extra_config_keys_read",
        "bidirectional_kv_transfer",
    ),
    # vLLM uses the raw value, and the string "false" is truthy.
    "bool-as-string": (
        _hand_written("bool-as-string", _extra(bidirectional_kv_xfer="false")),
        "extra_config",
        "bidirectional_kv_xfer",
    ),
    "tp-not-dividing-heads": (_hand_written("tp-not-dividing-heads", tp="3"), "engine_config", "divisible"),
}


@pytest.fixture(scope="module")
def negative_run(vllm_check):
    return vllm_check([_hand_written("control"), *(entry for entry, _, _ in NEGATIVE.values())])


def test_the_unchanged_hand_written_line_passes(negative_run):
    control = negative_run.by_name()["control"]
    assert control["ok"], control["errors"]


def test_checker_exits_non_zero_when_any_line_is_rejected(negative_run):
    assert negative_run.returncode == 1


@pytest.mark.parametrize("name", list(NEGATIVE))
def test_checker_rejects(name, negative_run):
    _, check, words = NEGATIVE[name]
    result = negative_run.by_name()[name]
    assert not result["ok"], f"{name} was accepted: {result['checks']}"
    failed = [c for c in result["checks"] if c["status"] == "failed"]
    assert [c["check"] for c in failed][:1] == [check], f"{name}: failed checks {failed}"
    assert words in failed[0]["detail"], failed[0]["detail"]
