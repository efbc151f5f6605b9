"""Each change to the engine pods is classified by what it does to their KV, from the rendered templates: compatible
(old and new pods still exchange blocks) or incompatible (what vLLM's NIXL handshake refuses to pair, or what changes
the tokens). The verdict goes to status.engineChange and an Event, once per change."""

from __future__ import annotations

from typing import Any

import pytest
from dsv_helpers import spec
from sync_helpers import LIVE, READY, T1, parent

from duplex.children.engine import engine_workload
from duplex.kv_change import classify
from duplex.sync import sync


def templates(patch: dict[str, Any] | None = None) -> dict[str, dict[str, Any]]:
    s = spec(patch)
    return {r: engine_workload(s, "demo", "ns1", r, "uid-key")["spec"]["template"] for r in ("prefill", "decode")}


BASE = templates()


@pytest.mark.parametrize(
    ("patch", "roles"),
    [
        ({"decode": {"cpu": "16", "memory": "64Gi"}}, ("decode",)),
        ({"prefill": {"maxNumSeqs": 8, "maxNumBatchedTokens": 8192}}, ("prefill",)),
        ({"decode": {"tolerations": [{"key": "spot", "operator": "Exists"}]}}, ("decode",)),
        ({"model": {"env": [{"name": "VLLM_LOGGING_LEVEL", "value": "DEBUG"}]}}, ("prefill", "decode")),
        ({"decode": {"tensorParallelSize": 2}}, ("decode",)),  # decode above prefill: every pair is served
        ({"kvTransfer": {"leaseDuration": 60}}, ("prefill", "decode")),
        ({"decode": {"drain": {"deadlineSeconds": 60}}}, ("decode",)),
    ],
    ids=["resources", "scheduler knobs", "scheduling", "env", "decode tp up", "lease", "drain"],
)
def test_kv_compatible_changes(patch: dict[str, Any], roles: tuple[str, ...]) -> None:
    change = classify(BASE, templates(patch))
    assert change is not None and (change.verdict, change.roles, change.fields) == ("Compatible", roles, ())


@pytest.mark.parametrize(
    ("patch", "fields"),
    [
        ({"model": {"image": "vllm/vllm-openai:v0.34.0"}}, ("image",)),
        ({"model": {"name": "org/other-model"}}, ("model",)),
        ({"model": {"dtype": "float16"}}, ("dtype",)),
        ({"model": {"blockSize": 32}}, ("blockSize",)),
        ({"model": {"extraArgs": ["--kv-cache-dtype", "fp8"]}}, ("kvCacheDtype",)),
        ({"model": {"extraArgs": ["--revision=abc123"]}}, ("revision",)),
        ({"model": {"extraArgs": ["--chat-template", "/t/agent.jinja"]}}, ("chatTemplate",)),
        ({"model": {"env": [{"name": "VLLM_ATTENTION_BACKEND", "value": "FLASHINFER"}]}}, ("attentionBackend",)),
        # an old decode of TP 1 would meet a new prefill of TP 2
        ({"prefill": {"tensorParallelSize": 2}, "decode": {"tensorParallelSize": 2}}, ("tensorParallelSize",)),
    ],
    ids=["image", "model", "dtype", "block size", "kv cache dtype", "revision", "chat template", "backend", "tp"],
)
def test_kv_incompatible_changes_name_their_fields(patch: dict[str, Any], fields: tuple[str, ...]) -> None:
    change = classify(BASE, templates(patch))
    assert change is not None and (change.verdict, change.fields) == ("Incompatible", fields)
    assert ", ".join(fields) in change.message()


def test_no_roll_no_verdict() -> None:
    assert classify(BASE, templates({"decode": {"replicas": 4}})) is None  # replicas are not in the template
    assert classify({"prefill": None, "decode": None}, BASE) is None  # a first start rolls nothing


def test_a_pass_that_rolls_engines_posts_the_verdict_once_and_keeps_it_in_status() -> None:
    changed = parent({"model": {"blockSize": 32}}, generation=4)
    result = sync(changed, LIVE, READY, at=T1)
    (event,) = [e for e in result.events if e.reason.startswith("EngineChange")]
    assert (event.type, event.reason) == ("Warning", "EngineChangeKVIncompatible")
    assert "blockSize changed" in event.message and "recomputes its next turn once" in event.message
    assert result.status.engine_change is not None
    assert result.status.engine_change.model_dump(by_alias=True) == {
        "kv": "Incompatible",
        "roles": ["prefill", "decode"],
        "fields": ["blockSize"],
        "observedGeneration": 4,
    }
    compatible = sync(parent({"decode": {"cpu": "16"}}), LIVE, READY, at=T1)
    assert [e.reason for e in compatible.events if e.reason.startswith("EngineChange")] == ["EngineChangeKVCompatible"]
    assert not [e for e in sync(parent(), LIVE, READY, at=T1).events if e.reason.startswith("EngineChange")]
