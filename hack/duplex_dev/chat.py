"""A small multi-turn chat client for tests and benchmarks: keeps each conversation's history, sends the next turn
through the router (streaming or not), and refuses any response that leaks kv_transfer_params."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from duplex_sidecars.protocol import KV_PARAMS_FIELD


class LeakedParams(AssertionError):
    """A response to the client carried kv_transfer_params (engine ids, block ids, pod addresses)."""


class TurnFailed(AssertionError):
    def __init__(self, status: int, body: Any):
        super().__init__(f"HTTP {status}: {body}")
        self.status = status
        self.body = body


def check_no_params(obj: Any) -> None:
    if KV_PARAMS_FIELD in json.dumps(obj):
        raise LeakedParams(f"kv_transfer_params reached the client: {obj}")


def sse_events(raw: bytes) -> list[Any]:
    events: list[Any] = []
    for block in raw.decode().replace("\r\n", "\n").split("\n\n"):
        for line in block.split("\n"):
            if line.startswith("data:"):
                data = line[5:].strip()
                events.append(data if data == "[DONE]" else json.loads(data))
    return events


@dataclass
class Streamed:
    """A streamed chat completion as a client saw it: seconds to its first content, its text and its usage."""

    first: float | None
    text: str
    usage: dict[str, Any]


async def read_stream(resp: aiohttp.ClientResponse, started: float) -> Streamed:
    """Consume a streamed chat completion line by line (the time of the first content matters), refusing any chunk
    that carries kv_transfer_params."""
    first, text, usage = None, "", {}
    async for raw in resp.content:
        line = raw.decode().strip()
        if not line.startswith("data:") or line == "data: [DONE]":
            continue
        chunk = json.loads(line[5:])
        check_no_params(chunk)
        for choice in chunk.get("choices") or []:
            piece = (choice.get("delta") or {}).get("content") or ""
            if piece and first is None:
                first = time.perf_counter() - started
            text += piece
        usage = chunk.get("usage") or usage
    return Streamed(first, text, usage)


@dataclass
class TurnResult:
    text: str
    status: int
    seconds: float
    ttft: float
    events: list[Any] = field(default_factory=list)
    body: Any = None


@dataclass
class Conversation:
    conversation_id: str | None
    messages: list[dict[str, Any]] = field(default_factory=list)
    headers: dict[str, str] = field(default_factory=dict)


class ChatClient:
    def __init__(self, base_url: str, model: str = "sim", session: aiohttp.ClientSession | None = None):
        self.base = base_url.rstrip("/")
        self.model = model
        self._session = session
        self._own = session is None

    async def __aenter__(self) -> ChatClient:
        if self._session is None:
            self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
        return self

    async def __aexit__(self, *_: Any) -> None:
        if self._own and self._session is not None:
            await self._session.close()

    async def send(
        self,
        messages: list[dict[str, Any]],
        conversation_id: str | None = None,
        stream: bool = False,
        headers: dict[str, str] | None = None,
        **extra: Any,
    ) -> TurnResult:
        """One chat request; raises TurnFailed on an HTTP error and LeakedParams on a leak."""
        assert self._session is not None
        body: dict[str, Any] = {"model": self.model, "messages": messages, "stream": stream, **extra}
        if conversation_id is not None:
            body["conversation_id"] = conversation_id
        started = time.perf_counter()
        async with self._session.post(self.base + "/v1/chat/completions", json=body, headers=headers or {}) as resp:
            if stream and resp.status == 200:
                first = None
                raw = bytearray()
                async for chunk in resp.content.iter_any():
                    if first is None:
                        first = time.perf_counter()
                    raw += chunk
                events = sse_events(bytes(raw))
                check_no_params(events)
                text = ""
                for event in events:
                    if isinstance(event, dict):
                        if "error" in event:
                            raise TurnFailed(200, event)
                        for choice in event.get("choices") or []:
                            text += (choice.get("delta") or {}).get("content") or ""
                elapsed = time.perf_counter() - started
                return TurnResult(text, 200, elapsed, (first or time.perf_counter()) - started, events=events)
            raw_body = await resp.read()
            elapsed = time.perf_counter() - started
            try:
                parsed = json.loads(raw_body)
            except ValueError:
                parsed = raw_body
            if resp.status != 200:
                raise TurnFailed(resp.status, parsed)
            check_no_params(parsed)
            return TurnResult(parsed["choices"][0]["message"]["content"] or "", 200, elapsed, elapsed, body=parsed)

    async def turn(self, conv: Conversation, user_text: str, stream: bool = False, **extra: Any) -> TurnResult:
        """Append a user message, send the history, append the assistant's reply."""
        conv.messages.append({"role": "user", "content": user_text})
        result = await self.send(conv.messages, conv.conversation_id, stream, conv.headers, **extra)
        conv.messages.append({"role": "assistant", "content": result.text})
        return result
