"""What the router writes into its fabric report at once rather than at the next heartbeat."""

from __future__ import annotations

from duplex_sidecars.router.fabric_report import news

UNMEASURED = {"healthy": True, "measured": False, "message": "no KV transfers measured yet", "canary": {"run": 1}}


def test_a_flip_a_first_measured_transfer_and_a_canary_run_are_news() -> None:
    assert news({**UNMEASURED, "healthy": False}) != news(UNMEASURED)
    assert news({**UNMEASURED, "measured": True}) != news(UNMEASURED)
    assert news({**UNMEASURED, "canary": {"run": 2}}) != news(UNMEASURED)


def test_a_new_message_alone_waits_for_the_heartbeat() -> None:
    assert news({**UNMEASURED, "message": "KV transfers at 2.1 GB/s"}) == news(UNMEASURED)
