"""Incremental server-sent-events parsing: bytes arrive in arbitrary pieces, complete events come out.

Each event keeps its raw bytes so that the router can relay events it does not change without re-encoding them.
Data stays bytes: the router only ever searches it or hands it to a JSON parser.
"""

from __future__ import annotations

from typing import NamedTuple

DONE = b"[DONE]"


class SSEEvent(NamedTuple):
    raw: bytes
    data: bytes | None  # the data lines joined by "\n"; None for events without data (comments, keep-alives)
    event: str | None = None


class SSEParser:
    """Feed bytes, get the events completed so far. Handles LF, CRLF and CR line ends split anywhere."""

    def __init__(self, max_event_bytes: int = 64 * 1024 * 1024):
        self._buf = bytearray()
        self._max = max_event_bytes

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        self._buf += chunk
        if b"\r" not in self._buf:
            return self._split_lf()
        return self._split_general(final=False)

    def split_plain(self, chunk: bytes) -> tuple[bytes, list[bytes], bytes] | None:
        """The common case in one step: with nothing pending, a chunk whose complete events are all a single
        `data: ` line with LF endings. Returns (the complete events' bytes, their data, the rest) without consuming
        anything; None when the chunk needs `feed` (CR, comments, several data lines, no complete event, ...).
        `take_rest` then keeps the rest."""
        if self._buf or b"\r" in chunk:
            return None
        end = chunk.rfind(b"\n\n")
        if end < 0:
            return None
        parts = chunk[:end].split(b"\n\n")
        datas = []
        for part in parts:
            if not part.startswith(b"data: ") or b"\n" in part:
                return None
            datas.append(part[6:])
        return chunk[: end + 2], datas, chunk[end + 2 :]

    def take_rest(self, rest: bytes) -> None:
        """After `split_plain`: the incomplete tail becomes the pending buffer."""
        self._buf += rest
        self._check_size()

    def close(self) -> list[SSEEvent]:
        """Events left at the end of the stream; an unterminated last event counts if it has data."""
        events = self._split_general(final=True)
        if self._buf.strip():
            tail = bytes(self._buf)
            self._buf.clear()
            event = _parse(tail, tail.splitlines())
            if event.data is not None:
                events.append(event)
        self._buf.clear()
        return events

    @property
    def pending(self) -> int:
        return len(self._buf)

    def _check_size(self) -> None:
        if len(self._buf) > self._max:
            raise ValueError(f"SSE event larger than {self._max} bytes")

    def _split_lf(self) -> list[SSEEvent]:
        events = []
        buf = self._buf
        start = 0
        while True:
            end = buf.find(b"\n\n", start)
            if end < 0:
                break
            raw = bytes(buf[start : end + 2])
            if raw.startswith(b"data: ") and raw.find(b"\n") == len(raw) - 2:
                events.append(SSEEvent(raw, raw[6:-2]))  # the usual event: one data line
            else:
                events.append(_parse(raw, raw[:-2].split(b"\n")))
            start = end + 2
        del buf[:start]
        self._check_size()
        return events

    def _split_general(self, final: bool) -> list[SSEEvent]:
        events = []
        buf = self._buf
        pos = 0
        event_start = 0
        lines: list[bytes] = []
        n = len(buf)
        while pos < n:
            cr = buf.find(b"\r", pos)
            lf = buf.find(b"\n", pos)
            if cr < 0 and lf < 0:
                break
            if cr >= 0 and (lf < 0 or cr < lf):
                if cr + 1 == n and not final:
                    break  # may be the first half of CRLF
                line_end = cr
                nxt = cr + 2 if cr + 1 < n and buf[cr + 1] == 0x0A else cr + 1
            else:
                line_end = lf
                nxt = lf + 1
            line = bytes(buf[pos:line_end])
            pos = nxt
            if line:
                lines.append(line)
                continue
            if lines:
                events.append(_parse(bytes(buf[event_start:pos]), lines))
            lines = []
            event_start = pos
        del buf[:event_start]
        self._check_size()
        return events


def _parse(raw: bytes, lines: list[bytes]) -> SSEEvent:
    data: list[bytes] = []
    event = None
    for line in lines:
        if not line or line.startswith(b":"):
            continue
        field, sep, value = line.partition(b":")
        if sep and value.startswith(b" "):
            value = value[1:]
        if field == b"data":
            data.append(value)
        elif field == b"event":
            event = value.decode("utf-8", "replace")
    return SSEEvent(raw=raw, data=b"\n".join(data) if data else None, event=event)
