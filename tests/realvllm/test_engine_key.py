"""Real vLLM engines started from the rendered Deployment require the engine key (VLLM_API_KEY, from the operator's
Secret in a cluster, the fixed local key here): /v1 without it is refused, and so is every other path but /health and
/metrics (the engine guard the operator renders), and the router, which holds the key, still serves."""

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


def test_engines_refuse_every_other_path_without_the_key(engines) -> None:
    # vLLM's own --api-key guards /v1, /v2, /inference and /cohere only: POST /invocations runs inference for anyone
    # who reaches port 8000 (a scraper's namespace may). The rendered --middleware closes it (issue 23).
    for engine in (engines.prefill, engines.decode):
        assert engine.cmd.flags["--middleware"] == "duplex_engine_guard.EngineKeyGuard"
        for path in ("/invocations", "/tokenize"):
            for headers in ({}, {"Authorization": "Bearer not-the-key"}):
                refused = post(engine.url + path, chat_body(MESSAGES, 2), headers)
                assert refused.status == 401, (engine.role, path, refused.raw[:200])
        tokenized = post(engine.url + "/tokenize", {"prompt": "hello"}, WITH_KEY)
        assert tokenized.status == 200, tokenized.raw[:200]


def test_the_router_holds_the_key_and_serves(router) -> None:
    turn = chat(router.url, MESSAGES, conversation_id="engine-key", max_tokens=4)
    assert turn.token_ids
