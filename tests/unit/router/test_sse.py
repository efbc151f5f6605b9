"""SSE parsing: the same events come out however the bytes are split, with any line-end convention."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from duplex_sidecars.protocol import pop_kv_params
from duplex_sidecars.router.reply import ReplyCollector, reply_of_body
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


payloads = st.lists(
    st.dictionaries(
        st.sampled_from(["a", "b", "kv_transfer_params"]),
        st.text(alphabet=st.characters(blacklist_characters="\r\n"), max_size=20),
    ),
    min_size=1,
    max_size=6,
)


@pytest.mark.parametrize("eol", [b"\n", b"\r\n", b"\r"])
@given(payloads, st.lists(st.integers(0, 10_000), max_size=12))
def test_events_survive_any_chunking(eol, objs, cuts):
    stream = b"".join(b"data: " + json.dumps(o).encode() + eol + eol for o in objs) + b"data: [DONE]" + eol + eol
    events = run(split_at(stream, cuts))
    assert [e.data for e in events] == [json.dumps(o).encode() for o in objs] + [b"[DONE]"]
    assert b"".join(e.raw for e in events) == stream


def test_multiline_data_comments_and_event_names():
    stream = b": keep-alive\n\nevent: delta\ndata: line1\ndata: line2\n\ndata:nospace\n\n"
    events = run([stream[:7], stream[7:30], stream[30:]])
    assert [e.data for e in events] == [None, b"line1\nline2", b"nospace"]
    assert events[1].event == "delta"


def test_cr_at_a_chunk_boundary_waits_for_its_lf():
    parser = SSEParser()
    assert parser.feed(b"data: x\r") == []
    assert parser.feed(b"\n") == []
    events = parser.feed(b"\r\n")
    assert [e.data for e in events] == [b"x"]


def test_unterminated_last_event_counts_at_close():
    parser = SSEParser()
    assert parser.feed(b"data: tail") == []
    assert [e.data for e in parser.close()] == [b"tail"]


def test_oversized_events_are_refused():
    parser = SSEParser(max_event_bytes=100)
    with pytest.raises(ValueError):
        parser.feed(b"data: " + b"x" * 200)


def test_stream_collector_assembles_content_and_tool_calls():
    c = ReplyCollector("chat")
    c.add({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})
    c.add({"choices": [{"index": 0, "delta": {"content": "Hel"}}]})
    c.add({"choices": [{"index": 0, "delta": {"content": "lo"}}]})
    c.add(
        {
            "choices": [
                {
                    "index": 0,
                    "delta": {
                        "tool_calls": [
                            {
                                "index": 0,
                                "id": "call_1",
                                "type": "function",
                                "function": {"name": "get", "arguments": ""},
                            }
                        ]
                    },
                }
            ]
        }
    )
    c.add({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": '{"a":'}}]}}]})
    c.add({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": "1}"}}]}}]})
    c.add({"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls", "stop_reason": None}]})
    c.add({"choices": [], "usage": {"prompt_tokens": 1}})
    r = c.reply()
    assert r.content == "Hello" and r.finish_reason == "tool_calls" and r.choices == 1
    assert r.tool_calls == ({"id": "call_1", "type": "function", "function": {"name": "get", "arguments": '{"a":1}'}},)


def test_completion_collector_and_several_choices():
    c = ReplyCollector("completions")
    c.add({"choices": [{"index": 0, "text": " a"}]})
    c.add({"choices": [{"index": 1, "text": " b"}]})
    c.add({"choices": [{"index": 0, "text": " c", "finish_reason": "length"}]})
    assert c.reply().choices == 2


def test_body_reply_and_param_stripping():
    body = {
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "x", "tool_calls": []},
                "finish_reason": "stop",
                "kv_transfer_params": {"a": 1},
            }
        ],
        "kv_transfer_params": {"b": 2},
    }
    assert pop_kv_params(body) == {"b": 2}
    assert "kv_transfer_params" not in body and "kv_transfer_params" not in body["choices"][0]
    r = reply_of_body("chat", body)
    assert r.content == "x" and r.finish_reason == "stop" and r.tool_calls == ()
    assert reply_of_body("chat", {"choices": []}).choices == 0
    assert reply_of_body("completions", {"choices": [{"text": "t", "finish_reason": "length"}]}).content == "t"


def test_stream_relay_strips_params_and_holds_the_final_chunk():
    from duplex_sidecars.router.relay import StreamRelay

    relay = StreamRelay(ReplyCollector("chat"))
    parser = SSEParser()
    first = relay.take(parser.feed(b'data: {"choices":[{"index":0,"delta":{"content":"hi"}}]}\n\n: ping\n\n'))
    assert first == b'data: {"choices":[{"index":0,"delta":{"content":"hi"}}]}\n\n: ping\n\n'  # untouched bytes
    final = relay.take(
        parser.feed(
            b'data: {"choices":[{"index":0,"delta":{"content":"!"},"finish_reason":"stop"}],'
            b'"kv_transfer_params":{"remote_engine_id":"d"}}\n\ndata: {"choices":[],"usage":{}}\n\n'
        )
    )
    assert final == b""  # held until the entry is stored
    assert b"kv_transfer_params" not in relay.held and b'"usage"' in relay.held
    assert relay.kv_params == {"remote_engine_id": "d"}
    assert relay.take(parser.feed(b"data: [DONE]")) == b"" and not relay.finished
    relay.take(parser.close())
    assert relay.finished and relay.collector.reply().content == "hi!"


def test_stream_relay_drops_unparseable_events_that_mention_params():
    from duplex_sidecars.router.relay import StreamRelay

    relay = StreamRelay(None)
    out = relay.take(SSEParser().feed(b'data: {"kv_transfer_params": broken\n\ndata: plain text\n\n'))
    assert out == b"data: plain text\n\n"


# ---- which events the relay rewrites -----------------------------------------------------------------------------

kv_values = st.one_of(
    st.none(),
    st.fixed_dictionaries(
        {"remote_engine_id": st.text(max_size=5), "remote_block_ids": st.lists(st.integers(0, 99), max_size=3)}
    ),
)
formats = st.sampled_from([(",", ":"), (", ", ": "), (" ,\t", " :  ")])


def _spell(key: str, escape: list[bool]) -> str:
    """The key as JSON source, some of its letters written as \\u escapes."""
    return (
        '"'
        + "".join(f"\\u{ord(c):04x}" if e else c for c, e in zip(key, escape + [False] * len(key), strict=False))
        + '"'
    )


def _encode(obj, seps, escape) -> bytes:
    """JSON with the given separators, the kv key spelt as asked, keys in the object's own order."""
    item, colon = seps
    if isinstance(obj, dict):
        parts = []
        for k, v in obj.items():
            name = _spell(k, escape) if k == "kv_transfer_params" else json.dumps(k)
            parts.append(name + colon + _encode(v, seps, escape).decode())
        return ("{" + item.join(parts) + "}").encode()
    if isinstance(obj, list):
        return ("[" + item.join(_encode(v, seps, escape).decode() for v in obj) + "]").encode()
    return json.dumps(obj).encode()


def _has_kv(obj) -> bool:
    return "kv_transfer_params" in obj or any("kv_transfer_params" in c for c in obj.get("choices", []))


@given(
    kv=kv_values,
    position=st.integers(0, 3),
    nested=st.booleans(),
    seps=formats,
    escape=st.lists(st.booleans(), max_size=18),
    collect=st.booleans(),
    text=st.text(max_size=8),
)
def test_a_chunk_carrying_kv_params_is_always_stripped(kv, position, nested, seps, escape, collect, text):
    from duplex_sidecars.router.relay import StreamRelay

    choice = {"index": 0, "delta": {"content": text}, "finish_reason": "stop"}
    chunk = {"id": "x", "object": "chat.completion.chunk", "choices": [choice]}
    target = choice if nested else chunk
    items = list(target.items())
    items.insert(position % (len(items) + 1), ("kv_transfer_params", kv))
    target.clear()
    target.update(items)
    plain = {"id": "x", "choices": [{"index": 0, "delta": {"content": "a"}, "finish_reason": None}]}
    first = b"data: " + json.dumps(plain).encode() + b"\n\n"
    stream = first + b"data: " + _encode(chunk, seps, escape) + b"\n\ndata: [DONE]\n\n"

    relay = StreamRelay(ReplyCollector("chat") if collect else None)
    out = bytes(relay.take(SSEParser().feed(stream))) + bytes(relay.held)
    assert relay.finished and out.startswith(first)  # an event without the params goes out byte for byte
    assert out.endswith(b"data: [DONE]\n\n")  # held with the rest until the entry is stored
    events = [json.loads(e.data) for e in run([out]) if e.data != b"[DONE]"]
    assert len(events) == 2 and not any(_has_kv(e) for e in events)
    assert events[1]["choices"][0]["delta"]["content"] == text
    assert relay.kv_params == kv
    if collect:
        assert relay.collector.reply().content == "a" + text


def test_chunks_without_params_are_relayed_untouched_and_only_parsed_when_collecting():
    from duplex_sidecars.router.relay import StreamRelay

    weird = b'data: {"choices": [{"index": 0, "delta": {"content": "x"}}],   "note": "spaced"}\n\n'
    for collector in (None, ReplyCollector("chat")):
        relay = StreamRelay(collector)
        assert relay.take(SSEParser().feed(weird)) == weird
    mention = b'data: {"choices": [{"index": 0, "delta": {"content": "the kv_transfer_params field"}}]}\n\n'
    relay = StreamRelay(None)
    assert relay.take(SSEParser().feed(mention)) == mention  # named in the text only: nothing to strip


def test_events_that_are_not_utf8_are_read_as_replacement_characters():
    from duplex_sidecars.router.relay import StreamRelay

    relay = StreamRelay(ReplyCollector("chat"))
    event = b'data: {"choices":[{"index":0,"delta":{"content":"a\xffb"},"finish_reason":"stop"}]}\n\n'
    assert relay.take(SSEParser().feed(event + b"data: [DONE]\n\n")) == event
    assert relay.collector.reply().content == "a\ufffdb"


def _relay_all(chunks: list[bytes], collect: bool, plain: bool):
    """What the router's stream relay makes of `chunks`: the bytes sent (and held), the reply, the params."""
    from duplex_sidecars.router.relay import StreamRelay

    relay, parser, out = StreamRelay(ReplyCollector("chat") if collect else None), SSEParser(), bytearray()
    for chunk in chunks:
        batch = relay.take_plain(parser, chunk) if plain else None
        if batch is None:
            batch = relay.take(parser.feed(chunk))
        out += batch
        if relay.finished:
            break
    else:
        out += relay.take(parser.close())
    reply = relay.collector.reply() if collect else None
    return bytes(out), bytes(relay.held), relay.finished, reply, relay.kv_params


token_events = st.lists(
    st.one_of(
        st.builds(
            lambda t, f: {"choices": [{"index": 0, "delta": {"content": t}, "finish_reason": f}]},
            st.text(max_size=6),
            st.sampled_from([None, "stop", "length"]),
        ),
        st.builds(
            lambda kv: {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}], "kv_transfer_params": kv},
            st.dictionaries(st.sampled_from(["a", "b"]), st.integers()),
        ),
    ),
    min_size=1,
    max_size=8,
)
extras = st.sampled_from(
    [
        b"",
        b": keep-alive\n\n",
        b"event: x\ndata: {}\n\n",
        b"data: [DONE]\n\n",
        b"data: nan\n\n",
        b'data: {"a":1}\r\n\r\n',
        b"\n\n",
        b"data: a\ndata: b\n\n",
        b"data: \\u006b\n\n",
        # vLLM 0.33's framing: every chunk before the last carries the params as null
        b'data: {"id":"c","choices":[{"index":0,"delta":{"content":"x"},"finish_reason":null}],"kv_transfer_params":null}\n\n',
        b'data: {"id":"c","choices":[{"index":0,"delta":{"content":"\\",\\"kv_transfer_params\\":null"}}],"kv_transfer_params":null}\n\n',
        b'data: {"kv_transfer_params":null,"choices":[]}\n\n',
        b'data: {"choices":[],"kv_transfer_params":null,"kv_transfer_params":{"a":1}}\n\n',
    ]
)


@given(
    token_events,
    st.lists(st.tuples(st.integers(0, 8), extras), max_size=3),
    st.lists(st.integers(0, 10_000), max_size=10),
    st.booleans(),
    st.booleans(),
)
def test_the_plain_fast_path_relays_exactly_what_the_event_path_does(objs, inserts, cuts, done, collect):
    events = [b"data: " + json.dumps(o).encode() + b"\n\n" for o in objs]
    for at, extra in inserts:
        events.insert(at % (len(events) + 1), extra)
    stream = b"".join(events) + (b"data: [DONE]\n\n" if done else b"") + b'data: {"after": 1}\n\n'
    chunks = split_at(stream, cuts)
    assert _relay_all(chunks, collect, plain=True) == _relay_all(chunks, collect, plain=False)


def test_vllm_033_null_params_are_cut_out_without_parsing():
    from duplex_sidecars.router.relay import StreamRelay

    tokens = b"".join(
        b'data: {"id":"c","choices":[{"index":0,"delta":{"content":"%d"},"finish_reason":null}],'
        b'"kv_transfer_params":null}\n\n' % i
        for i in range(3)
    )
    last = (
        b'data: {"id":"c","choices":[{"index":0,"delta":{},"finish_reason":"stop"}],"kv_transfer_params":{"a":1}}\n\n'
    )
    relay = StreamRelay(ReplyCollector("chat"))
    parser = SSEParser()
    sent = relay.take_plain(parser, tokens)
    assert sent == tokens.replace(b',"kv_transfer_params":null', b"")  # the fast path took it, bytes otherwise kept
    assert relay.take_plain(parser, last + b"data: [DONE]\n\n") is None  # real params: the event path
    relay.take(parser.feed(last + b"data: [DONE]\n\n"))
    assert relay.kv_params == {"a": 1} and b"kv_transfer_params" not in relay.held
    assert relay.collector.reply().content == "012"


def test_the_plain_fast_path_takes_whole_token_chunks_and_leaves_the_rest_pending():
    parser = SSEParser()
    chunk = b'data: {"x":1}\n\ndata: {"x":2}\n\ndata: {"x"'
    region, datas, rest = parser.split_plain(chunk)
    assert (
        region == b'data: {"x":1}\n\ndata: {"x":2}\n\n' and datas == [b'{"x":1}', b'{"x":2}'] and rest == b'data: {"x"'
    )
    parser.take_rest(rest)
    assert parser.split_plain(b":3}\n\n") is None  # something is pending: the event path finishes it
    assert [e.data for e in parser.feed(b":3}\n\n")] == [b'{"x":3}']
    assert SSEParser().split_plain(b": comment\n\ndata: {}\n\n") is None


@pytest.mark.parametrize("collect", [False, True])
def test_the_plain_fast_path_ends_the_stream_at_done(collect):
    tokens = b'data: {"choices":[{"index":0,"delta":{"content":"a"},"finish_reason":null}]}\n\n'
    chunks = [tokens, tokens + b"data: [DONE]\n\n", b'data: {"after": 1}\n\n']
    out, held, finished, reply, _ = _relay_all(chunks, collect, plain=True)
    assert (out, held, finished) == (tokens * 2, b"data: [DONE]\n\n", True)  # the end waits for the entry
    assert _relay_all(chunks, collect, plain=False) == (out, held, finished, reply, None)
    if collect:
        assert reply.content == "aa"
