"""The attempt rules as a table: what happened so far -> whether (and how) the leg is tried again."""

from __future__ import annotations

import pytest

from duplex_sidecars.router.attempts import (
    BROKEN,
    CONNECT,
    KINDS,
    STATUS_4XX,
    STATUS_5XX,
    TIMEOUT,
    PrefillAttempt,
    first_prefill,
    may_resend_stale,
    may_retry_decode,
    next_prefill,
)


def run_prefill(replay_offered: bool, failures: list[str], retries: int) -> list[tuple[int, bool]]:
    """The prefill attempts made when each attempt fails with the next kind in `failures` (until they run out)."""
    made = []
    current: PrefillAttempt | None = first_prefill(0, replay_offered)
    replay_failed = False
    kinds = iter(failures)
    while current is not None:
        made.append((current.number, current.replay))
        kind = next(kinds, None)
        if kind is None:
            break  # this attempt succeeded
        replay_failed = replay_failed or current.replay
        current = next_prefill(current, kind, replay_failed, retries)
    return made


@pytest.mark.parametrize(
    "replay, failures, retries, attempts",
    [
        # success first time: one attempt, replaying only when a replay was offered
        (True, [], 1, [(0, True)]),
        (False, [], 1, [(0, False)]),
        # a failed replay is owed one recompute whatever the failure, even with no retries configured
        (True, [CONNECT], 0, [(0, True), (1, False)]),
        (True, [STATUS_4XX], 0, [(0, True), (1, False)]),
        (True, [TIMEOUT], 0, [(0, True), (1, False)]),
        (True, [BROKEN, BROKEN], 0, [(0, True), (1, False)]),
        # ... and with retries, the recompute is the first of them; later ones never replay
        (True, [STATUS_5XX, STATUS_5XX, STATUS_5XX], 2, [(0, True), (1, False), (2, False)]),
        (True, [STATUS_5XX, STATUS_5XX, STATUS_5XX, STATUS_5XX], 3, [(0, True), (1, False), (2, False), (3, False)]),
        # without a replay: retries as configured, never after a 4xx or a timeout
        (False, [CONNECT], 0, [(0, False)]),
        (False, [CONNECT, CONNECT], 1, [(0, False), (1, False)]),
        (False, [BROKEN, STATUS_5XX, CONNECT], 2, [(0, False), (1, False), (2, False)]),
        (False, [STATUS_4XX], 3, [(0, False)]),
        (False, [TIMEOUT], 3, [(0, False)]),
        # after the owed recompute, a 4xx or a timeout ends the leg
        (True, [CONNECT, STATUS_4XX], 3, [(0, True), (1, False)]),
        (True, [CONNECT, TIMEOUT], 3, [(0, True), (1, False)]),
    ],
)
def test_prefill_attempts(replay, failures, retries, attempts):
    assert run_prefill(replay, failures, retries) == attempts


@pytest.mark.parametrize("decode_attempt, offered, replays", [(0, True, True), (0, False, False), (1, True, False)])
def test_only_the_requests_first_prefill_replays(decode_attempt, offered, replays):
    # A decode retry needs a fresh prefill: prefill's blocks served one decode read, and decode's blocks were read.
    assert first_prefill(decode_attempt, offered) == PrefillAttempt(0, replays)


@pytest.mark.parametrize(
    "attempt, kind, started, retries, retry",
    [
        (0, CONNECT, False, 1, True),
        (0, STATUS_5XX, False, 1, True),
        (0, TIMEOUT, False, 1, True),  # the first byte did not come in time: another engine may answer
        (0, BROKEN, False, 1, True),
        (1, BROKEN, False, 1, False),  # retries used up
        (0, BROKEN, False, 0, False),
        (0, STATUS_4XX, False, 3, False),  # the engine refused the request: the client gets its answer
        (0, BROKEN, True, 3, False),  # the client has bytes already: nothing may be sent twice
    ],
)
def test_decode_retries(attempt, kind, started, retries, retry):
    assert may_retry_decode(attempt, kind, started, retries) is retry


def test_every_kind_has_a_rule():
    for kind in KINDS:
        assert next_prefill(PrefillAttempt(0, True), kind, True, 0) == PrefillAttempt(1, False)
        assert isinstance(may_retry_decode(0, kind, False, 1), bool)


def test_a_prefill_with_decodes_blocks_is_never_resent():
    assert may_resend_stale(replay=True) is False
    assert may_resend_stale(replay=False) is True
