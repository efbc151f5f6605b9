"""The engine key end to end on real processes: simulated engines started with VLLM_API_KEY (as the rendered
engines get it from the Secret) refuse /v1 without it, and a `duplex router` started by the dev launcher, which
holds the same key, serves two turns through them, decode's blocks read back over NIXL."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

import pytest

from duplex_dev.launch.engine_key import DEV_ENGINE_KEY, ROUTER_ENV
from duplex_dev.launch.router import RouterProcess
from duplex_dev.launch.sim import sim_pair

pytestmark = [pytest.mark.nixl, pytest.mark.timeout(180)]


def post(url: str, body: dict[str, Any], headers: dict[str, str] | None = None) -> tuple[int, Any]:
    req = urllib.request.Request(
        url, json.dumps(body).encode(), {"content-type": "application/json", **(headers or {})}
    )
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"null")


def chat(messages: list[dict[str, str]]) -> dict[str, Any]:
    return {"model": "sim", "messages": messages, "max_tokens": 8, "conversation_id": "engine-key"}


def test_keyed_engines_refuse_strangers_and_serve_the_router() -> None:
    key_env = {"VLLM_API_KEY": DEV_ENGINE_KEY}
    with sim_pair(("--no-enable-prefix-caching",), env=key_env) as (prefill, decode):  # reuse shows as reads
        for engine in (prefill, decode):
            assert post(engine.url + "/v1/chat/completions", chat([{"role": "user", "content": "hi"}])) == (
                401,
                {"error": "Unauthorized"},
            )
        with RouterProcess(prefill=[prefill.url], decode=[decode.url]) as router:
            assert router.env[ROUTER_ENV] == DEV_ENGINE_KEY
            messages = [{"role": "user", "content": "Summarise the report in detail, please. " * 8}]
            status, first = post(router.url + "/v1/chat/completions", chat(messages))
            assert status == 200, first
            messages += [first["choices"][0]["message"], {"role": "user", "content": "And the second part?"}]
            status, second = post(router.url + "/v1/chat/completions", chat(messages))
            assert status == 200, second
            # turn 2 went to prefill with decode's blocks to read back: the router's key passed prefill's guard
            assert prefill.metric("vllm:prompt_tokens_by_source_total", source="external_kv_transfer") > 0
        # a router without the key is refused by the same engines
        with RouterProcess(prefill=[prefill.url], decode=[decode.url], engine_key=None) as stranger:
            status, body = post(stranger.url + "/v1/chat/completions", chat([{"role": "user", "content": "hi"}]))
            # the engines refused its legs: the deployment's fault, so a 502, never the client's 401; the client
            # reads the leg's kind, the router's log says why (never an engine's address or key to a client)
            assert status == 502, (status, body)
            assert body["error"]["message"] == "The prefill engine failed (server error)."
            assert "refused the router's engine key" in stranger.log_tail(200)
