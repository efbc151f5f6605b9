"""What the Responses and Messages routes share: one request through the engine core the chat route uses (prefill
with the P-D protocol, decode, retention), vLLM's length rules, its SSE framing, and its internal-error answer."""

from __future__ import annotations

import logging
import uuid
from collections.abc import AsyncIterator, Mapping
from contextlib import aclosing, asynccontextmanager
from typing import Any

import orjson
from aiohttp import web

from duplex_sidecars.sim.engine import CorruptKV, Engine, GenerationRequest, KVLoadFailed, Running
from duplex_sidecars.sim.validation import invalid

log = logging.getLogger("duplex.sim.serving")

TRACE_HEADERS = ("traceparent", "tracestate")  # vllm.tracing.utils.TRACE_HEADERS
SSE_HEADERS = {"Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache"}


def random_uuid() -> str:
    """vLLM 0.33's random_uuid: 16 hex digits (vllm/utils/__init__.py)."""
    return f"{uuid.uuid4().int & (2**64 - 1):016x}"


class GenerationFailed(Exception):
    """vLLM's GenerationError: the engine finished the request with an error (a failed KV load with
    kv_load_failure_policy=fail, or corrupt blocks under --fail-on-corrupt); clients see "Internal server error"."""

    message = "Internal server error"


def sampled_max_tokens(max_model_len: int, requested: int | None, prompt_len: int) -> int:
    """vLLM's get_max_tokens without generation-config defaults: the request's cap, never past the context."""
    room = max_model_len - prompt_len
    return room if requested is None else min(room, requested)


def check_max_tokens(max_tokens: int) -> None:
    """SamplingParams' check, which a cap of 0 (or a full context) fails."""
    if max_tokens < 1:
        raise invalid(f"max_tokens must be at least 1, got {max_tokens}.", "max_tokens", max_tokens)


def check_prompt_fits(prompt_len: int, max_model_len: int) -> None:
    """The renderer's token-length check (TokenizeParams._token_len_check)."""
    if prompt_len > max_model_len:
        raise invalid(
            f"This model's maximum context length is {max_model_len} tokens. However, your prompt contains "
            f"{prompt_len} input tokens, which exceeds this limit even without any output tokens. Please reduce the "
            "length of the input prompt.",
            "input_tokens",
            prompt_len,
        )


def trace_headers(headers: Mapping[str, str]) -> dict[str, str] | None:
    """vLLM's _get_trace_headers: the request's W3C traceparent and tracestate, None without either."""
    found = {name: value for name in TRACE_HEADERS if (value := headers.get(name)) is not None}
    return found or None


def kv_params(value: Any) -> dict[str, Any] | None:
    """A copy of the request's kv_transfer_params (already checked to be an object or null)."""
    return dict(value) if isinstance(value, dict) else None


def reported_cached_tokens(run: Running) -> int:
    """Prompt tokens the response reports as cached: decode reports prefill's hits when prefill's params carry them
    (vLLM's output processor, remote_prefill_cached_tokens), others their own local hits plus remote KV."""
    params = run.req.kv_params or {}
    cached = params.get("remote_prefill_cached_tokens")
    if params.get("do_remote_prefill") and isinstance(cached, int) and not isinstance(cached, bool):
        return cached
    return run.num_cached_tokens


@asynccontextmanager
async def generation(engine: Engine, greq: GenerationRequest) -> AsyncIterator[Running]:
    """A request between prefill and the end of decoding; one that does not finish is aborted (no params)."""
    try:
        run = await engine.prefill(greq)
    except (KVLoadFailed, CorruptKV) as e:
        log.warning("request %s failed: %s", greq.request_id, e)
        raise GenerationFailed(str(e)) from e
    try:
        yield run
    finally:
        engine.abort(run)


async def decode_all(engine: Engine, run: Running) -> None:
    async with aclosing(engine.decode(run)) as tokens:
        async for _ in tokens:
            pass


def sse(event: str, obj: Any) -> bytes:
    """One SSE event with its name, the data compact JSON as pydantic's model_dump_json writes it."""
    return b"event: " + event.encode() + b"\ndata: " + orjson.dumps(obj) + b"\n\n"


async def open_stream(request: web.Request) -> web.StreamResponse:
    resp = web.StreamResponse(headers=SSE_HEADERS)
    await resp.prepare(request)
    return resp


def cut(request: web.Request) -> None:
    """Drop the connection mid-stream, as uvicorn does when a streaming generator raises."""
    if request.transport is not None:
        request.transport.abort()
