"""SSE parsing: the same events come out however the bytes are split, with any line-end convention."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from duplex_sidecars.router.reply import ReplyCollector, pop_kv_params, reply_of_body
from duplex_sidecars.router.sse import SSEParser


def run(chunks: list[bytes]) -> list:
    parser = SSEParser()
    out = []
    for c in chunks:
        out += parser.feed(c)
    out += parser.close()
    return out


def split_at(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    pieces, last = [], 0
    for p in points:
        pieces.append(data[last:p])
        last = p
    pieces.append(data[last:])
    return pieces


payloads = st.lists(st.dictionaries(st.sampled_from(["a", "b", "kv_transfer_params"]),
                                    st.text(alphabet=st.characters(blacklist_characters="\r\n"), max_size=20)),
                    min_size=1, max_size=6)


@pytest.mark.parametrize("eol", [b"\n", b"\r\n", b"\r"])
@given(payloads, st.lists(st.integers(0, 10_000), max_size=12))
def test_events_survive_any_chunking(eol, objs, cuts):
    stream = b"".join(b"data: " + json.dumps(o).encode() + eol + eol for o in objs) + b"data: [DONE]" + eol + eol
    events = run(split_at(stream, cuts))
    assert [e.data for e in events] == [json.dumps(o) for o in objs] + ["[DONE]"]
    assert b"".join(e.raw for e in events) == stream


def test_multiline_data_comments_and_event_names():
    stream = b": keep-alive\n\nevent: delta\ndata: line1\ndata: line2\n\ndata:nospace\n\n"
    events = run([stream[:7], stream[7:30], stream[30:]])
    assert [e.data for e in events] == [None, "line1\nline2", "nospace"]
    assert events[1].event == "delta"


def test_cr_at_a_chunk_boundary_waits_for_its_lf():
    parser = SSEParser()
    assert parser.feed(b"data: x\r") == []
    assert parser.feed(b"\n") == []
    events = parser.feed(b"\r\n")
    assert [e.data for e in events] == ["x"]


def test_unterminated_last_event_counts_at_close():
    parser = SSEParser()
    assert parser.feed(b"data: tail") == []
    assert [e.data for e in parser.close()] == ["tail"]


def test_oversized_events_are_refused():
    parser = SSEParser(max_event_bytes=100)
    with pytest.raises(ValueError):
        parser.feed(b"data: " + b"x" * 200)


def test_stream_collector_assembles_content_and_tool_calls():
    c = ReplyCollector("chat")
    c.add({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})
    c.add({"choices": [{"index": 0, "delta": {"content": "Hel"}}]})
    c.add({"choices": [{"index": 0, "delta": {"content": "lo"}}]})
    c.add({"choices": [{"index": 0, "delta": {"tool_calls": [
        {"index": 0, "id": "call_1", "type": "function", "function": {"name": "get", "arguments": ""}}]}}]})
    c.add({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": "{\"a\":"}}]}}]})
    c.add({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": "1}"}}]}}]})
    c.add({"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls", "stop_reason": None}]})
    c.add({"choices": [], "usage": {"prompt_tokens": 1}})
    r = c.reply()
    assert r.content == "Hello" and r.finish_reason == "tool_calls" and r.choices == 1
    assert r.tool_calls == ({"id": "call_1", "type": "function", "function": {"name": "get", "arguments": "{\"a\":1}"}},)


def test_completion_collector_and_several_choices():
    c = ReplyCollector("completions")
    c.add({"choices": [{"index": 0, "text": " a"}]})
    c.add({"choices": [{"index": 1, "text": " b"}]})
    c.add({"choices": [{"index": 0, "text": " c", "finish_reason": "length"}]})
    assert c.reply().choices == 2


def test_body_reply_and_param_stripping():
    body = {"choices": [{"index": 0, "message": {"role": "assistant", "content": "x", "tool_calls": []},
                         "finish_reason": "stop", "kv_transfer_params": {"a": 1}}],
            "kv_transfer_params": {"b": 2}}
    assert pop_kv_params(body) == {"b": 2}
    assert "kv_transfer_params" not in body and "kv_transfer_params" not in body["choices"][0]
    r = reply_of_body("chat", body)
    assert r.content == "x" and r.finish_reason == "stop" and r.tool_calls == ()
    assert reply_of_body("chat", {"choices": []}).choices == 0
    assert reply_of_body("completions", {"choices": [{"text": "t", "finish_reason": "length"}]}).content == "t"


def test_stream_relay_strips_params_and_holds_the_final_chunk():
    from duplex_sidecars.router.forward import _StreamRelay

    relay = _StreamRelay(ReplyCollector("chat"))
    parser = SSEParser()
    first = relay.take(parser.feed(b'data: {"choices":[{"index":0,"delta":{"content":"hi"}}]}\n\n: ping\n\n'))
    assert first == b'data: {"choices":[{"index":0,"delta":{"content":"hi"}}]}\n\n: ping\n\n'  # untouched bytes
    final = relay.take(parser.feed(
        b'data: {"choices":[{"index":0,"delta":{"content":"!"},"finish_reason":"stop"}],'
        b'"kv_transfer_params":{"remote_engine_id":"d"}}\n\ndata: {"choices":[],"usage":{}}\n\n'))
    assert final == b""  # held until the entry is stored
    assert b"kv_transfer_params" not in relay.held and b'"usage"' in relay.held
    assert relay.kv_params == {"remote_engine_id": "d"}
    assert relay.take(parser.feed(b"data: [DONE]")) == b"" and not relay.finished
    relay.take(parser.close())
    assert relay.finished and relay.collector.reply().content == "hi!"


def test_stream_relay_drops_unparseable_events_that_mention_params():
    from duplex_sidecars.router.forward import _StreamRelay

    relay = _StreamRelay(None)
    out = relay.take(SSEParser().feed(b'data: {"kv_transfer_params": broken\n\ndata: plain text\n\n'))
    assert out == b"data: plain text\n\n"
