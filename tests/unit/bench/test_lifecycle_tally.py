"""The lifecycle benchmark counts each event from the receipts its clients got: follow-ups reused or recomputed, the
miss reasons, bindings lost and the most recomputes one conversation had (the target for a KV-incompatible change is
one)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))

from lifecycle_bench import Turn, tally


def turn(conversation: str, kv: str, first: bool = False, ok: bool = True) -> Turn:
    return Turn(0.0, 1.0, ok, first, conversation, kv=kv)


def test_an_event_window_is_told_by_its_receipts():
    turns = [
        turn("a", "miss:no_entry", first=True),  # a first turn is no follow-up
        turn("a", "hit:300"),
        turn("a", "miss:revision_changed"),
        turn("b", "miss:endpoint_gone"),
        turn("b", "miss:revision_changed"),
        turn("b", "hit:512"),
        turn("c", "", ok=False),  # a failed turn is counted by the caller, not here
    ]
    assert tally(turns) == {
        "follow_ups": 5,
        "reused": 2,
        "recomputed": 3,
        "bindings_lost": 1,
        "miss_reasons": {"endpoint_gone": 1, "revision_changed": 2},
        "most_recomputes_in_a_conversation": 2,
    }
    assert tally([])["most_recomputes_in_a_conversation"] == 0
