"""vLLM's OpenAI-compatible HTTP surface for the simulated engine.

Non-streaming replies carry a top-level `kv_transfer_params`. Streams are framed as vLLM 0.33 frames them: every
token chunk carries `"kv_transfer_params": null` and the chunk with `finish_reason` carries the params (still null
without bidirectional transfer); `--no-stream-kv-params` streams none at all, as vLLM 0.32 does.
"""

from __future__ import annotations

import hmac
import time
import uuid
from collections.abc import Awaitable, Callable
from contextlib import aclosing
from typing import Any

import orjson
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from duplex_sidecars.protocol import KV_PARAMS_FIELD, KV_REVISION_HEADER
from duplex_sidecars.sim import generation
from duplex_sidecars.sim.chat_template import TemplateError, render_chat
from duplex_sidecars.sim.engine import CorruptKV, Engine, GenerationRequest, KVLoadFailed, Running
from duplex_sidecars.sim.kv_blocks import OutOfBlocks
from duplex_sidecars.sim.messages_api import MessagesRoute
from duplex_sidecars.sim.responses_api import ResponsesRoute
from duplex_sidecars.sim.serving import trace_headers
from duplex_sidecars.sim.tokenizer import tokenize

VLLM_VERSION = "0.33.0+duplex.sim"
_MAX_TOKEN_ID = 2**31


class ApiError(Exception):
    def __init__(self, status: int, message: str, type_: str = "BadRequestError"):
        super().__init__(message)
        self.status, self.message, self.type = status, message, type_


def _error(status: int, message: str, type_: str) -> web.Response:
    return web.json_response(
        {"error": {"message": message, "type": type_, "param": None, "code": status}}, status=status
    )


def _event(obj: Any) -> bytes:
    """One SSE event, its JSON compact and UTF-8 as vLLM writes it (pydantic's JSON escapes no non-ASCII)."""
    return b"data: " + orjson.dumps(obj) + b"\n\n"


async def _json_body(request: web.Request) -> dict[str, Any]:
    try:
        body = await request.json()
    except ValueError as e:
        raise ApiError(400, f"invalid JSON body: {e}") from e
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    return body


def _opt_int(body: dict[str, Any], name: str, minimum: int) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ApiError(400, f"'{name}' must be an integer >= {minimum}")
    return value


def _salt(body: dict[str, Any]) -> str | None:
    """vLLM's cache_salt: a non-empty string, or absent."""
    value = body.get("cache_salt")
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise ApiError(400, "'cache_salt' must be a non-empty string")
    return value


def _completion_prompt(prompt: Any) -> list[int]:
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str):
        return tokenize(prompt)
    if (
        isinstance(prompt, list)
        and prompt
        and all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < _MAX_TOKEN_ID for t in prompt)
    ):
        return list(prompt)
    raise ApiError(400, "'prompt' must be a string or a list of token ids (batches are not supported)")


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def api_key_guard(api_key: str, every_path: bool = False) -> Any:
    """vLLM's --api-key: every /v1/* request needs `Authorization: Bearer <key>` (401 otherwise); /health, /metrics
    and /version stay open to probes and scrapers. `every_path`: as with duplex's engine guard in front of vLLM, every
    path but /health and /metrics needs it."""
    expected = f"Bearer {api_key}".encode()

    def is_open(request: web.Request) -> bool:
        if every_path:
            return request.path in ("/health", "/metrics")
        return request.method == "OPTIONS" or not request.path.startswith("/v1")

    @web.middleware
    async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
        if is_open(request):
            return await handler(request)
        if not hmac.compare_digest(request.headers.get("Authorization", "").encode(), expected):
            return web.json_response({"error": "Unauthorized"}, status=401)
        return await handler(request)

    return guard


def name_revision(app: web.Application, revision: str) -> None:
    """Every answer of `app` names the engine's KV revision, as duplex's engine guard makes vLLM's do."""

    async def stamp(_: web.Request, response: web.StreamResponse) -> None:
        response.headers[KV_REVISION_HEADER] = revision

    app.on_response_prepare.append(stamp)


class OpenAIApi:
    def __init__(self, engine: Engine):
        self.engine = engine
        self.model = engine.cfg.model

    def app(self) -> web.Application:
        key, every_path = self.engine.cfg.api_key, self.engine.cfg.key_on_every_path
        guards = [api_key_guard(key, every_path)] if key else []
        app = web.Application(client_max_size=64 * 1024 * 1024, middlewares=guards)
        if self.engine.cfg.kv_revision:
            name_revision(app, self.engine.cfg.kv_revision)
        app.router.add_post("/v1/chat/completions", self.chat_completions)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/health", self.health)
        app.router.add_get("/metrics", self.metrics)
        app.router.add_get("/version", self.version)
        ResponsesRoute(self.engine).add_to(app)  # /v1/responses: responses_api.py
        MessagesRoute(self.engine).add_to(app)  # /v1/messages: messages_api.py
        return app

    # -- plain routes -----------------------------------------------------------------------------------------
    async def health(self, _: web.Request) -> web.Response:
        return web.Response(status=200)

    async def version(self, _: web.Request) -> web.Response:
        return web.json_response({"version": VLLM_VERSION})

    async def metrics(self, _: web.Request) -> web.Response:
        return web.Response(body=self.engine.metrics.exposition(), headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def models(self, _: web.Request) -> web.Response:
        card = {
            "id": self.model,
            "object": "model",
            "created": int(time.time()),
            "owned_by": "vllm",
            "root": self.model,
            "parent": None,
            "max_model_len": self.engine.cfg.max_model_len,
            "permission": [],
        }
        return web.json_response({"object": "list", "data": [card]})

    # -- generation -------------------------------------------------------------------------------------------
    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        try:
            body = await _json_body(request)
            try:
                prompt = render_chat(body.get("messages"), body.get("tools"), body.get("add_generation_prompt", True))
            except TemplateError as e:
                raise ApiError(400, str(e)) from e
            max_tokens = _opt_int(body, "max_completion_tokens", 1)
            if max_tokens is None:
                max_tokens = _opt_int(body, "max_tokens", 1)
            return await self._serve(request, body, prompt, max_tokens, chat=True)
        except ApiError as e:
            return _error(e.status, e.message, e.type)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        try:
            body = await _json_body(request)
            prompt = _completion_prompt(body.get("prompt"))
            return await self._serve(request, body, prompt, _opt_int(body, "max_tokens", 1), chat=False)
        except ApiError as e:
            return _error(e.status, e.message, e.type)

    async def _serve(
        self, request: web.Request, body: dict[str, Any], prompt: list[int], max_tokens: int | None, chat: bool
    ) -> web.StreamResponse:
        model = body.get("model")
        if model is not None and model != self.model:
            raise ApiError(404, f"The model `{model}` does not exist.", "NotFoundError")
        if not prompt:
            raise ApiError(400, "The prompt cannot be empty.")
        limit = self.engine.cfg.max_model_len
        if len(prompt) + (max_tokens or 1) > limit:
            raise ApiError(
                400,
                f"This model's maximum context length is {limit} tokens; the request needs "
                f"{len(prompt)} prompt + {max_tokens or 1} output tokens.",
            )
        params = body.get(KV_PARAMS_FIELD)
        if params is not None and not isinstance(params, dict):
            raise ApiError(400, f"'{KV_PARAMS_FIELD}' must be an object")
        # vLLM: the response id comes from X-Request-Id when given; the engine-internal id adds a random suffix.
        response_id = f"{'chatcmpl' if chat else 'cmpl'}-{request.headers.get('X-Request-Id') or uuid.uuid4().hex}"
        greq = GenerationRequest(
            request_id=f"{response_id}-{uuid.uuid4().hex[:8]}",
            prompt=prompt,
            max_tokens=max_tokens,
            min_tokens=_opt_int(body, "min_tokens", 0) or 0,
            ignore_eos=bool(body.get("ignore_eos", False)),
            kv_params=params,
            cache_salt=_salt(body),
            trace_headers=trace_headers(request.headers),
        )
        try:
            run = await self.engine.prefill(greq)
        except (KVLoadFailed, CorruptKV) as e:
            return _error(500, str(e), "InternalServerError")
        except OutOfBlocks as e:
            return _error(503, str(e), "ServiceUnavailableError")
        reply = _Reply(response_id, self.model, chat, len(prompt))
        try:
            if body.get("stream"):
                include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
                return await self._stream(request, run, reply, include_usage)
            async with aclosing(self.engine.decode(run)) as tokens:
                async for _ in tokens:
                    pass
            return web.json_response(reply.full(run), headers={"X-Request-Id": response_id})
        except OutOfBlocks as e:
            return _error(503, str(e), "ServiceUnavailableError")
        finally:
            self.engine.abort(run)

    async def _stream(
        self, request: web.Request, run: Running, reply: _Reply, include_usage: bool
    ) -> web.StreamResponse:
        resp = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "X-Request-Id": reply.id}
        )
        await resp.prepare(request)

        async def send(obj: Any) -> None:
            await resp.write(_event(obj))

        stream_params = self.engine.cfg.stream_kv_params

        if reply.chat:
            await send(reply.chunk({"role": "assistant", "content": ""}, None))
        last = len(run.reply.tokens) - 1
        try:
            async with aclosing(self.engine.decode(run)) as tokens:
                async for i, tok in _enumerate(tokens):
                    if i < last:  # the last token waits for the end of decoding, which yields the kv params
                        chunk = reply.token_chunk(i, tok, None)
                        if stream_params:  # vLLM 0.33 sets the field on every token chunk (exclude_unset keeps it)
                            chunk[KV_PARAMS_FIELD] = None
                        await send(chunk)
        except OutOfBlocks as e:  # headers are gone already: report in-band, as vLLM does
            await send({"error": {"message": str(e), "type": "ServiceUnavailableError", "param": None, "code": 503}})
            await resp.write(b"data: [DONE]\n\n")
            return resp
        final = reply.token_chunk(last, run.reply.tokens[last], run.finish_reason)
        if stream_params:
            final[KV_PARAMS_FIELD] = run.kv_params_out
        await send(final)
        if include_usage:
            await send(reply.usage_chunk(len(run.output)))
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp


async def _enumerate(it: Any) -> Any:
    i = 0
    async for x in it:
        yield i, x
        i += 1


class _Reply:
    """Builds vLLM-shaped response bodies and SSE chunks for one request."""

    def __init__(self, id_: str, model: str, chat: bool, prompt_tokens: int):
        self.id, self.model, self.chat, self.prompt_tokens = id_, model, chat, prompt_tokens
        self.created = int(time.time())

    def _head(self, stream: bool) -> dict[str, Any]:
        kind = ("chat.completion" if self.chat else "text_completion") + (".chunk" if stream and self.chat else "")
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model}

    def usage(self, completion_tokens: int) -> dict[str, Any]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "total_tokens": self.prompt_tokens + completion_tokens,
            "completion_tokens": completion_tokens,
            "prompt_tokens_details": None,
        }

    def chunk(self, delta: dict[str, Any] | str, finish_reason: str | None) -> dict[str, Any]:
        choice: dict[str, Any] = {"index": 0}
        if self.chat:
            choice["delta"] = delta
        else:
            choice["text"] = delta
        choice.update(logprobs=None, finish_reason=finish_reason, stop_reason=None)
        return {**self._head(stream=True), "choices": [choice]}

    def token_chunk(self, i: int, tok: int, finish_reason: str | None) -> dict[str, Any]:
        if self.chat:
            return self.chunk({"content": generation.chat_delta(i, tok)}, finish_reason)
        return self.chunk(generation.completion_delta(tok), finish_reason)

    def usage_chunk(self, completion_tokens: int) -> dict[str, Any]:
        return {**self._head(stream=True), "choices": [], "usage": self.usage(completion_tokens)}

    def full(self, run: Running) -> dict[str, Any]:
        choice: dict[str, Any] = {"index": 0}
        if self.chat:
            choice["message"] = {
                "role": "assistant",
                "content": generation.chat_text(run.output),
                "tool_calls": [],
                "reasoning_content": None,
            }
        else:
            choice["text"] = "".join(generation.completion_delta(t) for t in run.output)
        choice.update(logprobs=None, finish_reason=run.finish_reason, stop_reason=None)
        return {
            **self._head(stream=False),
            "choices": [choice],
            "usage": self.usage(len(run.output)),
            "prompt_logprobs": None,
            KV_PARAMS_FIELD: run.kv_params_out,
        }
