"""The router's canary (router/canary.py, the operator's DisaggregationVerified) against real vLLM engines: two turns
it sends itself, and what vLLM's own counters say they did: prefill computed turn 1, decode read prefill's blocks,
prefill read decode's blocks back on turn 2."""

from __future__ import annotations

import json
import time

from duplex_dev import processes

from .rig import EXTERNAL, get

CANARY_SECONDS = 600  # two turns on 2 loaded cores, and the model lookup before them


def test_the_canary_verifies_both_directions(engines, canary_router):
    before = {e.role: e.metrics() for e in (engines.prefill, engines.decode)}
    deadline = time.monotonic() + CANARY_SECONDS
    verdict = None
    while verdict is None:
        assert time.monotonic() < deadline, f"no canary result in {CANARY_SECONDS} s:\n{canary_router.log_tail()}"
        time.sleep(2.0)
        status, body = get(canary_router.url + "/ready")
        verdict = json.loads(body).get("canary") if status in (200, 503) and body else None
    print(f"\ncanary: {verdict}")
    assert verdict["ok"] and verdict["step"] == "done", verdict
    assert (verdict["prefill"], verdict["decode"]) == (engines.prefill.url, engines.decode.url)
    assert [t["replayed"] for t in verdict["turns"]] == [False, True]

    def moved(engine, **labels):
        now = processes.metric_sum(engine.metrics(), EXTERNAL, **labels)
        return now - processes.metric_sum(before[engine.role], EXTERNAL, **labels)

    # Nothing else ran meanwhile: vLLM's counters moved by exactly what the canary reports.
    assert moved(engines.prefill, source="external_kv_transfer") == verdict["d_to_p_tokens"] > 0
    assert moved(engines.decode, source="external_kv_transfer") > 0  # turn 1 and turn 2 read prefill's blocks
    assert verdict["p_to_d_bytes"] > 0 and verdict["d_to_p_bytes"] > 0
