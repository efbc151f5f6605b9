"""What a change to the engine pods does to the KV they hold: KV-compatible (old and new pods still exchange blocks,
so conversations keep their reuse through the roll) or KV-incompatible (they cannot: each conversation recomputes
once, on the new pods).

Derived from the rendered pod templates, never from a list the user keeps: the live Deployment's template against
the desired one. What counts is what vLLM's NIXL handshake refuses to pair (its compatibility hash: vLLM version,
model, dtype, KV cache dtype, attention backend, speculative decoding, the hybrid KV cache manager) or checks at run
time (block size, and tensor parallelism where a decode would have fewer ranks than a prefill), plus what changes
the tokens a block stands for (revision, tokenizer, chat template) and the transfer itself (connector, backend,
buffer device). Replicas, resources, scheduling and scheduler knobs are none of these.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from duplex.children.labels import ENGINE_HASH_ANNOTATION

# vLLM flags whose value changes the KV layout or the tokens, and the name the verdict gives them.
KV_FLAGS = {
    "--dtype": "dtype",
    "--block-size": "blockSize",
    "--kv-cache-dtype": "kvCacheDtype",
    "--attention-backend": "attentionBackend",
    "--quantization": "quantization",
    "-q": "quantization",
    "--revision": "revision",
    "--code-revision": "revision",
    "--tokenizer": "tokenizer",
    "--tokenizer-revision": "tokenizer",
    "--tokenizer-mode": "tokenizer",
    "--chat-template": "chatTemplate",
    "--speculative-config": "speculativeConfig",
    "--hf-overrides": "hfOverrides",
    "--disable-hybrid-kv-cache-manager": "hybridKVCacheManager",
    # the layers each rank holds (vLLM sends pp_size with every block list)
    "--pipeline-parallel-size": "pipelineParallelSize",
    "-pp": "pipelineParallelSize",
}
KV_ENV = {"VLLM_ATTENTION_BACKEND": "attentionBackend"}
KV_TRANSFER_KEYS = {"kv_connector": "kvConnector", "kv_buffer_device": "kvBufferDevice"}
TP_FLAGS = ("--tensor-parallel-size", "-tp")

Verdict = Literal["Compatible", "Incompatible"]


@dataclass(frozen=True)
class EngineChange:
    verdict: Verdict
    roles: tuple[str, ...]  # the roles whose pods roll
    fields: tuple[str, ...]  # why it is incompatible (empty when compatible)

    def message(self) -> str:
        rolling = " and ".join(self.roles)
        if self.verdict == "Compatible":
            return f"{rolling} roll KV-compatibly: old and new pods exchange blocks, conversations keep their reuse"
        return (
            f"{rolling} roll KV-incompatibly ({', '.join(self.fields)} changed): old and new pods cannot exchange "
            "blocks, so each conversation recomputes its next turn once on the new pods"
        )


def _flags(args: list[str]) -> dict[str, str]:
    """`--flag value`, `--flag=value` and bare switches, by flag."""
    out: dict[str, str] = {}
    i = 0
    while i < len(args):
        arg = args[i]
        if arg.startswith("-"):
            name, eq, value = arg.partition("=")
            if not eq and i + 1 < len(args) and not args[i + 1].startswith("-"):
                value, i = args[i + 1], i + 1
            out[name] = value
        i += 1
    return out


def _container(template: Mapping[str, Any]) -> Mapping[str, Any]:
    containers = ((template.get("spec") or {}).get("containers")) or [{}]
    return next((c for c in containers if c.get("name") == "vllm"), containers[0])


def kv_identity(template: Mapping[str, Any]) -> dict[str, str]:
    """The fields of an engine pod template that old and new pods must share to exchange blocks."""
    ctr = _container(template)
    args = [str(a) for a in ctr.get("args") or []]
    flags = _flags(args[1:])
    out = {"image": str(ctr.get("image", "")), "model": args[0] if args else ""}
    for flag, name in KV_FLAGS.items():
        if flag in flags:
            out[name] = f"{out.get(name, '')}{flag}={flags[flag]};"
    env = {e.get("name"): e.get("value") for e in ctr.get("env") or []}
    for var, name in KV_ENV.items():
        if env.get(var) is not None:
            out[name] = f"{out.get(name, '')}{var}={env[var]};"
    try:
        transfer = json.loads(flags.get("--kv-transfer-config", "{}"))
    except ValueError:
        transfer = {}
    for key, name in KV_TRANSFER_KEYS.items():
        out[name] = str(transfer.get(key))
    out["kvBackends"] = str((transfer.get("kv_connector_extra_config") or {}).get("backends"))
    return out


def tensor_parallel(template: Mapping[str, Any]) -> int:
    flags = _flags([str(a) for a in (_container(template).get("args") or [])[1:]])
    value = next((flags[f] for f in TP_FLAGS if f in flags), "1")
    return int(value) if value.isdigit() else 1


def _hash(template: Mapping[str, Any]) -> str | None:
    return ((template.get("metadata") or {}).get("annotations") or {}).get(ENGINE_HASH_ANNOTATION)


def classify(
    live: Mapping[str, Mapping[str, Any] | None],
    desired: Mapping[str, Mapping[str, Any]],
    decode_tp_below: bool = False,
    complete: Mapping[str, Mapping[str, Any]] | None = None,
) -> EngineChange | None:
    """`live`/`desired`: pod templates by role (live None: no Deployment yet; desired: the roles applied now).
    None when no engine pod rolls. `complete`: both roles' templates after the change (default `desired`), for the
    pairs that meet during the roll; `decode_tp_below`: kvTransfer.allowDecodeTPBelowPrefill, under which any
    TP pairing is accepted."""
    rolling = tuple(r for r, t in desired.items() if live.get(r) is not None and _hash(live[r] or {}) != _hash(t))
    if not rolling:
        return None
    fields: set[str] = set()
    for role in rolling:
        old, new = kv_identity(live[role] or {}), kv_identity(desired[role])
        fields |= {name for name in old.keys() | new.keys() if old.get(name) != new.get(name)}
    after = complete if complete is not None else desired
    if not decode_tp_below:
        # During the roll any old or new prefill may meet any old or new decode: each pair must be one vLLM serves.
        prefills = {tensor_parallel(t) for t in (live.get("prefill"), after.get("prefill")) if t is not None}
        decodes = {tensor_parallel(t) for t in (live.get("decode"), after.get("decode")) if t is not None}
        if any(d < p for p in prefills for d in decodes):
            fields.add("tensorParallelSize")
    return EngineChange("Incompatible" if fields else "Compatible", rolling, tuple(sorted(fields)))
