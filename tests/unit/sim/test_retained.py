"""Retained blocks are single use: claim, read, release; expired or released entries are gone."""

import pytest

from duplex_sidecars.sim.retained import ClaimRefused, RetainedBlocks


def _reg():
    reg = RetainedBlocks()
    reg.retain("r1", [3, 4, 5], num_tokens=40, deadline=100.0)
    return reg


def test_claim_then_release_frees_once():
    reg = _reg()
    assert reg.claim("r1", [4, 5], now=1.0).num_tokens == 40
    with pytest.raises(ClaimRefused, match="claimed"):
        reg.claim("r1", [4], now=1.0)
    assert reg.release("r1") == [3, 4, 5]
    assert reg.release("r1") == []
    with pytest.raises(ClaimRefused, match="blocks_gone"):
        reg.claim("r1", [4], now=1.0)


def test_claims_are_limited_to_the_retained_blocks():
    with pytest.raises(ClaimRefused, match="block_mismatch"):
        _reg().claim("r1", [5, 6], now=1.0)


def test_expired_entries_cannot_be_claimed_and_are_reaped():
    reg = _reg()
    with pytest.raises(ClaimRefused, match="blocks_gone"):
        reg.claim("r1", [3], now=100.0)
    assert reg.expired(now=99.0) == [] and reg.expired(now=100.0) == ["r1"]
    assert reg.num_blocks == 3


def test_a_read_note_releases_only_its_readers_claim():
    reg = _reg()
    assert reg.release("r1", reader="agent-a") == []  # not claimed yet: a stray note frees nothing
    reg.claim("r1", [3], now=1.0, reader="agent-a")
    assert reg.is_claimed("r1") and reg.num_claimed == 1
    assert reg.release("r1", reader="agent-b") == []
    assert reg.release("r1", reader="agent-a") == [3, 4, 5]
    assert reg.num_claimed == 0 and not reg.is_claimed("r1")
    reg.retain("r2", [7], num_tokens=16, deadline=100.0)
    reg.claim("r2", [7], now=1.0)
    assert reg.release("r2") == [7] and reg.num_claimed == 0  # released unconditionally (failed READ, expiry)


def test_retained_block_count_follows_retain_release_and_expiry():
    reg = _reg()
    reg.retain("r2", [7, 8], num_tokens=20, deadline=5.0)
    assert reg.num_blocks == 5
    reg.claim("r2", [7], now=1.0)
    assert reg.release("r2", reader="someone-else") == [] and reg.num_blocks == 5
    assert reg.release("r2") == [7, 8] and reg.num_blocks == 3
    reg.retain("r3", [9], num_tokens=10, deadline=5.0)
    for rid in reg.expired(now=50.0):
        reg.release(rid)
    assert reg.num_blocks == 3 and len(reg) == 1
    reg.release("r1")
    assert reg.num_blocks == 0 and reg.num_claimed == 0
