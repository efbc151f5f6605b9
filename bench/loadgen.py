"""The load: closed-loop agentic chat clients. Each client runs conversations of several turns under one
`conversation_id`, resending the whole history every turn, and records latency and time to first byte of every
request. One cell = one contender x one mode (streaming or not) x one number of clients, for a fixed window."""

from __future__ import annotations

import asyncio
import json
import random
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Protocol

import aiohttp

from duplex_sidecars.protocol import KV_PARAMS_FIELD

JSON_HEADERS = {"Content-Type": "application/json"}

_SYLLABLES = ("ba", "ce", "di", "fo", "gu", "ha", "ke", "li", "mo", "nu", "pa", "re", "si", "to", "vu", "wy")
_VOCAB = tuple(a + b + c for a in _SYLLABLES for b in _SYLLABLES for c in _SYLLABLES[:8])


def _text(rng: random.Random, words: int) -> str:
    # Every word is one token of the simulator's tokenizer; a full stop every dozen words is one more.
    out = []
    for i in range(words):
        out.append(rng.choice(_VOCAB))
        if i % 12 == 11:
            out.append(".")
    return " ".join(out)


@dataclass(frozen=True)
class Workload:
    turns: int = 4  # turns per conversation
    system_words: int = 200  # shared system prompt (an agent's instructions)
    user_words: int = 40  # each user or tool-result message
    reply_tokens: int = 32  # max_tokens with ignore_eos: every reply is exactly this long
    model: str = "sim"

    def system_prompt(self) -> str:
        return _text(random.Random(0), self.system_words)


class Conversation:
    """One agentic chat: the history the client resends, and (for the floor only) decode's last replayable params."""

    def __init__(self, workload: Workload, system_prompt: str, rng: random.Random):
        self.id = uuid.uuid4().hex
        self.workload = workload
        self.rng = rng
        self.messages: list[dict[str, Any]] = [
            {"role": "system", "content": system_prompt},
            {"role": "user", "content": _text(rng, workload.user_words)},
        ]
        self.turn = 0
        self.replay: dict[str, Any] | None = None

    def body(self, stream: bool) -> dict[str, Any]:
        return {
            "model": self.workload.model,
            "messages": list(self.messages),
            "max_tokens": self.workload.reply_tokens,
            "ignore_eos": True,
            "stream": stream,
        }

    def advance(self, reply_text: str) -> None:
        self.messages.append({"role": "assistant", "content": reply_text})
        self.messages.append({"role": "user", "content": _text(self.rng, self.workload.user_words)})
        self.turn += 1


@dataclass
class Outcome:
    ok: bool
    started: float
    first_byte: float = 0.0
    finished: float = 0.0
    text: str = ""
    kv: Any = None  # kv_transfer_params seen in the reply (only engines and leaky routers show them)
    replayed: bool = False  # the floor replayed decode's blocks on this turn
    error: str | None = None


class Contender(Protocol):
    name: str

    async def turn(self, session: aiohttp.ClientSession, conv: Conversation, stream: bool) -> Outcome: ...


class InBandError(ValueError):
    """The stream carried an error event (the answer had started, so it could not be an HTTP status)."""


@dataclass
class Stream:
    """What a chat completion's SSE stream has said so far, taken a line at a time."""

    parts: list[str] = field(default_factory=list)  # the reply's text, as it came
    kv: Any = None  # kv_transfer_params, if an event carried them
    done: bool = False  # [DONE] came

    def take(self, line: bytes) -> bool:
        """Read one line of the stream; True when it carried reply text. Raises InBandError on an error event."""
        if not line.startswith(b"data:"):
            return False
        data = line[5:].strip()
        if data == b"[DONE]":
            self.done = True
            return False
        event = json.loads(data)
        if "error" in event:
            raise InBandError(f"in-band error: {event['error']}")
        if KV_PARAMS_FIELD in event:
            self.kv = event[KV_PARAMS_FIELD]
        before = len(self.parts)
        for choice in event.get("choices") or ():
            content = (choice.get("delta") or {}).get("content")
            if content:
                self.parts.append(content)
        return len(self.parts) > before


async def read_reply(resp: aiohttp.ClientResponse, stream: bool, out: Outcome) -> None:
    """Read a chat completion (JSON or SSE) into `out`: time of the first body byte, the reply text, kv params."""
    if resp.status != 200:
        body = await resp.read()
        out.ok, out.error = False, f"HTTP {resp.status}: {body[:200]!r}"
        return
    buf = bytearray()
    said = Stream()
    async for chunk in resp.content.iter_any():
        if not out.first_byte:
            out.first_byte = time.perf_counter()
        buf += chunk
        if not stream:
            continue
        while True:
            end = buf.find(b"\n\n")
            if end < 0:
                break
            event = bytes(buf[:end])
            del buf[: end + 2]
            try:
                for line in event.split(b"\n"):
                    said.take(line)
            except InBandError as err:
                out.ok, out.error = False, str(err)
                return
    out.finished = time.perf_counter()
    if stream:
        out.text, out.kv = "".join(said.parts), said.kv
        out.ok = said.done
        if not said.done:
            out.error = "stream ended without [DONE]"
        return
    obj = json.loads(buf)
    out.kv = obj.get(KV_PARAMS_FIELD)
    out.text = obj["choices"][0]["message"]["content"] or ""
    out.ok = True


@dataclass
class Sample:
    latency: float  # seconds, request sent -> last byte
    ttfb: float  # seconds, request sent -> first body byte
    turn: int


@dataclass
class CellRun:
    """What the clients saw during one cell's measurement window."""

    samples: list[Sample] = field(default_factory=list)
    errors: int = 0
    error_examples: list[str] = field(default_factory=list)
    replayed: int = 0  # floor only
    followups: int = 0  # successful turns after a conversation's first, over the whole cell
    window: float = 0.0
    window_start: float = 0.0
    window_end: float = 0.0


async def run_cell(
    contender: Contender,
    session: aiohttp.ClientSession,
    workload: Workload,
    clients: int,
    stream: bool,
    warmup: float,
    duration: float,
    on_window: Any = None,
) -> CellRun:
    """Closed loop: `clients` concurrent clients for warmup + duration seconds. A request counts when it finishes
    inside the window [start + warmup, start + warmup + duration]. `on_window(edge)` is awaited at both edges
    ("start", "end") to snapshot CPU counters."""
    run = CellRun(window=duration)
    system_prompt = workload.system_prompt()
    start = time.perf_counter()
    run.window_start = start + warmup
    run.window_end = run.window_start + duration

    async def client(index: int) -> None:
        rng = random.Random(f"{contender.name}-{index}-{start}")
        # A first conversation of random length puts the clients at different turns, as in a steady state.
        turns = rng.randint(1, workload.turns)
        while time.perf_counter() < run.window_end:
            conv = Conversation(workload, system_prompt, rng)
            for _ in range(turns):
                if time.perf_counter() >= run.window_end:
                    return
                try:
                    out = await contender.turn(session, conv, stream)
                except (TimeoutError, aiohttp.ClientError, OSError, ValueError, KeyError) as exc:
                    out = Outcome(False, 0.0, finished=time.perf_counter(), error=f"{type(exc).__name__}: {exc}")
                in_window = run.window_start <= out.finished <= run.window_end
                if not out.ok:
                    if in_window:
                        run.errors += 1
                        if len(run.error_examples) < 3:
                            run.error_examples.append(out.error or "?")
                    break  # the history is now uncertain: start a new conversation
                if in_window:
                    run.samples.append(Sample(out.finished - out.started, out.first_byte - out.started, conv.turn))
                    run.replayed += out.replayed
                run.followups += conv.turn > 0
                conv.advance(out.text)
            turns = workload.turns

    async def edges() -> None:
        await asyncio.sleep(max(0.0, run.window_start - time.perf_counter()))
        if on_window:
            await on_window("start")
        await asyncio.sleep(max(0.0, run.window_end - time.perf_counter()))
        if on_window:
            await on_window("end")

    await asyncio.gather(edges(), *(client(i) for i in range(clients)))
    return run
