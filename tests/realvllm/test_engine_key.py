"""Real vLLM engines started from the rendered Deployment require the engine key (VLLM_API_KEY, from the operator's
Secret in a cluster, the fixed local key here): /v1 without it is refused, /health and /metrics stay open, and the
router, which holds the key, still serves."""

from __future__ import annotations

from duplex_dev.launch.engine_key import DEV_ENGINE_AUTH

from .rig import chat, chat_body, get, post

MESSAGES = [{"role": "user", "content": "Say hello."}]
WITH_KEY = DEV_ENGINE_AUTH


def test_engines_refuse_v1_without_the_key(engines) -> None:
    for engine in (engines.prefill, engines.decode):
        assert "VLLM_API_KEY" in {c.what for c in engine.changes}  # the rendered secretKeyRef, made concrete
        for headers in ({}, {"Authorization": "Bearer not-the-key"}):
            refused = post(engine.url + "/v1/chat/completions", chat_body(MESSAGES, 2), headers)
            assert refused.status == 401, (engine.role, refused.raw[:200])
        assert post(engine.url + "/v1/chat/completions", chat_body(MESSAGES, 2), WITH_KEY).status == 200
        assert get(engine.url + "/health")[0] == 200  # probes
        assert get(engine.url + "/metrics")[0] == 200  # scrapers


def test_the_router_holds_the_key_and_serves(router) -> None:
    turn = chat(router.url, MESSAGES, conversation_id="engine-key", max_tokens=4)
    assert turn.token_ids
