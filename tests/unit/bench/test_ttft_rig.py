"""The TTFT rig's direct calls to engines: the oracle's warm-up goes around the router, so it must carry the engine
key itself (a real engine answers 401 without it, which once stopped `make bench-ttft` at turn 2)."""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))

import ttft_rig as rig

from duplex_dev.launch.engine_key import DEV_ENGINE_KEY


class KeyedEngine(BaseHTTPRequestHandler):
    """Refuses /v1 without the dev engine key, as vLLM's --api-key does; records what it accepted."""

    seen: list[dict[str, Any]]

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        if self.headers.get("authorization") != f"Bearer {DEV_ENGINE_KEY}":
            self._answer(401, {"error": "Unauthorized"})
            return
        self.seen.append(body)
        self._answer(200, {"choices": []})

    def _answer(self, status: int, out: dict[str, Any]) -> None:
        data = json.dumps(out).encode()
        self.send_response(status)
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def engines() -> Iterator[list[SimpleNamespace]]:
    servers = []
    for _ in range(2):
        handler = type("Handler", (KeyedEngine,), {"seen": []})
        server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
    yield [SimpleNamespace(url=f"http://127.0.0.1:{s.server_port}", seen=s.RequestHandlerClass.seen) for s in servers]
    for s in servers:
        s.shutdown()
        s.server_close()


def test_warm_up_carries_the_engine_key_to_every_prefill(engines):
    prefix = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    rig.warm(engines, {"model": "Qwen", "messages": [], "max_tokens": 64, "cache_salt": "s"}, prefix)  # type: ignore[arg-type]
    for e in engines:
        (sent,) = e.seen
        assert sent["messages"] == prefix
        assert (sent["max_tokens"], sent["add_generation_prompt"], sent["cache_salt"]) == (1, False, "s")


def test_an_engine_call_without_the_key_is_refused(engines):
    with pytest.raises(rig.TurnError, match="HTTP 401"):
        rig.post(engines[0].url + "/v1/chat/completions", {"messages": []})
    assert engines[0].seen == []


def test_no_prefix_no_warm_up(engines):
    rig.warm(engines, {"model": "Qwen"}, [])  # type: ignore[arg-type]
    assert all(e.seen == [] for e in engines)
