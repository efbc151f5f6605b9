"""The `kv_transfer_params` shapes of vLLM's NixlConnector P-D protocol with bidirectional transfer.

One place for the wire contract: the router, the engine simulator and the tests import these names.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# What the router sends on a prefill leg when it has nothing safe to replay (plain recompute).
MISS_PARAMS: dict[str, Any] = {
    "do_remote_decode": True,
    "do_remote_prefill": False,
    "remote_engine_id": None,
    "remote_block_ids": None,
    "remote_host": None,
    "remote_port": None,
}

# Keys of decode's final kv_transfer_params that the router stores and may replay to prefill; nothing else.
REPLAY_KEYS: tuple[str, ...] = (
    "remote_engine_id",
    "remote_request_id",
    "remote_host",
    "remote_port",
    "remote_block_ids",
    "remote_num_tokens",
    "remote_blocks_expiry_time",
    "tp_size",
    "dcp_size",
    "pp_size",
    "transfer_mode",
)

# Keys without which a decode reply cannot be replayed.
REQUIRED_DECODE_KEYS: tuple[str, ...] = (
    "remote_engine_id",
    "remote_request_id",
    "remote_host",
    "remote_port",
    "remote_block_ids",
    "remote_num_tokens",
)

# Request fields the prefill leg must not carry (restored on the decode leg, as vLLM's reference proxy does).
PREFILL_DROPPED_FIELDS: tuple[str, ...] = ("stream_options", "min_tokens", "min_completion_tokens")

KV_PARAMS_FIELD = "kv_transfer_params"

# The KV revision an engine runs (the operator's, 8 lowercase hex characters): the engine reads it from KV_REVISION_ENV
# and sends it on its answers in KV_REVISION_HEADER; the router pairs prefill and decode of one revision only, since
# NIXL refuses (or misreads) blocks of another. The engine guard (operator/duplex/children/duplex_engine_guard.py)
# repeats both names: it runs inside vLLM with the standard library only.
KV_REVISION_HEADER = "X-Duplex-KV-Revision"
KV_REVISION_ENV = "DUPLEX_KV_REVISION"


def miss_params() -> dict[str, Any]:
    """A fresh copy of the miss payload."""
    return dict(MISS_PARAMS)


def block_count(block_ids: Any) -> int:
    """Number of blocks in `remote_block_ids`, which is a flat list or a list per KV cache group."""
    if not isinstance(block_ids, list) or not block_ids:
        return 0
    if all(isinstance(b, list) for b in block_ids):
        return max((len(g) for g in block_ids), default=0)
    return len(block_ids)


def replayable_decode_params(params: Any) -> dict[str, Any] | None:
    """The allow-listed subset of decode's final params, or None when they cannot be replayed safely."""
    if not isinstance(params, dict) or params.get("do_remote_decode") is not True:
        return None
    if any(params.get(k) in (None, "", []) for k in REQUIRED_DECODE_KEYS):
        return None
    if block_count(params["remote_block_ids"]) == 0:
        return None
    num_tokens = params.get("remote_num_tokens")
    if not isinstance(num_tokens, int) or isinstance(num_tokens, bool) or num_tokens <= 0:
        return None
    return {k: params[k] for k in REPLAY_KEYS if k in params}


def replay_params(stored: dict[str, Any]) -> dict[str, Any]:
    """The prefill leg's params for a hit: decode's stored metadata, marked as a P-side request."""
    out = {k: stored[k] for k in REPLAY_KEYS if k in stored}
    out["do_remote_decode"] = True
    out["do_remote_prefill"] = False
    return out


@dataclass(frozen=True)
class LegShape:
    """How a client API's request becomes the prefill leg: its token limit (the first field always set to 1, the
    others when present) and the fields prefill must not carry."""

    max_tokens: tuple[str, ...] = ("max_tokens", "max_completion_tokens")
    dropped: tuple[str, ...] = PREFILL_DROPPED_FIELDS


OPENAI_LEGS = LegShape()


def prefill_leg_body(
    client_body: dict[str, Any], kv_params: dict[str, Any], shape: LegShape = OPENAI_LEGS
) -> dict[str, Any]:
    """The body sent to prefill: the client's request capped at one token, non-streaming, with kv params."""
    body = {k: v for k, v in client_body.items() if k not in shape.dropped}
    body["stream"] = False
    body[shape.max_tokens[0]] = 1
    for name in shape.max_tokens[1:]:
        if name in body:
            body[name] = 1
    body[KV_PARAMS_FIELD] = kv_params
    return body


def decode_leg_body(client_body: dict[str, Any], prefill_params: dict[str, Any] | None) -> dict[str, Any]:
    """The body sent to decode: the client's own request plus prefill's params, unchanged."""
    body = dict(client_body)
    if prefill_params:
        body[KV_PARAMS_FIELD] = prefill_params
    else:
        body.pop(KV_PARAMS_FIELD, None)
    return body


# Where the params may sit inside an answer object besides its top level: OpenAI's choices, and the response or
# message object that Responses and Anthropic stream events wrap.
_NESTED_IN = ("response", "message")


def strip_kv_params(obj: Any) -> tuple[Any, bool]:
    """Remove kv_transfer_params from an answer object or stream event, in place: its top level, each choice, and a
    wrapped response or message object. Returns the params (the first found) and whether the field was there at
    all, even as null. Nothing engine-internal may reach a client."""
    if not isinstance(obj, dict):
        return None, False
    found = KV_PARAMS_FIELD in obj
    params = obj.pop(KV_PARAMS_FIELD, None)
    holders = (
        [c for c in obj.get("choices") or () if isinstance(c, dict)] if isinstance(obj.get("choices"), list) else []
    )
    holders += [obj[k] for k in _NESTED_IN if isinstance(obj.get(k), dict)]
    for holder in holders:
        if KV_PARAMS_FIELD in holder:
            found = True
            nested = holder.pop(KV_PARAMS_FIELD)
            if params is None:
                params = nested
    return params, found


def pop_kv_params(obj: Any) -> Any:
    """`strip_kv_params`, returning only the params."""
    return strip_kv_params(obj)[0]
