"""When a failed leg is tried again, as pure functions of what has happened so far (the table in
tests/unit/router/test_attempts.py is their specification).

The rules:
* Only the first prefill attempt of a request carries decode's retained blocks; every later one recomputes.
* A prefill that carried the blocks and failed is owed one recompute, whatever the failure (the blocks may be the
  cause: declined, expired, gone), even with `prefill_retries` at 0.
* Otherwise a prefill is retried on another engine up to `prefill_retries` times, unless the engine rejected the
  request (4xx: the client's fault, passed through) or timed out (the leg's whole budget is spent).
* A decode leg is retried up to `decode_retries` times, only before the client has seen a byte and never after a
  4xx. Each decode attempt needs a fresh prefill: prefill's blocks serve one decode read.
* A request is never resent on the same leg without one of these rules saying so: a resend after a stale keep-alive
  connection is itself such a decision (`may_resend_stale`), and a prefill that carries decode's blocks is never
  resent (the engine may have begun the read).
"""

from __future__ import annotations

from dataclasses import dataclass

CONNECT = "connect"  # nothing reached the engine
TIMEOUT = "timeout"
STATUS_5XX = "status_5xx"
STATUS_4XX = "status_4xx"  # the client's fault as the engine sees it: passed through, never retried
BROKEN = "broken_stream"  # connection dropped or the response is unreadable
KINDS = (CONNECT, TIMEOUT, STATUS_5XX, STATUS_4XX, BROKEN)


@dataclass(frozen=True)
class PrefillAttempt:
    number: int  # 0 for the first prefill of this decode attempt
    replay: bool  # carries decode's retained blocks


def first_prefill(decode_attempt: int, replay_offered: bool) -> PrefillAttempt:
    """The first prefill of a decode attempt: it replays only on the request's very first try."""
    return PrefillAttempt(0, replay_offered and decode_attempt == 0)


def next_prefill(failed: PrefillAttempt, kind: str, replay_failed: bool, retries: int) -> PrefillAttempt | None:
    """The prefill attempt after `failed` failed with `kind`, or None when the leg gives up. `replay_failed` tells
    whether this request's replaying attempt has failed (then one recompute is owed)."""
    if failed.replay:
        return PrefillAttempt(failed.number + 1, False)  # the owed recompute
    if kind in (STATUS_4XX, TIMEOUT):
        return None
    allowed = max(retries, 1) if replay_failed else retries
    if failed.number < allowed:
        return PrefillAttempt(failed.number + 1, False)
    return None


def may_retry_decode(attempt: int, kind: str, client_started: bool, retries: int) -> bool:
    """Whether decode attempt `attempt` (0-based), failed with `kind`, gets another try (with a fresh prefill)."""
    return not client_started and kind != STATUS_4XX and attempt < retries


def may_resend_stale(replay: bool) -> bool:
    """Whether a request whose pooled keep-alive connection turned out closed may go out again on a fresh one: the
    engine answered nothing, but it may have read the request, so a prefill carrying decode's blocks must not."""
    return not replay
