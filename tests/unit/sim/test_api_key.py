"""The simulator guards its API like vLLM's --api-key (VLLM_API_KEY): /v1/* needs the Bearer token, 401 otherwise;
/health and /metrics stay open to probes and scrapers."""

from __future__ import annotations

import pytest

from duplex_sidecars.sim.cli import config_from_args, parser

from .sim_app import sim_client

CHAT = {"model": "sim", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


async def test_v1_needs_the_key_health_and_metrics_do_not() -> None:
    async with sim_client(api_key="k-123") as client:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "k-123"}):
            resp = await client.post("/v1/chat/completions", json=CHAT, headers=headers)
            assert resp.status == 401, headers
            assert await resp.json() == {"error": "Unauthorized"}
        assert (await client.get("/v1/models")).status == 401
        assert (await client.post("/v1/messages", json={})).status == 401
        ok = await client.post("/v1/chat/completions", json=CHAT, headers={"Authorization": "Bearer k-123"})
        assert ok.status == 200
        assert (await client.get("/health")).status == 200
        assert (await client.get("/metrics")).status == 200


async def test_without_a_key_everything_is_open() -> None:
    async with sim_client() as client:
        assert (await client.post("/v1/chat/completions", json=CHAT)).status == 200


def test_the_key_comes_from_vllms_variable_or_the_flag(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VLLM_API_KEY", "from-env")
    assert config_from_args(parser().parse_args(["--role", "prefill"])).api_key == "from-env"
    assert config_from_args(parser().parse_args(["--role", "prefill", "--api-key", "flag"])).api_key == "flag"
    monkeypatch.delenv("VLLM_API_KEY")
    assert config_from_args(parser().parse_args(["--role", "prefill"])).api_key is None


async def test_with_the_engine_guard_every_path_but_health_and_metrics_needs_the_key() -> None:
    # As vLLM behind duplex's engine guard (`--middleware duplex_engine_guard.EngineKeyGuard`).
    async with sim_client(api_key="k-123", key_on_every_path=True) as client:
        for path in ("/version", "/invocations", "/tokenize"):
            assert (await client.post(path, json={})).status == 401, path
        assert (await client.get("/version", headers={"Authorization": "Bearer k-123"})).status == 200
        assert (await client.get("/health")).status == 200
        assert (await client.get("/metrics")).status == 200
    async with sim_client(api_key="k-123") as client:  # vLLM's own guard: /v1 only
        assert (await client.get("/version")).status == 200
