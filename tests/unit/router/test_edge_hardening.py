"""What a hostile or careless client could make the router do at its edge (issue 23): hold a request for ever by not
reading, smuggle credentials in a chunked trailer, crash the body parser with deep nesting."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import Callable

import pytest

from duplex_sidecars.router.attempts import BROKEN, CONNECT, STATUS_5XX
from duplex_sidecars.router.legs import LegFailure
from duplex_sidecars.router.pipeline import leg_error

from .test_bad_input import assert_openai_error
from .test_client_auth import keys_dir

USER = {"role": "user", "content": "hi"}


async def until(condition: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)


def front_of(rig):
    front = rig.server.server.api
    assert front is not None
    return front


async def test_a_client_that_never_reads_frees_its_slot_and_its_decode_leg(make_rig):
    rig = await make_rig(client_limits={"write_stall_seconds": 0.5})
    rig.d.words = tuple(["x" * 1000] * 20_000)  # a 20 MB stream
    host, port = rig.url.removeprefix("http://").split(":")
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connect: the window stays small
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, (host, int(port)))
    _, writer = await asyncio.open_connection(sock=sock)
    try:
        body = json.dumps({"model": "m", "messages": [USER], "stream": True}).encode()
        writer.write(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: r\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
        )  # and never a byte read
        front = front_of(rig)
        decode = next(iter(rig.router.engines.decode.engines.values()))
        await until(lambda: decode.inflight == 1, 5.0)
        await until(lambda: front._inflight == 0 and not front._conns and not front._tasks, 10.0)
        assert decode.inflight == 0  # the decode leg is over, its connection closed
        assert rig.metric("duplex_router_rejected_requests_total", reason="write_timeout") == 1
    finally:
        writer.transport.abort()


async def test_the_write_stall_deadline_is_a_reloadable_client_limit(make_rig):
    rig = await make_rig()
    assert rig.router.limits.write_stall_seconds == 60.0
    config = rig.router.config.model_copy(deep=True)
    config.client_limits.write_stall_seconds = 5.0
    config.client_limits.max_header_fields = 50
    await rig.router.apply(config)
    assert rig.router.limits.write_stall_seconds == 5.0 and rig.router.limits.max_header_fields == 50


async def test_a_key_in_a_chunked_trailer_does_not_authenticate(make_rig, tmp_path):
    # A gateway in front checked the head; the trailer comes after it, and must change nothing.
    rig = await make_rig(client_keys_dir=str(keys_dir(tmp_path, alice="key-a")))
    host, port = rig.url.removeprefix("http://").split(":")
    body = json.dumps({"model": "m", "messages": [USER]}).encode()
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: r\r\nContent-Type: application/json\r\n"
        b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n%x\r\n%s\r\n"
        b"0\r\nAuthorization: Bearer key-a\r\nX-Conversation-Id: c1\r\n\r\n" % (len(body), body)
    )
    raw = await asyncio.wait_for(reader.read(), 5)
    writer.close()
    head, _, payload = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 401 "), head
    assert json.loads(payload)["error"]["code"] == "invalid_api_key"
    assert rig.p.seen == [] and rig.d.seen == []


async def test_a_conversation_id_in_a_chunked_trailer_is_not_read(make_rig):
    rig = await make_rig()
    host, port = rig.url.removeprefix("http://").split(":")
    body = json.dumps({"model": "m", "messages": [USER]}).encode()
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: r\r\nContent-Type: application/json\r\n"
        b"X-Conversation-Id: from-the-head\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n%x\r\n%s\r\n"
        b"0\r\nX-Conversation-Id: from-the-trailer\r\n\r\n" % (len(body), body)
    )
    raw = await asyncio.wait_for(reader.read(), 5)
    writer.close()
    assert raw.startswith(b"HTTP/1.1 200 "), raw[:200]  # joined with the head's, the id would be a duplicate: 400
    # the turn was stored under the head's id alone: the next turn under it finds the entry
    text = json.loads(raw.partition(b"\r\n\r\n")[2])["choices"][0]["message"]["content"]
    history = [USER, {"role": "assistant", "content": text}, {"role": "user", "content": "next"}]
    status, _, _ = await rig.chat(history, conv=None, headers={"X-Conversation-Id": "from-the-head"})
    assert status == 200 and rig.metric("duplex_router_kv_reuse_hits_total") == 1


@pytest.mark.parametrize(
    "depth",
    [
        pytest.param(300, id="deeper-than-orjson-writes"),
        pytest.param(100_000, id="deeper-than-the-stdlib-parser-recurses"),
    ],
)
async def test_json_nested_too_deep_is_invalid_json(make_rig, depth):
    rig = await make_rig()
    data = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], "x": %s%s}' % (
        b"[" * depth,
        b"]" * depth,
    )
    status, body, _ = await rig.post("/v1/chat/completions", data=data, headers={"Content-Type": "application/json"})
    assert status == 400
    assert_openai_error(body, 400)
    assert body["error"]["code"] == "invalid_json"
    assert rig.p.seen == [] and rig.d.seen == []


async def test_clients_filling_the_api_connection_cap_leave_the_probes_answered(make_rig):
    # The operator points the kubelet's probes at the admin port (children/router.py): a liveness failure would
    # restart the router and drop the memory store's conversations.
    rig = await make_rig(admin_port=0, client_limits={"max_connections": 2})
    host, port = rig.url.removeprefix("http://").split(":")
    held = [await asyncio.open_connection(host, int(port)) for _ in range(2)]
    try:
        front = front_of(rig)
        await until(lambda: len(front._conns) == 2, 5.0)
        async with rig.session.get(rig.url + "/health") as resp:
            assert resp.status == 503  # the API port is full
        for path in ("/health", "/ready"):
            async with rig.session.get(rig.server.admin_url + path) as resp:
                assert resp.status == 200, path
    finally:
        for _, writer in held:
            writer.close()


@pytest.mark.parametrize(
    "failures,reason",
    [
        (
            [(STATUS_5XX, "HTTP 500", 500), (CONNECT, "Cannot connect to host 198.18.0.7:8000 ssl:default", None)],
            "unreachable",
        ),
        (
            [(BROKEN, "ClientOSError: [Errno 104] reset by peer 198.18.0.7:8000", None)],
            "connection lost or reply unreadable",
        ),
        ([(STATUS_5XX, "HTTP 401: the engine refused the router's engine key", None)], "server error"),
    ],
)
def test_a_failed_leg_tells_the_client_its_kind_never_an_engine_address(failures, reason):
    err = leg_error("decode", [LegFailure(kind, detail, status=status) for kind, detail, status in failures])
    assert "198.18" not in err.message and "engine key" not in err.message
    assert err.message == f"The decode engine failed ({reason})." and err.status == 502


async def test_without_a_known_key_a_completion_is_refused_at_its_head_in_the_routes_shape(make_rig, tmp_path):
    # Before: the body was read (up to max_body_bytes per request) and only then was the key checked (issue 23).
    rig = await make_rig(client_keys_dir=str(keys_dir(tmp_path, alice="key-a")))
    host, port = rig.url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        head_only = b"POST /v1/messages HTTP/1.1\r\nHost: r\r\nx-api-key: wrong\r\nContent-Length: 4000000\r\n\r\n"
        writer.write(head_only)
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)  # answered before a body byte is sent
        assert head.startswith(b"HTTP/1.1 401 ")
        length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
        body = json.loads(await reader.readexactly(length))
        assert body["type"] == "error" and body["error"]["type"] == "authentication_error"  # Anthropic's shape
        assert front_of(rig).held_bodies == 0
        assert rig.metric("duplex_router_rejected_requests_total", reason="unauthorized") == 1
    finally:
        writer.close()
