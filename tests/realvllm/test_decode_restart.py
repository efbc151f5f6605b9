"""A decode engine killed and restarted under the router: while it is down the router answers errors at once and
stays up; afterwards an entry pointing at the dead engine's blocks never produces a wrong answer (prefill's read
fails and it recomputes), and the turn after that is correct too (reusing the new engine's blocks, or falling back)."""

from __future__ import annotations

import uuid

import pytest

from duplex_dev import processes
from duplex_dev.launch.router import RouterProcess

from .rig import (
    LONG,
    RESTART_SECONDS,
    STUCK_TURN_SECONDS,
    Counters,
    assert_same_answer,
    chat,
    chat_body,
    get,
    post,
    wait_ready_engines,
)


def decode_retries(router: RouterProcess) -> float:
    scraped = processes.scrape(router.url + "/metrics", timeout=60)
    return processes.metric_sum(scraped, "duplex_router_retries_total", leg="decode")


# The turn after the restart: the replay abandoned (rig.REPLAY_SECONDS), then a recompute, then the new decode
# engine's first read of prefill's blocks. With prefill stepping its stuck read on both cores, that first decode
# request took over 2 minutes in a local run ("No available shared memory broadcast block found in 60 seconds").
AFTER_RESTART_SECONDS = 600
PAIR_START_SECONDS = 600  # the test's own pair: start, warm-up and its router


@pytest.mark.timeout(PAIR_START_SECONDS + RESTART_SECONDS + AFTER_RESTART_SECONDS + 600)
def test_decode_killed_and_restarted(own_engines, own_stale_router):
    """Through a router that believes decode keeps blocks longer than any restart takes: the entry of the dead engine
    is replayed. On its own pair, which has the machine to itself: the replay leaves prefill stepping a read vLLM 0.32
    never finishes, and that pair stops with the test."""
    engines, router = own_engines, own_stale_router
    conv = f"restart-{uuid.uuid4().hex}"
    messages = [{"role": "user", "content": LONG}]
    messages.append({"role": "assistant", "content": chat(router.url, messages, conv).text})
    messages.append({"role": "user", "content": "Now the conclusion, please."})

    engines.decode.kill()
    retries = decode_retries(router)
    down = post(router.url + "/v1/chat/completions", chat_body(messages, conversation_id=f"down-{conv}"), timeout=180)
    assert down.status in (502, 503), down.raw
    assert set(down.body["error"]) >= {"message", "type"}
    # At once: one prefill leg (its time is the machine's: over 20 s in CI), then the refused decode is the answer. A
    # retry would have cost a second prefill for the same refusing engine (seen in CI before the router stopped it).
    assert decode_retries(router) == retries
    assert get(router.url + "/health")[0] == 200

    engines.decode.start().wait_ready(timeout=RESTART_SECONDS)
    wait_ready_engines(router)
    before = Counters.read(engines.prefill, router)
    try:
        result = chat(router.url, messages, conv, timeout=AFTER_RESTART_SECONDS)
    finally:
        delta = Counters.read(engines.prefill, router) - before
        print(f"\nturn after the decode restart: {delta}")
        # Prefill tries the read and it fails, or, when the restart took longer than the blocks' expiry that the
        # dead engine put in its kv_transfer_params (rig.DECODE_TTL), it declines to read (CI: a 5-minute restart).
        assert delta.failed + delta.declined == 1, "prefill neither failed nor declined its read of the dead engine"
        assert get(router.url + "/health")[0] == 200  # the router keeps serving
    # The router still held the entry of the engine that died and replayed it; vLLM 0.32 leaves the failed (or
    # declined) read waiting, so the router abandoned it (rig.REPLAY_SECONDS) and prefill recomputed.
    assert delta.misses.get("prefill_retry") == 1 and delta.hits == 0
    assert delta.external == 0, "prefill claims it read blocks that died with the engine"
    assert_same_answer(result, chat(engines.prefill.url, messages))

    messages += [{"role": "assistant", "content": result.text}, {"role": "user", "content": "Thanks, and then?"}]
    before = Counters.read(engines.prefill, router)
    again = chat(router.url, messages, conv, timeout=STUCK_TURN_SECONDS)
    delta = Counters.read(engines.prefill, router) - before
    print(f"turn after that: {delta}")
    # Either prefill reads the new engine's blocks (every run with the expiry test before this one), or, when the
    # restart comes first in the session (the order now, which keeps the restart fast), its read of the new engine
    # failed too in the one run seen (cause not isolated: vLLM 0.32's handling of a peer that came back on the same
    # side-channel address) and the router fell back again. Both answer correctly; never both, never none.
    if delta.hits == 1:
        assert delta.external == delta.reused > 0 and delta.failed == 0
    else:
        assert delta.misses == {"prefill_retry": 1} and delta.external == 0
    assert_same_answer(again, chat(engines.prefill.url, messages))
