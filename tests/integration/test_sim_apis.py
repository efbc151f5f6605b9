"""The P-D protocol by hand on /v1/responses and /v1/messages: real `duplex sim` processes moving KV over NIXL.

Each route runs a turn (prefill leg, decode leg), then a follow-up whose history is the previous request plus the
reply exactly as the client got it; its prefill leg replays decode's retained blocks and reads them over NIXL. The
follow-up's reply equals a recompute's, and the blocks read verify (`--fail-on-corrupt` turns a bad block into a 500).
kv_transfer_params sit where vLLM 0.33 puts them: the Responses body and its stream's terminal response object, the
Messages body (only when not null), and nowhere in a Messages stream.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from duplex_dev.launch.sim import SimProcess
from duplex_sidecars import protocol as pr
from duplex_sidecars.sim import generation, messages_api, responses_api
from duplex_sidecars.sim.chat_parse import parse_messages
from duplex_sidecars.sim.chat_template import render_conversation
from duplex_sidecars.sim.nixl_transport import NixlUnavailable, load_nixl_api

pytestmark = [pytest.mark.nixl, pytest.mark.timeout(180)]

KV = pr.KV_PARAMS_FIELD
_STARTUP_S = 90.0  # engines start in seconds, but this machine is shared: a loaded one must not fail the tier


@pytest.fixture(scope="module")
def sims() -> Iterator[dict[str, SimProcess]]:
    try:
        load_nixl_api()
    except NixlUnavailable as e:
        pytest.fail(f"nixl is required for the NIXL tier (CI and local): {e}")
    corrupt = "--fail-on-corrupt"
    procs = {
        # No prefix cache on prefill, so every replay has a D->P read to do.
        "prefill": SimProcess(
            "prefill",
            "--no-enable-prefix-caching",
            "--kv-load-failure-policy",
            "recompute",
            corrupt,
            startup_timeout=_STARTUP_S,
        ),
        "decode": SimProcess("decode", corrupt, startup_timeout=_STARTUP_S),
        "decode_unidirectional": SimProcess("decode", "--no-bidirectional", corrupt, startup_timeout=_STARTUP_S),
    }
    try:
        for p in procs.values():
            p.start()
        for p in procs.values():
            p.wait_ready()
        yield procs
    finally:
        for p in procs.values():
            p.stop()


# -- HTTP -------------------------------------------------------------------------------------------------------
def post(sim: SimProcess, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    req = urllib.request.Request(
        sim.url + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            assert resp.headers["Content-Type"].startswith("application/json")
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def stream(sim: SimProcess, path: str, body: dict[str, Any]) -> tuple[list[tuple[str, dict[str, Any]]], bytes]:
    """The SSE events (name, data) and the raw bytes; every frame must be exactly `event:` + `data:`."""
    req = urllib.request.Request(
        sim.url + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=30) as resp:
        assert resp.status == 200 and resp.headers["Content-Type"].startswith("text/event-stream")
        raw = resp.read()
    assert raw.endswith(b"\n\n") and b"[DONE]" not in raw
    events = []
    for frame in raw.decode().split("\n\n")[:-1]:
        head, data = frame.split("\n")
        assert head.startswith("event: ") and data.startswith("data: ")
        events.append((head[len("event: ") :], json.loads(data[len("data: ") :])))
    return events, raw


class Meter:
    """Metric deltas on one engine since construction."""

    NAMES = ("sim_nixl_reads_total", "sim_corrupt_blocks_total", "sim_retained_blocks")

    def __init__(self, sim: SimProcess):
        self.sim = sim
        self.before = self._read()

    def _read(self) -> dict[str, float]:
        samples = self.sim.metrics()
        out = {n: sum(v for name, _, v in samples if name == n) for n in self.NAMES}
        for name, labels, v in samples:
            if name == "vllm:prompt_tokens_by_source_total":
                out[labels["source"]] = out.get(labels["source"], 0.0) + v
        return out

    def delta(self) -> dict[str, float]:
        now = self._read()
        return {k: now.get(k, 0.0) - self.before.get(k, 0.0) for k in now}


def _tag() -> str:
    return f"Conversation {uuid.uuid4().hex}. You are a careful assistant who answers questions about sailing. " * 3


# -- /v1/responses ------------------------------------------------------------------------------------------------
# Responses has no max_tokens field (vLLM keeps unknown fields unused): a prefill leg caps max_output_tokens.
RESPONSES_LEGS = pr.LegShape(max_tokens=("max_output_tokens",))


def responses_prefill(p: SimProcess, body: dict[str, Any], params: dict[str, Any]) -> dict[str, Any]:
    status, out = post(p, "/v1/responses", pr.prefill_leg_body(body, params, RESPONSES_LEGS))
    assert status == 200, out
    assert out["status"] == "incomplete" and out["usage"]["output_tokens"] == 1
    return out


def responses_turn(
    p: SimProcess, d: SimProcess, body: dict[str, Any], replay: dict[str, Any] | None = None, streamed: bool = False
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(prefill's response, decode's final response object)."""
    prefill = responses_prefill(p, body, pr.replay_params(replay) if replay else pr.miss_params())
    leg = {**body, KV: prefill[KV]}
    if not streamed:
        status, decode = post(d, "/v1/responses", leg)
        assert status == 200, decode
        return prefill, decode
    events, _ = stream(d, "/v1/responses", {**leg, "stream": True})
    return prefill, events[-1][1]["response"]


def responses_follow_up(body: dict[str, Any], response: dict[str, Any], question: str) -> dict[str, Any]:
    """The next request: the previous input items, the output items exactly as received, a new user message."""
    items = body["input"] if isinstance(body["input"], list) else [{"role": "user", "content": body["input"]}]
    return {**body, "input": items + response["output"] + [{"role": "user", "content": question}]}


def reply_text(response: dict[str, Any]) -> str:
    (item,) = response["output"]
    return "".join(part["text"] for part in item["content"])


def test_responses_turn_then_follow_up_reads_decodes_blocks(sims):
    p, d = sims["prefill"], sims["decode"]
    body = {
        "model": "sim",
        "instructions": _tag(),
        "input": "How do I reef a mainsail in a squall?",
        "max_output_tokens": 40,
    }
    dm = Meter(d)
    prefill, decode = responses_turn(p, d, body)
    pp, dp = prefill[KV], decode[KV]
    prompt_tokens = prefill["usage"]["input_tokens"]
    assert pp["do_remote_prefill"] is True and pp["remote_num_tokens"] == prompt_tokens
    assert pp["remote_prefill_cached_tokens"] == 0  # vLLM 0.33 adds prefill's cache hits to its params
    assert dp["do_remote_decode"] is True and pr.replayable_decode_params(dp) is not None
    assert dp["remote_num_tokens"] == prompt_tokens + decode["usage"]["output_tokens"] - 1
    assert dm.delta()["sim_nixl_reads_total"] == 1 and dm.delta()["external_kv_transfer"] == prompt_tokens
    # The first token is the same on both legs, and decode reports prefill's cache hits as its own.
    assert reply_text(decode).split()[0] == reply_text(prefill)
    assert decode["usage"]["input_tokens_details"]["cached_tokens"] == pp["remote_prefill_cached_tokens"]

    body2 = responses_follow_up(body, decode, "And in heavy seas?")
    pm = Meter(p)
    prefill2, decode2 = responses_turn(p, d, body2, replay=pr.replayable_decode_params(dp))
    delta = pm.delta()
    assert delta["sim_nixl_reads_total"] == 1 and delta["sim_corrupt_blocks_total"] == 0
    assert delta["external_kv_transfer"] == dp["remote_num_tokens"]  # the whole previous turn: prompt and reply
    assert delta["local_compute"] == prefill2["usage"]["input_tokens"] - dp["remote_num_tokens"]
    assert prefill2["usage"]["input_tokens_details"]["cached_tokens"] == dp["remote_num_tokens"]

    # The reused turn answers what a recompute answers, and what the template and sampler say it should.
    status, recomputed = post(p, "/v1/responses", body2)
    assert status == 200 and recomputed[KV] is None
    assert reply_text(decode2) == reply_text(recomputed)
    req = responses_api.parse_request(json.loads(json.dumps(body2)))
    prompt = render_conversation(parse_messages(responses_api.input_messages(req.instructions, req.input)))
    assert len(prompt) == decode2["usage"]["input_tokens"]
    assert reply_text(decode2) == generation.chat_text(generation.reply(prompt, 40).tokens)


def test_responses_stream_carries_params_on_the_terminal_response_only(sims):
    p, d = sims["prefill"], sims["decode"]
    body = {"model": "sim", "instructions": _tag(), "input": "Which knot for a mooring line?"}
    prefill = responses_prefill(p, body, pr.miss_params())
    events, raw = stream(d, "/v1/responses", {**body, "stream": True, KV: prefill[KV]})

    names = [name for name, _ in events]
    assert names[:5] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
    ]
    assert names[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]  # no cap: the reply ends with EOS
    assert [data["type"] for _, data in events] == names
    assert [data["sequence_number"] for _, data in events] == list(range(len(events)))
    # The response object rides on created, in_progress and the terminal event: null params, then decode's.
    carrying = [(name, data["response"]) for name, data in events if "response" in data]
    assert [name for name, _ in carrying] == ["response.created", "response.in_progress", "response.completed"]
    assert carrying[0][1][KV] is None and carrying[1][1][KV] is None
    final = carrying[2][1]
    assert pr.replayable_decode_params(final[KV]) is not None
    assert raw.count(b'"kv_transfer_params"') == 3
    # The streamed text is the final response's text, and the output item is the one streamed.
    text = "".join(data["delta"] for name, data in events if name == "response.output_text.delta")
    assert text == reply_text(final) and final["output"][0] == events[-2][1]["item"]
    assert final["status"] == "completed" and final["output"][0]["status"] == "completed"

    # The streamed params serve the follow-up exactly as non-streamed ones do.
    pm = Meter(p)
    responses_prefill(p, responses_follow_up(body, final, "thanks"), pr.replay_params(final[KV]))
    assert pm.delta()["sim_nixl_reads_total"] == 1 and pm.delta()["sim_corrupt_blocks_total"] == 0


def test_responses_stream_follow_up_equals_non_streamed(sims):
    """The same conversation streamed and not: same replies, so the same history and the same blocks. (A cap below
    the shortest natural reply, generation.MIN_NATURAL_LEN, makes both incomplete.)"""
    p, d = sims["prefill"], sims["decode"]
    body = {"model": "sim", "instructions": _tag(), "input": "What is a preventer?", "max_output_tokens": 12}
    _, plain = responses_turn(p, d, body)
    _, streamed = responses_turn(p, d, body, streamed=True)
    assert reply_text(plain) == reply_text(streamed) and streamed["status"] == plain["status"] == "incomplete"
    assert streamed["incomplete_details"] == {"reason": "max_output_tokens"}
    assert streamed[KV]["remote_num_tokens"] == plain[KV]["remote_num_tokens"]


def test_responses_ignore_max_tokens_and_store_nothing(sims):
    d = sims["decode"]
    body = {"model": "sim", "input": f"Tell me a story {uuid.uuid4().hex}", "max_tokens": 1}
    status, out = post(d, "/v1/responses", body)
    assert status == 200 and out["usage"]["output_tokens"] > 1  # max_tokens is not a Responses field
    assert out["max_output_tokens"] == 32768 - out["usage"]["input_tokens"]  # the context left (default length)
    # store=True is silently off: nothing can be continued or fetched.
    status, err = post(d, "/v1/responses", {"input": "next", "previous_response_id": out["id"]})
    assert status == 404 and err["error"] == {
        "message": f"Response with id '{out['id']}' not found.",
        "type": "invalid_request_error",
        "param": "response_id",
        "code": 404,
    }
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(f"{d.url}/v1/responses/{out['id']}", timeout=10)
    assert info.value.code == 404
    status, err = post(d, "/v1/responses", {"input": "x", "background": True})
    assert status == 400 and err["error"]["param"] == "background"


# -- /v1/messages -------------------------------------------------------------------------------------------------
def messages_prefill(p: SimProcess, body: dict[str, Any], params: dict[str, Any]) -> dict[str, Any]:
    status, out = post(p, "/v1/messages", pr.prefill_leg_body(body, params))
    assert status == 200, out
    assert out["stop_reason"] == "max_tokens" and out["usage"]["output_tokens"] == 1
    return out


def messages_follow_up(body: dict[str, Any], reply_content: list[dict[str, Any]], question: str) -> dict[str, Any]:
    """The next request: the previous messages, the assistant message with the content blocks as received, a new
    user message."""
    turn = [{"role": "assistant", "content": reply_content}, {"role": "user", "content": question}]
    return {**body, "messages": body["messages"] + turn}


def test_messages_turn_then_follow_up_reads_decodes_blocks(sims):
    p, d = sims["prefill"], sims["decode"]
    body = {
        "model": "sim",
        "max_tokens": 40,
        "system": [{"type": "text", "text": _tag()}],
        "messages": [{"role": "user", "content": "How do I heave to?"}],
    }
    prefill = messages_prefill(p, body, pr.miss_params())
    status, decode = post(d, "/v1/messages", pr.decode_leg_body(body, prefill[KV]))
    assert status == 200, decode
    dp = decode[KV]
    assert pr.replayable_decode_params(dp) is not None
    assert dp["remote_num_tokens"] == decode["usage"]["input_tokens"] + decode["usage"]["output_tokens"] - 1
    assert decode["content"][0]["text"].split()[0] == prefill["content"][0]["text"]

    body2 = messages_follow_up(body, decode["content"], "And if the wind backs?")
    pm = Meter(p)
    messages_prefill(p, body2, pr.replay_params(pr.replayable_decode_params(dp)))
    assert pm.delta()["sim_nixl_reads_total"] == 1 and pm.delta()["sim_corrupt_blocks_total"] == 0
    assert pm.delta()["external_kv_transfer"] == dp["remote_num_tokens"]

    status, reused = post(d, "/v1/messages", body2)  # decode holds the blocks in its prefix cache
    status2, recomputed = post(p, "/v1/messages", body2)  # prefill has no prefix cache: all computed
    assert status == status2 == 200 and KV not in recomputed  # exclude_none: no params, no key
    assert reused["content"] == recomputed["content"]
    chat = messages_api.to_chat_request(messages_api.parse_request(json.loads(json.dumps(body2))))
    prompt = render_conversation(parse_messages(chat.messages), chat.tools)
    assert recomputed["usage"]["input_tokens"] == len(prompt)
    assert reused["content"][0]["text"] == generation.chat_text(generation.reply(prompt, 40).tokens)


def test_messages_stream_carries_no_params(sims):
    """vLLM 0.33's message_stream_converter never copies the chat chunk's kv_transfer_params: a streamed decode
    leg on /v1/messages leaves the router nothing to replay, though decode retains its blocks all the same."""
    p, d = sims["prefill"], sims["decode"]
    body = {
        "model": "sim",
        "max_tokens": 12,
        "system": _tag(),
        "messages": [{"role": "user", "content": "Explain a gybe."}],
    }
    prefill = messages_prefill(p, body, pr.miss_params())
    dm = Meter(d)
    events, raw = stream(d, "/v1/messages", {**pr.decode_leg_body(body, prefill[KV]), "stream": True})
    assert b"kv_transfer_params" not in raw
    assert dm.delta()["sim_retained_blocks"] > 0

    names = [name for name, _ in events]
    assert names[0] == "message_start" and names[1] == "content_block_start"
    assert set(names[2:-3]) == {"content_block_delta"}
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert [data["type"] for _, data in events] == names
    start, delta = events[0][1]["message"], events[-2][1]
    assert start["usage"] == {"input_tokens": prefill["usage"]["input_tokens"], "output_tokens": 0}
    assert delta["delta"] == {"stop_reason": "max_tokens", "stop_sequence": None}
    assert delta["usage"]["output_tokens"] == 12  # below any natural reply length: capped
    text = "".join(data["delta"]["text"] for name, data in events if name == "content_block_delta")

    status, plain = post(d, "/v1/messages", {**body, KV: messages_prefill(p, body, pr.miss_params())[KV]})
    assert status == 200 and plain["content"] == [{"type": "text", "text": text}]
    assert plain["stop_reason"] == "max_tokens"


def test_unidirectional_decode_answers_without_params(sims):
    p, d = sims["prefill"], sims["decode_unidirectional"]
    body = {"model": "sim", "max_tokens": 8, "messages": [{"role": "user", "content": _tag()}]}
    status, out = post(d, "/v1/messages", pr.decode_leg_body(body, messages_prefill(p, body, pr.miss_params())[KV]))
    assert status == 200 and KV not in out
    rbody = {"model": "sim", "input": _tag(), "max_output_tokens": 8}
    status, out = post(d, "/v1/responses", {**rbody, KV: responses_prefill(p, rbody, pr.miss_params())[KV]})
    assert status == 200 and KV in out and out[KV] is None


def _gone(params: dict[str, Any]) -> dict[str, Any]:
    return {**params, "remote_request_id": f"gone-{uuid.uuid4().hex}"}


def test_failed_kv_load_is_answered_as_vllm_does(sims):
    """A decode leg whose blocks are gone, on an engine with kv_load_failure_policy=fail (vLLM's default)."""
    p, d = sims["prefill"], sims["decode"]
    rbody = {"model": "sim", "input": _tag(), "max_output_tokens": 8}
    params = _gone(responses_prefill(p, rbody, pr.miss_params())[KV])
    status, out = post(d, "/v1/responses", {**rbody, KV: params})
    assert (status, out) == (
        500,
        {"error": {"message": "Internal server error", "type": "InternalServerError", "param": None, "code": 500}},
    )
    # Streaming: created and in_progress went out; vLLM's error event fails validation and the connection drops.
    req = urllib.request.Request(
        d.url + "/v1/responses",
        data=json.dumps({**rbody, "stream": True, KV: params}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=30) as resp, pytest.raises(Exception) as cut:
        resp.read()
    assert cut.type.__name__ in ("IncompleteRead", "ProtocolError", "ConnectionResetError", "RemoteDisconnected")

    mbody = {"model": "sim", "max_tokens": 8, "messages": [{"role": "user", "content": _tag()}]}
    params = _gone(messages_prefill(p, mbody, pr.miss_params())[KV])
    status, out = post(d, "/v1/messages", {**mbody, KV: params})
    assert (status, out) == (500, {"type": "error", "error": {"type": "api_error", "message": "Internal server error"}})
    events, _ = stream(d, "/v1/messages", {**mbody, "stream": True, KV: params})
    assert [name for name, _ in events] == ["message_start", "error"]
    assert events[1][1] == {"type": "error", "error": {"type": "api_error", "message": "Internal server error"}}


def test_errors_have_each_routes_shape(sims):
    d = sims["decode"]
    status, out = post(d, "/v1/messages", {"model": "other", "max_tokens": 5, "messages": []})
    assert (status, out["type"], out["error"]["type"]) == (404, "error", "not_found_error")
    # Body validation is the app's: OpenAI-shaped even on /v1/messages.
    status, out = post(d, "/v1/messages", {"model": "sim", "messages": []})
    assert status == 400 and out["error"]["type"] == "Bad Request" and out["error"]["param"] == "body.max_tokens"
    status, out = post(d, "/v1/responses", {"model": "other", "input": "x"})
    assert status == 404 and out["error"]["type"] == "NotFoundError"
    status, out = post(d, "/v1/responses", {"input": 5})
    assert status == 400 and out["error"]["param"] == "body.input"
    req = urllib.request.Request(
        d.url + "/v1/responses", data=b'{"input": "x"}', headers={"Content-Type": "text/plain"}
    )
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(req, timeout=10)
    assert info.value.code == 400
    assert "Unsupported Media Type" in json.loads(info.value.read())["error"]["message"]


def test_history_resent_in_other_shapes_gives_the_same_prompt(sims):
    """What does not reach the prompt does not change the reply: output items without ids and annotations, or as a
    plain assistant message; content blocks with or without extra fields."""
    d = sims["decode"]
    base = {"model": "sim", "instructions": _tag(), "max_output_tokens": 12}
    first = [{"role": "user", "content": "q"}]
    variants = [
        [
            {
                "type": "message",
                "role": "assistant",
                "id": "msg_x",
                "status": "completed",
                "phase": None,
                "content": [{"type": "output_text", "text": "ka lo mi", "annotations": [], "logprobs": None}],
            }
        ],
        [{"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "ka lo mi"}]}],
        [{"role": "assistant", "content": "ka lo mi"}],
    ]
    texts = set()
    for variant in variants:
        status, out = post(d, "/v1/responses", {**base, "input": first + variant + [{"role": "user", "content": "z"}]})
        assert status == 200, out
        texts.add((reply_text(out), out["usage"]["input_tokens"]))
    assert len(texts) == 1
