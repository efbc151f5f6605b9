"""Every answer carries a receipt (router/receipt.py): a Server-Timing header with the router's, prefill's and
decode's share of the time to the first byte and the reuse verdict, streamed or not, naming no engine; the anonymous
tenant's misses carry no reason."""

from __future__ import annotations

from typing import Any

import pytest

from duplex_sidecars.router.receipt import Receipt, parse, server_timing, verdict

USER = {"role": "user", "content": "hi"}
KEYED = {"Authorization": "Bearer tenant-a"}


def test_the_router_is_what_prefill_and_decode_leave_of_the_time_to_the_first_byte():
    assert (
        server_timing(0.25, 0.2, 0.04, "hit:512")
        == 'router;dur=10.0, prefill;dur=200.0, decode;dur=40.0, kv;desc="hit:512"'
    )
    assert server_timing(0.01, None, None, "miss") == 'router;dur=10.0, kv;desc="miss"'
    assert verdict(True, 512, None, shared_tenant=True) == "hit:512"
    assert verdict(False, 0, "expired", shared_tenant=False) == "miss:expired"
    assert verdict(False, 0, "expired", shared_tenant=True) == "miss"


def test_a_receipt_reads_back_as_it_was_written_and_anything_else_is_refused():
    hit = parse(server_timing(0.25, 0.2, 0.04, "hit:512"))
    assert hit == Receipt(0.01, 0.2, 0.04, "hit:512")
    assert (hit.hit, hit.tokens, hit.reason) == (True, 512, None)
    assert hit.to_first_byte == pytest.approx(0.25)
    miss = parse(server_timing(0.01, None, None, "miss:revision_changed"))
    assert (miss.hit, miss.tokens, miss.reason, miss.prefill) == (False, 0, "revision_changed", None)
    assert parse('router;dur=1.0, kv;desc="miss"').reason is None  # the anonymous tenant's
    for bad in ("", "router;dur=1.0", 'kv;desc="hit:1"', 'router;dur=1, kv;desc="hit:x"', "cdn;dur=3"):
        with pytest.raises(ValueError):
            parse(bad)


@pytest.mark.parametrize("stream", [False, True])
async def test_each_turn_says_where_its_time_went_and_whether_it_reused(make_rig, stream: bool):
    rig = await make_rig()
    first: dict[str, Any] = {}
    _, out, first = await rig.post("/v1/chat/completions", body(stream, [USER]), headers=KEYED)
    text = reply(out, stream)
    receipt = parse(first["Server-Timing"])
    assert receipt.reason == "no_entry"
    assert receipt.prefill is not None and receipt.decode is not None
    history = [USER, {"role": "assistant", "content": text}, {"role": "user", "content": "more"}]
    _, _, again = await rig.post("/v1/chat/completions", body(stream, history), headers=KEYED)
    assert parse(again["Server-Timing"]).kv == "hit:42"  # the fake decode engine's remote_num_tokens
    assert "127.0.0.1" not in again["Server-Timing"] and "d0" not in again["Server-Timing"]


async def test_the_anonymous_tenant_is_told_no_miss_reason_and_receipts_can_be_off(make_rig):
    rig = await make_rig()
    _, _, headers = await rig.post("/v1/chat/completions", body(False, [USER]))
    assert parse(headers["Server-Timing"]).kv == "miss"
    off = await make_rig(receipts=False)
    _, _, headers = await off.post("/v1/chat/completions", body(False, [USER]))
    assert "Server-Timing" not in headers


def body(stream: bool, messages: list[dict[str, Any]]) -> dict[str, Any]:
    return {"model": "m", "messages": messages, "stream": stream, "conversation_id": "c1"}


def reply(out: Any, stream: bool) -> str:
    if not stream:
        return str(out["choices"][0]["message"]["content"])
    return "".join(
        e["choices"][0]["delta"].get("content") or "" for e in out if isinstance(e, dict) and e.get("choices")
    )
