"""The reuse decision as a pure function: one case per miss reason, the hit, and what decode's answer leaves for
the next turn."""

from __future__ import annotations

from typing import Any

import pytest

from duplex_sidecars import protocol
from duplex_sidecars.router import reuse
from duplex_sidecars.router.history import CHAT_ROUTE, History, Reply, scope_digest, state_key
from duplex_sidecars.router.store import Entry

D1 = "http://10.0.0.1:8000"
D2 = "http://10.0.0.2:8000"
USER = {"role": "user", "content": "hi"}
ANSWER = Reply(content="hello", finish_reason="stop")
DECODE_PARAMS = {
    "do_remote_decode": True,
    "do_remote_prefill": False,
    "remote_engine_id": "decode-0",
    "remote_request_id": "req-1",
    "remote_host": "10.0.0.1",
    "remote_port": 5600,
    "remote_block_ids": [[1, 2, 3]],
    "remote_num_tokens": 40,
    "remote_blocks_expiry_time": 1234.5,
}


def turn(messages: list[dict[str, Any]], conversation: str | None = "c", stream: bool = False, **fields: Any):
    from duplex_sidecars.router.apis.openai import CHAT
    from duplex_sidecars.router.turn import Turn

    body = {"model": "m", "messages": messages, **fields}
    return Turn(
        api=CHAT,
        route=CHAT_ROUTE,
        path="/v1/chat/completions",
        body=body,
        model="m",
        stream=stream,
        request_id="r",
        conversation_id=conversation,
        key=state_key("t", "m", conversation) if conversation else None,
        history=History.of_request(CHAT_ROUTE, body),
        scope=scope_digest(CHAT_ROUTE, body),
    )


FIRST = turn([USER])
FOLLOW_UP = [USER, {"role": "assistant", "content": "hello"}, {"role": "user", "content": "more"}]


def stored_entry(**changes: Any) -> Entry:
    """The entry decode's answer to FIRST leaves, with `changes` applied."""
    capture = reuse.after_decode(FIRST, D1, dict(DECODE_PARAMS), ANSWER)
    assert capture.outcome == "stored" and capture.entry is not None
    entry = capture.entry
    for name, value in changes.items():
        setattr(entry, name, value)
    return entry


def uncomparable(t):
    t.history = None
    return t


@pytest.mark.parametrize(
    "case, the_turn, entry, endpoints, reason, sticky",
    [
        ("no id", turn(FOLLOW_UP, conversation=None), None, {D1}, "no_conversation_id", None),
        ("history not comparable", uncomparable(turn(FOLLOW_UP)), stored_entry(), {D1}, "not_replayable", None),
        ("store failed", turn(FOLLOW_UP), reuse.STORE_FAILED, {D1}, "store_error", None),
        ("nothing stored", turn(FOLLOW_UP), None, {D1}, "no_entry", None),
        ("tombstone", turn(FOLLOW_UP), Entry(D1, reason="not_replayable"), {D1}, "not_replayable", D1),
        ("decode sent no params", turn(FOLLOW_UP), Entry(D1, reason=reuse.NO_PARAMS), {D1}, "no_params", D1),
        (
            "streamed, no params",
            turn(FOLLOW_UP),
            Entry(D1, reason=reuse.STREAM_NO_PARAMS),
            {D1},
            "stream_no_params",
            D1,
        ),
        ("engine left (tombstone)", turn(FOLLOW_UP), Entry(D1, reason="endpoint_gone"), {D1}, "endpoint_gone", None),
        ("expired", turn(FOLLOW_UP), stored_entry(remaining=-1.0), {D1}, "expired", D1),
        ("engine left", turn(FOLLOW_UP), stored_entry(), {D2}, "endpoint_gone", None),
        ("other tools", turn(FOLLOW_UP, tools=[{"type": "function"}]), stored_entry(), {D1}, "scope_mismatch", D1),
        (
            "edited",
            turn([USER, {"role": "assistant", "content": "HELLO"}, USER]),
            stored_entry(),
            {D1},
            "history_mismatch",
            D1,
        ),
        ("truncated", turn([{"role": "user", "content": "more"}]), stored_entry(), {D1}, "history_mismatch", D1),
        ("undecodable params", turn(FOLLOW_UP), stored_entry(blob=b"\x01garbage"), {D1}, "store_error", D1),
    ],
    ids=lambda v: v if isinstance(v, str) and " " in v else "",
)
def test_each_miss_reason(case, the_turn, entry, endpoints, reason, sticky):
    decision = reuse.decide(the_turn, entry, endpoints)
    assert not decision.hit and decision.params is None
    assert decision.reason == reason, case
    assert decision.sticky_decode == sticky, case


def test_the_exact_continuation_replays_decodes_blocks():
    decision = reuse.decide(turn(FOLLOW_UP), stored_entry(), {D1})
    assert decision.hit and decision.reason is None and decision.sticky_decode == D1
    assert decision.params == protocol.replay_params(DECODE_PARAMS)
    assert decision.tokens == 40


def test_blocks_on_an_unhealthy_decode_engine_are_not_read():
    decision = reuse.decide(turn(FOLLOW_UP), stored_entry(), {D1, D2}, 0, unhealthy={D1})
    assert not decision.hit and decision.reason == "endpoint_unhealthy" and decision.sticky_decode is None
    assert reuse.decide(turn(FOLLOW_UP), stored_entry(), {D1, D2}, 0, unhealthy={D2}).hit


def test_blocks_on_a_decode_engine_of_another_kv_revision_are_not_read():
    revisions = {D1: "aaaa0001", D2: "bbbb0002"}
    entry = stored_entry(prefill_url="http://p-a")

    def decide(revision: str | None, revision_of: Any = revisions.get) -> reuse.Decision:
        return reuse.decide(turn(FOLLOW_UP), entry, {D1, D2}, revision=revision, revision_of=revision_of)

    moved = decide("bbbb0002")
    assert not moved.hit and moved.reason == reuse.REVISION_CHANGED == "revision_changed"
    assert moved.sticky_decode is None and moved.previous_prefill == "http://p-a"
    assert decide("aaaa0001").hit  # the request goes to the entry's revision
    assert decide(None).hit  # no revision to keep to
    assert decide("bbbb0002", lambda url: None).hit  # the engine's revision is not known yet
    assert decide("", {D1: ""}.get).hit  # engines that name no revision are one revision


def stored_at(remote_host: Any, url: str = D1) -> Entry:
    capture = reuse.after_decode(FIRST, url, {**DECODE_PARAMS, "remote_host": remote_host}, ANSWER)
    assert capture.entry is not None
    return capture.entry


@pytest.mark.parametrize(
    "url, remote_host, hit",
    [
        (D1, "10.0.0.1", True),
        (D1, "10.0.0.2", False),  # another engine's side channel (a forged or misrouted entry)
        (D1, "evil.example", False),  # a name where the engine is known by its address
        ("http://[fd00::1]:8000", "fd00:0::1", True),  # the same IPv6 address, written otherwise
        ("http://decode-0.decode:8000", "10.0.0.9", True),  # engines named by host name are not checked
    ],
)
def test_a_replay_goes_only_to_the_side_channel_of_the_engine_that_stored_it(url, remote_host, hit):
    decision = reuse.decide(turn(FOLLOW_UP), stored_at(remote_host, url), {url})
    assert decision.hit is hit
    if not hit:
        assert decision.reason == "side_channel_mismatch" and decision.sticky_decode is None
    assert reuse.decide(turn(FOLLOW_UP), stored_at(remote_host, url), {url}, check_side_channel=False).hit


@pytest.mark.parametrize("min_tokens, hit", [(0, True), (40, True), (41, False)])
def test_fewer_reusable_tokens_than_the_threshold_are_recomputed(min_tokens, hit):
    decision = reuse.decide(turn(FOLLOW_UP), stored_entry(), {D1}, min_tokens)  # the entry holds 40 tokens
    assert decision.hit is hit
    if not hit:
        assert decision.reason == "below_threshold" and decision.sticky_decode == D1


@pytest.mark.parametrize(
    "the_turn, params, answer, outcome, reason",
    [
        (turn([USER], conversation=None), DECODE_PARAMS, ANSWER, "not_stored", None),
        (turn([USER]), None, ANSWER, "no_params", reuse.NO_PARAMS),
        (turn([USER], stream=True), None, ANSWER, "no_params", reuse.STREAM_NO_PARAMS),
        (turn([USER]), {**DECODE_PARAMS, "remote_block_ids": []}, ANSWER, "not_replayable", "not_replayable"),
        (turn([USER], n=2), DECODE_PARAMS, ANSWER, "not_replayable", "not_replayable"),
        (turn([USER]), DECODE_PARAMS, Reply(content="x", finish_reason="abort"), "not_replayable", "not_replayable"),
        (uncomparable(turn([USER])), DECODE_PARAMS, ANSWER, "not_replayable", "not_replayable"),
    ],
)
def test_what_decodes_answer_leaves(the_turn, params, answer, outcome, reason):
    capture = reuse.after_decode(the_turn, D1, params, answer)
    assert capture.outcome == outcome
    if reason is None:
        assert capture.entry is None
    else:
        assert capture.entry is not None and not capture.entry.replayable and capture.entry.reason == reason
        assert capture.entry.decode_url == D1  # the next turn still goes to the engine that holds the conversation
