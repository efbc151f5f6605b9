"""The router's own per-request work as the history grows: the pure-Python steps it runs for every turn (parse the
body, digest the history for the reuse check and the record, build and serialize both legs, parse decode's reply),
timed in-process with the router's functions at 1k, 8k and 32k-token histories. The load test keeps histories short
(the simulated engines hash every token), so this shows what long agentic conversations cost the router."""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable
from typing import Any

from duplex_sidecars import protocol
from duplex_sidecars.router import jsonio
from duplex_sidecars.router.history import (
    CHAT_ROUTE,
    History,
    Reply,
    canonical,
    header_tenant,
    normalize_message,
    scope_digest,
    state_key,
)

_WORDS = tuple(a + b for a in "bcdfghklmnprstvz" for b in ("a", "e", "i", "o", "u", "ar", "en", "is"))


def _message(rng: random.Random, role: str, words: int) -> dict[str, Any]:
    return {"role": role, "content": " ".join(rng.choice(_WORDS) for _ in range(words))}


def _conversation(tokens: int, rng: random.Random) -> tuple[list[dict[str, Any]], str]:
    """System prompt plus alternating user/assistant messages of ~200 words (one word ~ one token); the reply that
    will come back for the last user message."""
    messages = [_message(rng, "system", 300)]
    while sum(len(m["content"].split()) for m in messages) < tokens:
        messages.append(_message(rng, "user", 200))
        messages.append(_message(rng, "assistant", 200))
    messages.append(_message(rng, "user", 200))
    return messages, _message(rng, "assistant", 200)["content"]


def _kv(blocks: int, rng: random.Random, decode: bool) -> dict[str, Any]:
    return {
        "do_remote_prefill": not decode,
        "do_remote_decode": decode,
        "remote_block_ids": [rng.sample(range(131072), blocks)],
        "remote_engine_id": "decode-0" if decode else "prefill-0",
        "remote_request_id": "chatcmpl-" + "ab" * 20,
        "remote_host": "10.0.3.17",
        "remote_port": 5600,
        "tp_size": 1,
        "dcp_size": 1,
        "pp_size": 1,
        "remote_num_tokens": blocks * 16 - 3,
        "remote_blocks_expiry_time": 12345.6 if decode else None,
        "transfer_mode": "pull",
    }


def _time(fn: Callable[[], Any], budget: float = 0.4) -> float:
    """Median-free but steady: run `fn` for ~budget seconds (at least 5 times); mean microseconds per call."""
    fn()
    n, start = 0, time.perf_counter()
    while n < 5 or time.perf_counter() - start < budget:
        fn()
        n += 1
    return (time.perf_counter() - start) / n * 1e6


def measure(tokens: int, budget: float = 0.4) -> dict[str, Any]:
    rng = random.Random(tokens)
    messages, reply_text = _conversation(tokens, rng)
    body = {"model": "m", "messages": messages, "max_tokens": 256, "stream": False, "conversation_id": "c-1"}
    raw = json.dumps(body).encode()
    blocks = tokens // 16
    previous = History.of_request(CHAT_ROUTE, {"messages": messages[:-2]})
    assert previous is not None
    covered = previous.covered_with(Reply(content=messages[-2]["content"], finish_reason="stop"))
    stored = protocol.replayable_decode_params(_kv(blocks, rng, decode=True))
    assert stored is not None
    prefill_reply = json.dumps(
        {
            "id": "x",
            "choices": [{"index": 0, "text": "a", "finish_reason": "length"}],
            protocol.KV_PARAMS_FIELD: _kv(blocks, rng, decode=False),
        }
    ).encode()
    decode_reply_raw = json.dumps(
        {
            "id": "y",
            "object": "chat.completion",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": reply_text}, "finish_reason": "stop"}],
            protocol.KV_PARAMS_FIELD: _kv(blocks + 13, rng, decode=True),
        }
    ).encode()
    parsed, _ = jsonio.loads(raw)
    parsed.pop("conversation_id")
    encoded = [canonical(normalize_message(m)) for m in parsed["messages"]]
    generated = Reply(content=reply_text, finish_reason="stop")
    assert History.of_request(CHAT_ROUTE, parsed).matches(covered)

    def parse() -> None:
        b, _ = jsonio.loads(raw)
        b.pop("conversation_id")
        key = state_key(header_tenant([None]), b["model"], "c-1")
        History.of_request(CHAT_ROUTE, b)
        scope_digest(CHAT_ROUTE, b)
        assert key

    def digests() -> None:
        # A request's history answers the reuse check, then (sharing the hash of the covered prefix) the record.
        history = History("messages", messages=encoded)
        assert history.matches(covered)
        history.covered_with(generated)

    def decode_reply() -> None:
        body, ok = jsonio.loads(decode_reply_raw)
        protocol.replayable_decode_params(body.pop(protocol.KV_PARAMS_FIELD))
        jsonio.dumps(body, ok)

    steps = {
        "parse + history digest": parse,
        "reuse check + record digest": digests,
        "prefill leg body": lambda: jsonio.dumps(protocol.prefill_leg_body(parsed, protocol.replay_params(stored))),
        "decode leg body": lambda: jsonio.dumps(
            protocol.decode_leg_body(parsed, jsonio.loads(prefill_reply)[0][protocol.KV_PARAMS_FIELD])
        ),
        "decode reply (parse, params, re-serialize)": decode_reply,
    }
    us = {name: _time(fn, budget) for name, fn in steps.items()}
    return {
        "tokens": tokens,
        "messages": len(messages),
        "body_bytes": len(raw),
        "block_ids": blocks,
        "steps_us": {k: round(v, 1) for k, v in us.items()},
        "total_us": round(sum(us.values()), 1),
    }


def run(sizes: list[int], budget: float = 0.4) -> list[dict[str, Any]]:
    return [measure(n, budget) for n in sizes]


if __name__ == "__main__":
    for row in run([1024, 8192, 32768]):
        print(json.dumps(row))
