"""A tiny in-test stand-in for a vLLM engine (either role): it records every request and misbehaves on demand."""

from __future__ import annotations

import asyncio
import json
import uuid
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestServer
from multidict import CIMultiDict

from duplex_sidecars.protocol import KV_REVISION_HEADER


@dataclass
class Seen:
    path: str
    headers: CIMultiDict[str]
    body: dict[str, Any]
    peer: Any = None  # the client's (host, port): which pooled connection carried the request


@dataclass
class FakeEngine:
    """Actions queued in `actions` apply to the next requests, one each:
    500 / 503 / 400: answer with that status; "drop": close the connection without answering;
    "break": (decode, streaming) send the first chunk then drop the connection; "hang": never answer;
    "no_params": answer without kv_transfer_params; "trailing_garbage": no [DONE] at the end;
    "stall_start" / "stall_mid": (decode, streaming) go quiet for `stall_seconds` before the first event / after it;
    "slow_end": (decode, streaming) end the body `stall_seconds` after [DONE]."""

    name: str
    words: tuple[str, ...] = ("hello", " world", " again")
    actions: list[Any] = field(default_factory=list)
    seen: list[Seen] = field(default_factory=list)
    finish_reason: str = "stop"
    stop_reason: Any = None
    reasoning: str | None = None
    server: TestServer | None = None
    health_status: int = 200
    stall_seconds: float = 3.0
    stream_ended_at: float | None = None  # loop time when the last streamed body ended
    revision: str | None = None  # the KV revision its answers name (X-Duplex-KV-Revision); None: none named

    @property
    def url(self) -> str:
        assert self.server is not None
        return str(self.server.make_url("")).rstrip("/")

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._handle)
        app.router.add_post("/v1/completions", self._handle)
        app.router.add_get("/health", self._health)
        app.router.add_get("/v1/models", self._models)
        app.on_response_prepare.append(self._name_revision)
        return app

    async def _name_revision(self, request: web.Request, response: web.StreamResponse) -> None:
        if self.revision is not None:
            response.headers[KV_REVISION_HEADER] = self.revision

    async def start(self) -> FakeEngine:
        self.server = TestServer(self.app())
        await self.server.start_server()
        return self

    async def close(self) -> None:
        if self.server is not None:
            await self.server.close()

    async def _health(self, request: web.Request) -> web.Response:
        return web.Response(status=self.health_status)

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "m", "object": "model"}]})

    def d_params(self, request_id: str) -> dict[str, Any]:
        return {
            "do_remote_prefill": False,
            "do_remote_decode": True,
            "remote_block_ids": [[7, 8, 9]],
            "remote_engine_id": self.name,
            "remote_request_id": request_id,
            "remote_host": self.server.host if self.server is not None else "127.0.0.1",  # its side channel's
            "remote_port": 5600,
            "tp_size": 1,
            "remote_num_tokens": 42,
            "remote_blocks_expiry_time": 1234.5,
        }

    def p_params(self, request_id: str) -> dict[str, Any]:
        return {
            "do_remote_prefill": True,
            "do_remote_decode": False,
            "remote_block_ids": [[1, 2]],
            "remote_engine_id": self.name,
            "remote_request_id": request_id,
            "remote_host": "10.1.1.1",
            "remote_port": 5601,
            "tp_size": 1,
            "remote_num_tokens": 30,
        }

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        peer = request.transport.get_extra_info("peername") if request.transport is not None else None
        self.seen.append(Seen(request.path, CIMultiDict(request.headers), body, peer))
        action = self.actions.pop(0) if self.actions else None
        rid = request.headers.get("X-Request-Id", uuid.uuid4().hex)
        if isinstance(action, int):
            return web.json_response(
                {"error": {"message": f"fake {action}", "type": "Err", "code": action}}, status=action
            )
        if action == "drop":
            assert request.transport is not None
            request.transport.close()
            await asyncio.sleep(0.05)
            return web.Response()
        if action == "hang":
            await asyncio.sleep(3600)
        chat = request.path.endswith("chat/completions")
        kv_in = body.get("kv_transfer_params") or {}
        if kv_in.get("do_remote_decode"):  # the prefill leg
            return web.json_response(
                self._full(chat, rid, [self.words[0]], "length", None if action == "no_params" else self.p_params(rid))
            )
        params = None if action == "no_params" else self.d_params(rid)
        if not body.get("stream"):
            return web.json_response(self._full(chat, rid, list(self.words), self.finish_reason, params))
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        if action == "stall_start":
            await asyncio.sleep(self.stall_seconds)
        if chat:
            await resp.write(_event(self._chunk(chat, rid, {"role": "assistant", "content": ""}, None)))
        for i, word in enumerate(self.words):
            last = i == len(self.words) - 1
            delta: Any = {"content": word} if chat else word
            chunk = self._chunk(chat, rid, delta, self.finish_reason if last else None)
            if last and self.reasoning and chat:
                chunk["choices"][0]["delta"]["reasoning_content"] = self.reasoning
            if last and params is not None:
                chunk["kv_transfer_params"] = params
            await resp.write(_event(chunk))
            if action == "break" and i == 0:
                assert request.transport is not None
                request.transport.close()
                return resp
            if action == "stall_mid" and i == 0:
                await asyncio.sleep(self.stall_seconds)
        if action != "trailing_garbage":
            await resp.write(b"data: [DONE]\n\n")
        if action == "slow_end":
            await asyncio.sleep(self.stall_seconds)
        await resp.write_eof()
        self.stream_ended_at = asyncio.get_running_loop().time()
        return resp

    def _chunk(self, chat: bool, rid: str, delta: Any, finish: str | None) -> dict[str, Any]:
        choice: dict[str, Any] = {
            "index": 0,
            "finish_reason": finish,
            "stop_reason": self.stop_reason if finish else None,
        }
        choice["delta" if chat else "text"] = delta
        return {"id": rid, "object": "chat.completion.chunk" if chat else "text_completion", "choices": [choice]}

    def _full(self, chat: bool, rid: str, words: list[str], finish: str, params: Any) -> dict[str, Any]:
        text = "".join(words)
        choice: dict[str, Any] = {"index": 0, "finish_reason": finish, "stop_reason": self.stop_reason}
        if chat:
            choice["message"] = {
                "role": "assistant",
                "content": text,
                "tool_calls": [],
                "reasoning_content": self.reasoning,
            }
        else:
            choice["text"] = text
        out: dict[str, Any] = {
            "id": rid,
            "object": "chat.completion" if chat else "text_completion",
            "choices": [choice],
            "usage": {"prompt_tokens": 3},
        }
        if params is not None:
            out["kv_transfer_params"] = params
        return out


def _event(obj: Any) -> bytes:
    return f"data: {json.dumps(obj)}\n\n".encode()
