"""The router's request flow against fake engines: legs, reuse decisions, stripping, retries and stream errors."""

from __future__ import annotations

import asyncio
import json
import socket
import statistics
import time

import pytest

from duplex_sidecars import protocol
from duplex_sidecars.router.endpoints import DECODE
from duplex_sidecars.router.store import MemoryStore

USER = {"role": "user", "content": "What is the capital of France?"}


def kv_in(seen) -> dict:
    return seen.body.get("kv_transfer_params")


async def two_turns(rig, stream: bool = False, conv: str = "c1", **extra):
    status, out, text = await rig.chat([USER], conv=conv, stream=stream, **extra)
    assert status == 200, out
    history = [USER, {"role": "assistant", "content": text}, {"role": "user", "content": "And of Spain?"}]
    status2, out2, _ = await rig.chat(history, conv=conv, stream=stream, **extra)
    assert status2 == 200, out2
    return history, out, out2


async def test_turn_two_replays_decodes_blocks_to_prefill(make_rig):
    rig = await make_rig()
    await two_turns(rig)
    p1, p2 = rig.p.seen
    d1, _d2 = rig.d.seen
    assert kv_in(p1) == protocol.miss_params()
    expected = protocol.replay_params(rig.d.d_params(d1.headers["X-Request-Id"]))
    assert kv_in(p2) == expected
    assert kv_in(p2)["remote_blocks_expiry_time"] == 1234.5  # forwarded unchanged
    # prefill leg shape; decode leg gets prefill's params unchanged and the client's own settings
    assert p1.body["stream"] is False and p1.body["max_tokens"] == 1
    assert kv_in(d1) == rig.p.p_params(p1.headers["X-Request-Id"])
    assert "max_tokens" not in d1.body and d1.body["stream"] is False
    for seen in rig.p.seen + rig.d.seen:
        assert "conversation_id" not in seen.body
    assert p1.headers["X-Request-Id"] == d1.headers["X-Request-Id"]
    assert rig.metric("duplex_router_kv_reuse_hits_total") == 1
    assert rig.metric("duplex_router_kv_reused_tokens_total") == 42
    assert rig.metric("duplex_router_kv_reuse_misses_total", reason="no_entry") == 1


async def test_streaming_turns_reuse_and_never_leak_params(make_rig):
    rig = await make_rig()
    _, out1, out2 = await two_turns(rig, stream=True, stream_options={"include_usage": True})
    for events in (out1, out2):
        assert events[-1] == "[DONE]"
        assert all("kv_transfer_params" not in e for e in events if isinstance(e, dict))
        assert events[-2]["choices"][0]["finish_reason"] == "stop"
    assert kv_in(rig.p.seen[1])["remote_engine_id"] == "d0"
    assert "stream_options" not in rig.p.seen[0].body
    assert rig.d.seen[0].body["stream_options"] == {"include_usage": True}
    assert rig.metric("duplex_router_kv_reuse_hits_total") == 1


async def test_non_streaming_body_has_no_params(make_rig):
    rig = await make_rig()
    status, out, _ = await rig.chat([USER])
    assert status == 200 and "kv_transfer_params" not in out
    status, out, _ = await rig.post("/v1/completions", {"model": "m", "prompt": "Once upon", "conversation_id": "x"})
    assert status == 200 and "kv_transfer_params" not in out


async def test_client_supplied_kv_params_never_reach_engines(make_rig):
    rig = await make_rig()
    evil = {
        "do_remote_decode": True,
        "remote_engine_id": "victim",
        "remote_block_ids": [[1]],
        "remote_host": "x",
        "remote_port": 1,
        "remote_request_id": "r",
        "remote_num_tokens": 100,
    }
    status, _, _ = await rig.chat([USER], conv=None, kv_transfer_params=evil)
    assert status == 200
    assert kv_in(rig.p.seen[0]) == protocol.miss_params()
    assert kv_in(rig.d.seen[0])["remote_engine_id"] == "p0"


async def test_conversation_id_from_header(make_rig):
    rig = await make_rig()
    _status, _, text = await rig.chat([USER], conv=None, headers={"X-Conversation-Id": "h1"})
    history = [USER, {"role": "assistant", "content": text}, {"role": "user", "content": "more"}]
    await rig.chat(history, conv=None, headers={"X-Conversation-Id": "h1"})
    assert kv_in(rig.p.seen[1])["remote_engine_id"] == "d0"


async def test_with_id_keying_a_request_without_id_stores_nothing(make_rig):
    rig = await make_rig(conversation={"keying": "id"})
    _, _, text = await rig.chat([USER], conv=None)
    await rig.chat([USER, {"role": "assistant", "content": text}, {"role": "user", "content": "more"}], conv=None)
    assert await rig.router.store.size() == 0
    assert rig.metric("duplex_router_kv_reuse_misses_total", reason="no_conversation_id") == 2
    assert rig.metric("duplex_router_kv_captures_total", outcome="not_stored") == 2


async def test_a_client_without_conversation_id_gets_reuse_keyed_by_its_history(make_rig):
    # The plain OpenAI SDK: no extra field, no header. The history up to its last assistant turn finds the entry.
    rig = await make_rig()
    status, _, text = await rig.chat([USER], conv=None)
    assert status == 200
    assert rig.metric("duplex_router_kv_reuse_misses_total", reason="no_prior_turn") == 1
    history = [USER, {"role": "assistant", "content": text}, {"role": "user", "content": "And of Spain?"}]
    await rig.chat(history, conv=None)
    assert kv_in(rig.p.seen[1])["remote_engine_id"] == "d0"
    assert rig.metric("duplex_router_kv_reuse_hits_total") == 1
    await rig.chat(history, conv=None)  # the same request again: the entry serves one turn
    assert rig.metric("duplex_router_kv_reuse_misses_total", reason="no_entry") == 1


@pytest.mark.parametrize(
    "change, reason",
    [
        (lambda h: [h[0], {"role": "assistant", "content": "edited"}, h[2]], "no_entry"),  # edited reply
        (lambda h: h, "hit"),
    ],
    ids=["edited", "exact"],
)
async def test_history_keying_only_matches_the_exact_history(make_rig, change, reason):
    rig = await make_rig()
    _, _, text = await rig.chat([USER], conv=None)
    history = [USER, {"role": "assistant", "content": text}, {"role": "user", "content": "next"}]
    await rig.chat(change(history), conv=None)
    if reason == "hit":
        assert rig.metric("duplex_router_kv_reuse_hits_total") == 1
    else:
        assert kv_in(rig.p.seen[1]) == protocol.miss_params()
        assert rig.metric("duplex_router_kv_reuse_misses_total", reason=reason) == 1


async def test_history_keyed_state_is_scoped_per_tenant_session_and_tools(make_rig):
    rig = await make_rig()
    alice = {"Authorization": "Bearer alice", "X-Claude-Code-Session-Id": "s1"}
    _, _, text = await rig.chat([USER], conv=None, headers=alice)
    history = [USER, {"role": "assistant", "content": text}, {"role": "user", "content": "next"}]
    for other in (
        {"Authorization": "Bearer bob", "X-Claude-Code-Session-Id": "s1"},  # another tenant
        {"Authorization": "Bearer alice", "X-Claude-Code-Session-Id": "s2"},  # another session of alice's
    ):
        await rig.chat(history, conv=None, headers=other)
    await rig.chat(history, conv=None, headers=alice, tools=[{"type": "function", "function": {"name": "f"}}])
    assert rig.metric("duplex_router_kv_reuse_hits_total") == 0
    assert rig.metric("duplex_router_kv_reuse_misses_total", reason="no_entry") == 3
    await rig.chat(history, conv=None, headers=alice)
    assert rig.metric("duplex_router_kv_reuse_hits_total") == 1  # nothing above consumed alice's entry


async def test_subagents_of_one_harness_session_do_not_take_each_others_blocks(make_rig):
    # One Claude Code session, two conversations (the main agent and a subagent): each continues its own.
    rig = await make_rig()
    session = {"X-Claude-Code-Session-Id": "session-1"}
    main, sub = USER, {"role": "user", "content": "Subtask: list the files."}
    _, _, main_text = await rig.chat([main], conv=None, headers=session)
    _, _, sub_text = await rig.chat([sub], conv=None, headers=session)
    await rig.chat(
        [sub, {"role": "assistant", "content": sub_text}, {"role": "user", "content": "go on"}],
        conv=None,
        headers=session,
    )
    await rig.chat(
        [main, {"role": "assistant", "content": main_text}, {"role": "user", "content": "go on"}],
        conv=None,
        headers=session,
    )
    assert rig.metric("duplex_router_kv_reuse_hits_total") == 2


async def test_entries_are_single_use(make_rig):
    rig = await make_rig()
    _, _, text = await rig.chat([USER])
    history = [USER, {"role": "assistant", "content": text}, {"role": "user", "content": "next"}]
    results = await asyncio.gather(*(rig.chat(history) for _ in range(5)))
    assert all(r[0] == 200 for r in results)
    replayed = [s for s in rig.p.seen[1:] if kv_in(s).get("remote_engine_id")]
    assert len(replayed) == 1
    assert rig.metric("duplex_router_kv_reuse_hits_total") == 1


async def test_tenants_are_isolated(make_rig):
    rig = await make_rig()
    alice = {"Authorization": "Bearer alice"}
    bob = {"Authorization": "Bearer bob"}
    _, _, text = await rig.chat([USER], headers=alice)
    history = [USER, {"role": "assistant", "content": text}, {"role": "user", "content": "next"}]
    await rig.chat(history, headers=bob)
    assert kv_in(rig.p.seen[1]) == protocol.miss_params()
    await rig.chat(history)  # anonymous tenant
    assert kv_in(rig.p.seen[2]) == protocol.miss_params()
    await rig.chat(history, headers=alice)
    assert kv_in(rig.p.seen[3])["remote_engine_id"] == "d0"
    assert rig.metric("duplex_router_kv_reuse_misses_total", reason="no_entry") == 3


async def test_models_scope_state(make_rig):
    rig = await make_rig()
    _, _, text = await rig.chat([USER])
    history = [USER, {"role": "assistant", "content": text}, {"role": "user", "content": "next"}]
    status, _, _ = await rig.post(
        "/v1/chat/completions", {"model": "other", "messages": history, "conversation_id": "c1"}
    )
    assert status == 200
    assert kv_in(rig.p.seen[1]) == protocol.miss_params()


async def test_edited_history_is_a_miss(make_rig):
    rig = await make_rig()
    _, _, text = await rig.chat([USER])
    edited = [USER, {"role": "assistant", "content": text + " (edited)"}, {"role": "user", "content": "next"}]
    await rig.chat(edited)
    assert kv_in(rig.p.seen[1]) == protocol.miss_params()
    assert rig.metric("duplex_router_kv_reuse_misses_total", reason="history_mismatch") == 1


async def test_changed_scope_is_a_miss(make_rig):
    rig = await make_rig()
    _, _, text = await rig.chat([USER])
    history = [USER, {"role": "assistant", "content": text}, {"role": "user", "content": "next"}]
    await rig.chat(history, tools=[{"type": "function", "function": {"name": "f", "parameters": {}}}])
    assert kv_in(rig.p.seen[1]) == protocol.miss_params()
    assert rig.metric("duplex_router_kv_reuse_misses_total", reason="scope_mismatch") == 1


@pytest.mark.parametrize("stream", [True, False])
async def test_decode_without_params_gives_the_next_turn_its_own_miss_reason(make_rig, stream, caplog):
    # vLLM before 0.33 streams no kv_transfer_params: the cause must be visible where an operator looks (the next
    # turn's miss reason, the capture per engine and mode, one log line per engine, /ready).
    rig = await make_rig()
    rig.d.actions = ["no_params", "no_params"]
    _, _, text = await rig.chat([USER], stream=stream)
    history = [USER, {"role": "assistant", "content": text}, {"role": "user", "content": "next"}]
    await rig.chat(history, stream=stream)
    assert kv_in(rig.p.seen[1]) == protocol.miss_params()
    mode = "true" if stream else "false"
    assert rig.metric("duplex_router_kv_captures_total", outcome="no_params", stream=mode, endpoint=rig.d.url) == 2
    reason = "stream_no_params" if stream else "no_params"
    assert rig.metric("duplex_router_kv_reuse_misses_total", reason=reason) == 1
    assert rig.metric("duplex_router_kv_reuse_misses_total", reason="not_replayable") == 0
    warnings = [r for r in caplog.records if "sent no kv_transfer_params" in r.getMessage()]
    assert len(warnings) == 1 and rig.d.url in warnings[0].getMessage()  # once per engine, not per turn
    async with rig.session.get(rig.url + "/ready") as resp:
        ready = await resp.json()
    seen = ready["decode"]["endpoints"][0]["kv_transfer_params"]
    assert seen == {"streamed": False, "non_streamed": None} if stream else {"streamed": None, "non_streamed": False}


async def test_a_streamed_turn_with_params_still_reuses(make_rig):
    rig = await make_rig()
    await two_turns(rig, stream=True)
    assert rig.metric("duplex_router_kv_reuse_hits_total") == 1
    assert rig.metric("duplex_router_kv_captures_total", outcome="stored", stream="true", endpoint=rig.d.url) == 2
    async with rig.session.get(rig.url + "/ready") as resp:
        ready = await resp.json()
    assert ready["decode"]["endpoints"][0]["kv_transfer_params"] == {"streamed": True, "non_streamed": None}


async def test_reasoning_reply_is_not_replayed(make_rig):
    rig = await make_rig()
    rig.d.reasoning = "let me think"
    _, _, text = await rig.chat([USER], stream=True)
    rig.d.reasoning = None
    history = [USER, {"role": "assistant", "content": text}, {"role": "user", "content": "next"}]
    await rig.chat(history)
    assert kv_in(rig.p.seen[1]) == protocol.miss_params()
    assert rig.metric("duplex_router_kv_captures_total", outcome="not_replayable") == 1
    # counted under its own reason, apart from other mismatches (vLLM #43094)
    assert rig.metric("duplex_router_kv_reuse_misses_total", reason="reasoning") == 1
    assert rig.metric("duplex_router_kv_reuse_misses_total", reason="not_replayable") == 0


async def test_stop_string_reply_is_not_replayed(make_rig):
    rig = await make_rig()
    rig.d.stop_reason = "###"
    _, _, text = await rig.chat([USER], stop=["###"])
    history = [USER, {"role": "assistant", "content": text}, {"role": "user", "content": "next"}]
    await rig.chat(history, stop=["###"])
    assert kv_in(rig.p.seen[1]) == protocol.miss_params()


async def test_completions_reuse_needs_the_prompt_to_extend(make_rig):
    rig = await make_rig()
    body = {"model": "m", "prompt": "Once upon a time", "conversation_id": "k"}
    _, out, _ = await rig.post("/v1/completions", body)
    text = out["choices"][0]["text"]
    await rig.post("/v1/completions", {**body, "prompt": "Once upon a time" + text + " and then"})
    assert kv_in(rig.p.seen[1])["remote_engine_id"] == "d0"
    _status, out, _ = await rig.post("/v1/completions", {**body, "prompt": "Once upon a time" + text})
    await rig.post("/v1/completions", {**body, "prompt": "Twice upon a time" + text})
    assert kv_in(rig.p.seen[3]) == protocol.miss_params()


async def test_decode_is_sticky_per_conversation(make_rig):
    rig = await make_rig(n_decode=3)
    for conv in ("a", "b", "c", "d", "e"):
        _, _, text = await rig.chat([USER], conv=conv)
        history = [USER, {"role": "assistant", "content": text}, {"role": "user", "content": "next"}]
        await rig.chat(history, conv=conv)
    by_conv: dict[str, set[str]] = {}
    for engine in rig.decode:
        for seen in engine.seen:
            by_conv.setdefault(seen.headers["X-Request-Id"], set()).add(engine.name)
    # every replayed prefill named the decode engine that then served the turn
    for p in rig.p.seen:
        params = kv_in(p)
        if params.get("remote_engine_id"):
            served = [
                e.name for e in rig.decode for s in e.seen if s.headers["X-Request-Id"] == p.headers["X-Request-Id"]
            ]
            assert served == [params["remote_engine_id"]]
    assert rig.metric("duplex_router_kv_reuse_hits_total") == 5


async def test_prefill_failure_retries_elsewhere_without_reuse(make_rig):
    rig = await make_rig(n_prefill=2)
    _, _, text = await rig.chat([USER])
    history = [USER, {"role": "assistant", "content": text}, {"role": "user", "content": "next"}]
    shared = [500]  # whichever prefill engine the first attempt lands on fails, once
    for engine in rig.prefill:
        engine.actions = shared
    status, _, _ = await rig.chat(history)
    assert status == 200
    turn2 = [s for e in rig.prefill for s in e.seen if s.body["messages"] == history]
    assert len(turn2) == 2
    assert {s.headers["X-Request-Id"].endswith("-p1") for s in turn2} == {True, False}
    first = next(s for s in turn2 if not s.headers["X-Request-Id"].endswith("-p1"))
    retry = next(s for s in turn2 if s.headers["X-Request-Id"].endswith("-p1"))
    assert kv_in(first)["remote_engine_id"] == "d0"  # only the first attempt carried decode's blocks
    assert kv_in(retry) == protocol.miss_params()
    assert [e for e in rig.prefill if first in e.seen] != [e for e in rig.prefill if retry in e.seen]
    assert rig.metric("duplex_router_retries_total", leg="prefill") == 1
    assert rig.metric("duplex_router_kv_reuse_misses_total", reason="prefill_retry") == 1
    assert rig.metric("duplex_router_kv_reuse_hits_total") == 0


async def test_a_replay_that_never_answers_is_abandoned_and_recomputed(make_rig):
    # vLLM 0.32 leaves a request whose read of decode's blocks failed waiting for ever: the replaying leg has a
    # budget of its own, far below the prefill leg's, and the client still gets its answer by recompute.
    rig = await make_rig(timeouts={"replay_prefill_seconds": 0.5})
    _, _, text = await rig.chat([USER])
    history = [USER, {"role": "assistant", "content": text}, {"role": "user", "content": "next"}]
    rig.p.actions = ["hang"]
    started = time.monotonic()
    status, _, _ = await rig.chat(history)
    assert status == 200 and time.monotonic() - started < 3
    replayed, recomputed = rig.p.seen[1:]
    assert kv_in(replayed)["remote_engine_id"] == "d0" and kv_in(recomputed) == protocol.miss_params()
    assert rig.metric("duplex_router_backend_errors_total", leg="prefill", kind="timeout") == 1
    assert rig.metric("duplex_router_kv_reuse_misses_total", reason="prefill_retry") == 1


async def test_prefill_failing_everywhere_is_a_502(make_rig):
    rig = await make_rig(n_prefill=2)
    for engine in rig.prefill:
        engine.actions = [500]
    status, out, _ = await rig.chat([USER])
    assert status == 502 and out["error"]["type"] == "bad_gateway"
    assert "127.0.0.1" not in out["error"]["message"]
    assert sum(len(e.seen) for e in rig.prefill) == 2


async def test_prefill_4xx_is_passed_through_without_retry(make_rig):
    rig = await make_rig(n_prefill=2)
    for engine in rig.prefill:
        engine.actions = [400]
    status, out, _ = await rig.chat([USER])
    assert status == 400 and out["error"]["message"] == "fake 400"
    assert sum(len(e.seen) for e in rig.prefill) == 1


async def test_unreachable_engines_are_a_503(make_rig):
    rig = await make_rig()
    await rig.p.close()
    status, out, _ = await rig.chat([USER])
    assert status == 503 and out["error"]["type"] == "service_unavailable"


async def test_decode_failure_before_first_byte_reruns_prefill_and_decode(make_rig):
    rig = await make_rig(n_decode=2)
    _, _, text = await rig.chat([USER])
    history = [USER, {"role": "assistant", "content": text}, {"role": "user", "content": "next"}]
    first_decode = next(e for e in rig.decode if e.seen)
    first_decode.actions = [503]
    status, out, text2 = await rig.chat(history, stream=True)
    assert status == 200 and out[-1] == "[DONE]" and text2 == "hello world again"
    p_calls = rig.p.seen[1:]
    assert len(p_calls) == 2
    assert kv_in(p_calls[0])["remote_engine_id"] == first_decode.name
    assert kv_in(p_calls[1]) == protocol.miss_params()  # a fresh prefill, no replay
    other = next(e for e in rig.decode if e is not first_decode)
    assert len(other.seen) == 1
    assert rig.metric("duplex_router_retries_total", leg="decode") == 1


async def test_a_refusing_decode_with_no_other_left_fails_at_once_without_a_second_prefill(make_rig):
    rig = await make_rig()
    await rig.d.close()
    status, out, _ = await rig.chat([USER])
    assert status in (502, 503) and set(out["error"]) >= {"message", "type"}
    assert len(rig.p.seen) == 1  # no retry's fresh prefill for an engine that just refused the connection
    assert rig.metric("duplex_router_retries_total", leg="decode") == 0


async def test_decode_dropping_before_first_byte_is_retried(make_rig):
    rig = await make_rig(n_decode=2)
    shared = ["drop", None, "drop", None]  # the first decode attempt of each request is dropped
    for engine in rig.decode:
        engine.actions = shared
    results = [await rig.chat([USER], conv=None, stream=s) for s in (True, False)]
    assert [r[0] for r in results] == [200, 200]


async def test_decode_breaking_mid_stream_ends_cleanly(make_rig):
    rig = await make_rig()
    rig.d.actions = ["break"]
    status, events, _ = await rig.chat([USER], stream=True)
    assert status == 200
    assert events[-1] == "[DONE]"
    assert events[-2]["error"]["code"] == 502
    assert events[1]["choices"][0]["delta"]["content"] == "hello"
    assert await rig.router.store.size() == 0  # a broken turn stores nothing
    assert rig.metric("duplex_router_backend_errors_total", leg="decode", kind="broken_stream") == 1


async def test_decode_stream_without_done_gets_an_error_event(make_rig):
    rig = await make_rig()
    rig.d.actions = ["trailing_garbage"]
    status, events, _ = await rig.chat([USER], stream=True)
    assert status == 200 and events[-1] == "[DONE]" and "error" in events[-2]


async def test_decode_failing_everywhere_is_a_502(make_rig):
    rig = await make_rig()
    rig.d.actions = [500, 500]
    status, out, _ = await rig.chat([USER])
    assert status == 502 and out["error"]["message"].startswith("The decode engine failed")
    assert len(rig.p.seen) == 2 and len(rig.d.seen) == 2


async def test_expired_entries_are_not_replayed(make_rig):
    rig = await make_rig(conversation={"ttl_seconds": 0.2, "engine_blocks_ttl_seconds": 1})
    _, _, text = await rig.chat([USER])
    await asyncio.sleep(0.3)
    history = [USER, {"role": "assistant", "content": text}, {"role": "user", "content": "next"}]
    await rig.chat(history)
    assert kv_in(rig.p.seen[1]) == protocol.miss_params()
    assert rig.metric("duplex_router_kv_reuse_misses_total", reason="expired") == 1
    # the turn came at least 0.3 s after the stored one, past the 0.2 s TTL: the gap says by how much
    assert rig.metric("duplex_router_turn_gap_seconds_count") == 1
    assert rig.metric("duplex_router_turn_gap_seconds_sum") >= 0.3


async def test_the_gap_between_turns_is_measured_for_each_stored_turn_found(make_rig):
    rig = await make_rig(n_decode=2)
    gone, stays = rig.decode
    texts = {}
    for conv, engine in (("a", gone), ("b", stays)):
        rig.router.engines.set_role(DECODE, [engine.url])
        texts[conv] = (await rig.chat([USER], conv=conv))[2]
    assert rig.metric("duplex_router_turn_gap_seconds_count") == 0  # first turns find nothing
    rig.router.engines.set_role(DECODE, [stays.url])  # "a"'s entry becomes an endpoint-gone tombstone
    for conv, text in texts.items():
        history = [USER, {"role": "assistant", "content": text}, {"role": "user", "content": "next"}]
        await rig.chat(history, conv=conv)
    assert rig.metric("duplex_router_kv_reuse_misses_total", reason="endpoint_gone") == 1
    # the tombstone is no measured gap (Redis stamps it when its engine left); "b"'s is, well inside the TTL
    assert rig.metric("duplex_router_turn_gap_seconds_count") == 1
    assert rig.metric("duplex_router_turn_gap_seconds_bucket", le="60.0") == 1


async def test_departed_decode_engine_drops_its_entries(make_rig):
    rig = await make_rig(n_decode=2)
    texts = {}
    for conv in ("a", "b", "c", "d"):
        texts[conv] = (await rig.chat([USER], conv=conv))[2]
    gone = rig.decode[0]
    config = rig.router.config.model_copy(update={"decode": [rig.decode[1].url]})
    await rig.router.apply(config)
    await rig.router.engines.settle()
    dropped = rig.metric("duplex_router_store_dropped_entries_total")
    assert dropped == len(gone.seen)
    for conv, text in texts.items():
        history = [USER, {"role": "assistant", "content": text}, {"role": "user", "content": "next"}]
        await rig.chat(history, conv=conv)
    assert rig.metric("duplex_router_kv_reuse_misses_total", reason="endpoint_gone") == len(gone.seen)
    assert rig.metric("duplex_router_kv_reuse_hits_total") == 4 - len(gone.seen)


async def test_blocks_on_a_decode_engine_marked_unhealthy_are_recomputed_not_read(make_rig):
    # Before: the replay went out, and prefill waited out the replay timeout on the failing engine.
    rig = await make_rig(n_decode=2)
    both = [e.url for e in rig.decode]
    rig.router.engines.set_role(DECODE, both[:1])  # "a" on d0 for certain; the rest where the picker puts them
    texts = {"a": (await rig.chat([USER], conv="a"))[2]}
    rig.router.engines.set_role(DECODE, both)
    texts |= {conv: (await rig.chat([USER], conv=conv))[2] for conv in ("b", "c", "d")}
    sick = rig.router.engines.decode.get(rig.decode[0].url)
    assert sick is not None
    rig.router.engines.decode.mark(sick, False, "health probe failed")
    for conv, text in texts.items():
        history = [USER, {"role": "assistant", "content": text}, {"role": "user", "content": "next"}]
        await rig.chat(history, conv=conv)
    held = len(rig.decode[0].seen)
    assert held and rig.metric("duplex_router_kv_reuse_misses_total", reason="endpoint_unhealthy") == held
    assert rig.metric("duplex_router_kv_reuse_hits_total") == 4 - held
    assert len(rig.decode[0].seen) == held  # nothing more went to the unhealthy engine


async def test_ready_health_models_metrics(make_rig):
    rig = await make_rig()
    async with rig.session.get(rig.url + "/health") as r:
        assert r.status == 200
    async with rig.session.get(rig.url + "/ready") as r:
        body = await r.json()
        assert r.status == 200 and body["ready"] and body["store"]["kind"] == "memory"
    async with rig.session.get(rig.url + "/v1/models") as r:
        assert (await r.json())["data"][0]["id"] == "m"
    rig.d.health_status = 500
    await rig.router.prober.probe_all()
    async with rig.session.get(rig.url + "/ready") as r:
        body = await r.json()
        assert r.status == 503 and not body["ready"] and body["decode"]["healthy"] == 0
    await rig.chat([USER], conv=None)
    async with rig.session.get(rig.url + "/metrics") as r:
        text = await r.text()
    for name in (
        "duplex_router_requests_total",
        "duplex_router_time_to_first_token_seconds_bucket",
        "duplex_router_request_duration_seconds_bucket",
        "duplex_router_inflight_requests",
        "duplex_router_store_entries",
        "duplex_router_kv_reuse_misses_total",
    ):
        assert name in text


async def test_served_model_names(make_rig):
    rig = await make_rig(served_model_names=["m"])
    async with rig.session.get(rig.url + "/v1/models") as r:
        assert [m["id"] for m in (await r.json())["data"]] == ["m"]
    status, out, _ = await rig.post("/v1/chat/completions", {"model": "nope", "messages": [USER]})
    assert status == 404 and out["error"]["code"] == "model_not_found"


async def test_sockets_have_nagle_off_and_connections_are_reused(make_rig):
    rig = await make_rig()
    for _ in range(3):
        await rig.chat([USER], conv=None)
    connector = rig.router.session.connector
    transports = [proto.transport for conns in connector._conns.values() for proto, _ in conns]
    assert transports, "connections go back to the pool"
    for transport in transports:
        sock = transport.get_extra_info("socket")
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1
    assert len(transports) <= 2  # one per engine, reused


async def test_small_requests_do_not_wait_for_delayed_acks(make_rig):
    rig = await make_rig()
    await rig.chat([USER], conv=None)
    times = []
    for _ in range(15):
        t = time.perf_counter()
        await rig.chat([USER], conv=None)
        times.append(time.perf_counter() - t)
    # Nagle + delayed ACK would add ~40 ms to every request.
    assert statistics.median(times) < 0.035, times


async def test_memory_store_is_the_default(make_rig):
    rig = await make_rig()
    assert isinstance(rig.router.store, MemoryStore)


async def test_a_prefill_rejecting_replayed_blocks_is_retried_plain_even_without_retries(make_rig):
    rig = await make_rig(prefill_retries=0)
    _, _, text = await rig.chat([USER])
    history = [USER, {"role": "assistant", "content": text}, {"role": "user", "content": "next"}]
    rig.p.actions = [400]  # e.g. the engine refuses the replayed kv_transfer_params
    status, _, _ = await rig.chat(history)
    assert status == 200
    replayed, plain = rig.p.seen[1:]
    assert kv_in(replayed)["remote_engine_id"] == "d0" and kv_in(plain) == protocol.miss_params()
    assert rig.metric("duplex_router_kv_reuse_misses_total", reason="prefill_retry") == 1
    assert rig.metric("duplex_router_retries_total", leg="prefill") == 1
    rig.p.actions = [500]  # without replay, prefill_retries=0 means no retry
    status, _, _ = await rig.chat([USER], conv=None)
    assert status == 502


async def test_a_decode_stream_going_quiet_mid_answer_times_out(make_rig):
    rig = await make_rig(timeouts={"decode_idle_seconds": 0.3})
    rig.d.actions = ["stall_mid"]
    started = time.perf_counter()
    status, events, _ = await rig.chat([USER], stream=True)
    elapsed = time.perf_counter() - started
    assert status == 200 and events[-1] == "[DONE]" and events[-2]["error"]["code"] == 502
    assert 0.3 <= elapsed < 2.0, elapsed  # the idle timeout, not the engine's 3 s stall
    assert rig.metric("duplex_router_backend_errors_total", leg="decode", kind="timeout") == 1
    assert await rig.router.store.size() == 0


async def test_a_decode_stream_quiet_before_its_first_event_is_retried(make_rig):
    rig = await make_rig(timeouts={"decode_idle_seconds": 0.3})
    rig.d.actions = ["stall_start"]
    status, events, text = await rig.chat([USER], stream=True)
    assert status == 200 and events[-1] == "[DONE]" and text == "hello world again"
    assert rig.metric("duplex_router_backend_errors_total", leg="decode", kind="timeout") == 1
    assert rig.metric("duplex_router_retries_total", leg="decode") == 1


async def test_streams_whose_body_ends_after_done_keep_their_connection(make_rig):
    rig = await make_rig()
    rig.d.stall_seconds = 0.3  # the chunked body's end comes in its own write, well after [DONE]
    rig.d.actions = ["slow_end"] * 3
    for _ in range(3):
        started = time.perf_counter()
        status, events, text = await rig.chat([USER], conv=None, stream=True)
        assert status == 200 and events[-1] == "[DONE]" and text == "hello world again"
        assert time.perf_counter() - started < 0.25  # the client does not wait for the end of decode's body
        await asyncio.sleep(0.4)
    peers = {seen.peer for seen in rig.d.seen}
    assert len(peers) == 1, peers  # once the body ended, the connection went back to the pool


async def test_values_beyond_strict_json_reach_the_engines_unchanged_and_are_never_replayed(make_rig):
    rig = await make_rig()
    big = 123456789012345678901234567890
    raw = (
        '{"model": "m", "messages": [{"role": "user", "content": "hi"}], "conversation_id": "odd", '
        f'"seed": {big}, "logit_bias": {{"5": NaN}}}}'
    ).encode()
    for _ in range(2):
        status, out, _ = await rig.post("/v1/chat/completions", data=raw, headers={"Content-Type": "application/json"})
        assert status == 200, out
    for seen in rig.p.seen + rig.d.seen:
        assert seen.body["seed"] == big and type(seen.body["seed"]) is int  # every digit, still an integer
        assert seen.body["logit_bias"]["5"] != seen.body["logit_bias"]["5"]  # NaN stays NaN
        assert "conversation_id" not in seen.body
    # Digests are taken only of strict JSON, so such a conversation recomputes every turn.
    assert rig.metric("duplex_router_kv_reuse_misses_total", reason="not_replayable") == 2
    assert rig.metric("duplex_router_kv_reuse_hits_total") == 0


def _dechunk(raw: bytes) -> bytes:
    head, _, rest = raw.partition(b"\r\n\r\n")
    assert b"transfer-encoding: chunked" in head.lower(), head
    out = bytearray()
    while True:
        size_line, _, rest = rest.partition(b"\r\n")
        size = int(size_line, 16)
        if size == 0:
            return bytes(out)
        out += rest[:size]
        assert rest[size : size + 2] == b"\r\n"
        rest = rest[size + 2 :]


async def test_a_slow_client_holds_decode_back_and_its_time_is_not_decodes(make_rig):
    # 12 MB of events: more than the socket and transport buffers between decode and a client that stopped reading
    # take on loopback (receive buffers stop growing once their reader stops); without back-pressure decode finishes
    # within the client's pause
    total = 12 << 20
    rig = await make_rig(timeouts={"decode_idle_seconds": 0.3})
    rig.d.words = tuple(f" w{i:06d}" + "x" * 8000 for i in range(total // 8000))
    body = b'{"model": "m", "stream": true, "messages": [{"role": "user", "content": "hi"}]}'
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 * 1024)
    sock.setblocking(False)
    host, port = rig.url.removeprefix("http://").split(":")
    await asyncio.get_running_loop().sock_connect(sock, (host, int(port)))
    reader, writer = await asyncio.open_connection(sock=sock, limit=16 * 1024)  # pauses once 32 KiB wait
    writer.write(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Connection: close\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
    )
    await asyncio.sleep(1.2)  # four idle timeouts long, reading nothing
    assert rig.d.stream_ended_at is None, "decode finished while the client read nothing: the router buffered it all"
    raw = await asyncio.wait_for(reader.read(), 30)
    writer.close()
    events = _dechunk(raw).split(b"\n\n")
    assert events[-2:] == [b"data: [DONE]", b""] and b'"error"' not in raw
    text = "".join(json.loads(e[6:])["choices"][0]["delta"]["content"] for e in events[1:-2])
    assert text == "".join(rig.d.words)
    assert rig.metric("duplex_router_backend_errors_total", leg="decode", kind="timeout") == 0
    assert rig.d.stream_ended_at is not None


async def test_time_to_first_token_is_told_apart_by_reuse(make_rig):
    # What the dashboard's "TTFT with and without reuse" panel splits on.
    rig = await make_rig()
    _, _, text = await rig.chat([USER])
    await rig.chat([USER, {"role": "assistant", "content": text}, {"role": "user", "content": "x"}], stream=True)
    ttft = "duplex_router_time_to_first_token_seconds_count"
    assert rig.metric(ttft, route="chat", stream="false", reuse="miss") == 1
    assert rig.metric(ttft, route="chat", stream="true", reuse="hit") == 1
    assert rig.metric(ttft) == 2


async def test_the_cost_policy_sends_a_conversation_back_to_its_prefill(make_rig):
    rig = await make_rig(n_prefill=2, placement={"prefill": "cost"})
    status, _, text = await rig.chat([USER])
    assert status == 200
    first = next(e for e in rig.prefill if e.seen)
    history = [USER, {"role": "assistant", "content": text}, {"role": "user", "content": "next"}]
    for _ in range(3):
        status, _, text = await rig.chat(history)
        assert status == 200
        history = history + [{"role": "assistant", "content": text}, {"role": "user", "content": "more"}]
    assert len(first.seen) == 4 and all(not e.seen for e in rig.prefill if e is not first)
    assert rig.metric("duplex_router_kv_reuse_hits_total") == 3
