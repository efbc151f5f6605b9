"""The simulator names its KV revision on every answer (X-Duplex-KV-Revision), as duplex's engine guard makes vLLM's
do: from $DUPLEX_KV_REVISION, or --kv-revision; without one it names none."""

from __future__ import annotations

import pytest

from duplex_sidecars.protocol import KV_REVISION_ENV, KV_REVISION_HEADER
from duplex_sidecars.sim.cli import config_from_args, parser

from .sim_app import sim_client

CHAT = {"model": "sim", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


async def test_every_answer_names_the_revision() -> None:
    async with sim_client(kv_revision="0a1b2c3d", api_key="k") as client:
        for resp in (
            await client.get("/health"),
            await client.get("/metrics"),
            await client.post("/v1/chat/completions", json=CHAT, headers={"Authorization": "Bearer k"}),
            await client.post("/v1/chat/completions", json=CHAT),  # refused: 401
            await client.get("/nowhere"),  # 404
        ):
            assert resp.headers.get(KV_REVISION_HEADER) == "0a1b2c3d", resp.url


async def test_without_a_revision_no_header() -> None:
    async with sim_client() as client:
        assert KV_REVISION_HEADER not in (await client.get("/health")).headers


def test_the_revision_comes_from_the_operators_variable_or_the_flag(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(KV_REVISION_ENV, "0a1b2c3d")
    assert config_from_args(parser().parse_args(["--role", "decode"])).kv_revision == "0a1b2c3d"
    args = ["--role", "decode", "--kv-revision", "ffff0000"]
    assert config_from_args(parser().parse_args(args)).kv_revision == "ffff0000"
    monkeypatch.delenv(KV_REVISION_ENV)
    assert config_from_args(parser().parse_args(["--role", "decode"])).kv_revision is None
