"""Decode's SSE events on their way to the client: kv_transfer_params come out, the reply is collected for the
conversation's entry, and the end of the stream is held back until that entry is stored. No I/O here: the pipeline
feeds bytes in and writes out what comes back.

Events go out as their raw bytes. Only an event whose bytes could spell kv_transfer_params (the name itself, or any
JSON \\u escape) is parsed and written anew; plain token chunks take a one-step path with no event objects at all
(its equivalence with the event-by-event path is a property test in tests/unit/router/test_sse.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson

from duplex_sidecars import protocol
from duplex_sidecars.router import jsonio
from duplex_sidecars.router.errors import sse_error_event
from duplex_sidecars.router.sse import DONE, SSEEvent, SSEParser

_KV_MARKER = protocol.KV_PARAMS_FIELD.encode()
_ESCAPE = b"\\u"  # a JSON \\u escape: a key could spell kv_transfer_params without the marker's bytes
DONE_EVENT = b"data: [DONE]\n\n"
# vLLM 0.33 writes `"kv_transfer_params":null` into every streamed chunk before the last. Outside a JSON string (where
# every quote is escaped) these bytes can only be an object member with nothing in it: they are cut out as bytes.
_NULL_PARAMS = b',"' + protocol.KV_PARAMS_FIELD.encode() + b'":null'


def _only_null_params(raw: bytes) -> bool:
    """Every mention of the params in `raw` is the null member (and no \\u escape could hide another)."""
    return _ESCAPE not in raw and raw.count(_KV_MARKER) == raw.count(_NULL_PARAMS)


@dataclass(frozen=True)
class StreamShape:
    """How a client API's streams end and break. OpenAI's end with `data: [DONE]` and their token chunks may take the
    plain path; Responses and Anthropic streams end with a named event."""

    done_marker: bool = True
    terminal_events: frozenset[str] = frozenset()
    plain_chunks: bool = True
    error: Callable[[str], bytes] = field(default=lambda message: sse_error_event(message, "server_error", 502))


class StreamRelay:
    """One stream's filter: `take_plain` or `take` turn what arrived into the bytes to send now; from the event
    that carried the params on, and the stream's last event in any case, everything is `held` for the pipeline to
    send once the entry is stored."""

    def __init__(self, collector: Any, shape: StreamShape = StreamShape()):
        self.collector = collector
        self.shape = shape
        self.kv_params: Any = None
        self.held = bytearray()
        self.finished = False

    def take(self, events: list[SSEEvent]) -> bytes | bytearray:
        """Process events; returns the bytes to send now."""
        batch = bytearray()
        for event in events:
            if self.finished:
                break
            raw = self._filter(event)
            if raw is not None:
                (self.held if self.kv_params is not None else batch).extend(raw)
        return batch

    def take_plain(self, parser: SSEParser, chunk: bytes) -> bytes | None:
        """`take` for the common chunk in one step: plain token events that cannot carry the params go out as the
        chunk's own bytes, with no event objects; a final [DONE] ends the stream. None when the chunk needs the
        event-by-event path (nothing consumed then)."""
        if self.finished or self.kv_params is not None or not self.shape.plain_chunks or _ESCAPE in chunk:
            return None
        if _KV_MARKER in chunk:
            if not _only_null_params(chunk):
                return None
            chunk = chunk.replace(_NULL_PARAMS, b"")
        split = parser.split_plain(chunk)
        if split is None:
            return None
        region, datas, rest = split
        done = datas[-1] == DONE
        if done:
            datas.pop()
            region = region[: -len(DONE_EVENT)]
        if DONE in datas:  # [DONE] before the last event: the event-by-event path stops at it
            return None
        if self.collector is not None:
            for data in datas:
                self._collect(data)
        if done:
            self.finished = True  # what follows [DONE] is ignored, as `take` does
            self.held += DONE_EVENT  # the end goes out once the entry is stored
        else:
            parser.take_rest(rest)
        return region

    def _filter(self, event: SSEEvent) -> bytes | None:
        """The bytes of `event` to send now; None for what is dropped or held (the stream's end)."""
        data = event.data
        if data is None:
            return event.raw
        if self.shape.done_marker and data == DONE:
            self.finished = True
            self.held += event.raw  # goes out once the entry is stored
            return None
        out = self._rewritten(event, data)
        if event.event is not None and event.event in self.shape.terminal_events:
            self.finished = True
            if out is not None:
                self.held += out
            return None
        return out

    def _rewritten(self, event: SSEEvent, data: bytes) -> bytes | None:
        raw = event.raw
        if _KV_MARKER in raw and _only_null_params(raw):
            raw = raw.replace(_NULL_PARAMS, b"")
            data = data.replace(_NULL_PARAMS, b"")
        marked = _KV_MARKER in raw or _ESCAPE in raw
        if not marked:
            if self.collector is not None:
                self._collect(data)
            return raw
        try:  # an event that may carry the params: parsed to be written anew without them
            obj, exact = _event_json(data, True)
        except ValueError:
            return None  # unparseable and possibly internal: dropped
        if not isinstance(obj, dict):
            return None
        if self.collector is not None:
            self.collector.add(obj, exact)
        found, present = protocol.strip_kv_params(obj)
        if found is not None:
            self.kv_params = found
        if not present:
            return raw
        name = b"event: %s\n" % event.event.encode() if event.event is not None else b""
        return name + b"data: " + jsonio.dumps(obj, exact) + b"\n\n"

    def _collect(self, data: bytes) -> None:
        """Show the collector an event that goes out as it is (the common case, kept lean: one per token)."""
        try:
            obj, exact = orjson.loads(data), True
        except orjson.JSONDecodeError:
            try:
                obj, exact = _event_json(data, False)  # NaN, bytes that are not UTF-8, ...
            except ValueError:
                return
        if type(obj) is dict:
            self.collector.add(obj, exact)


def _event_json(data: bytes, written_back: bool) -> tuple[Any, bool]:
    try:
        return jsonio.loads(data, written_back)
    except UnicodeDecodeError:  # bytes that are not UTF-8 read as U+FFFD, as SSE clients read them
        return jsonio.loads(data.decode("utf-8", "replace"), written_back)
