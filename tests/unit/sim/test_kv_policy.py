"""The pull scheduler's decisions: what to pull, when to recompute, when to decline an expired read."""

import pytest

from duplex_sidecars.protocol import miss_params
from duplex_sidecars.sim import kv_policy as kp

REPLAY = {
    "do_remote_decode": True,
    "do_remote_prefill": False,
    "remote_block_ids": [[4, 5, 6]],
    "remote_engine_id": "decode-1",
    "remote_request_id": "chatcmpl-1",
    "remote_host": "10.0.0.7",
    "remote_port": 5600,
    "remote_num_tokens": 40,
}


def test_node_identity_follows_do_remote_decode():
    assert kp.is_prefill_request(miss_params())
    assert not kp.is_prefill_request({"do_remote_prefill": True})
    assert not kp.is_prefill_request(None)


def test_remote_blocks_need_ids_and_every_address_field():
    assert kp.has_remote_blocks(REPLAY)
    assert not kp.has_remote_blocks(miss_params())
    for key in ("remote_engine_id", "remote_request_id", "remote_host", "remote_port"):
        assert not kp.has_remote_blocks({**REPLAY, key: None})
    assert not kp.has_remote_blocks({**REPLAY, "remote_block_ids": [[]]})


def test_flat_block_ids_accepts_both_shapes():
    assert kp.flat_block_ids([[1, 2]]) == [1, 2] == kp.flat_block_ids([1, 2])
    with pytest.raises(ValueError):
        kp.flat_block_ids([[1, "x"]])


@pytest.mark.parametrize(
    ("remote", "prompt", "hits", "count"),
    [(40, 100, 0, 40), (140, 100, 0, 100), (140, 100, 32, 68), (40, 100, 48, -8), (None, 100, 16, 84)],
)
def test_count_is_capped_remote_minus_local_hits(remote, prompt, hits, count):
    assert kp.remote_token_count(remote, prompt, hits) == count


@pytest.mark.parametrize(
    ("count", "threshold", "recompute"),
    [(1, 64, True), (63, 64, True), (64, 64, False), (500, 64, False), (0, 64, False), (-3, 64, False), (5, 0, False)],
)
def test_threshold(count, threshold, recompute):
    assert kp.below_recompute_threshold(count, threshold) is recompute


@pytest.mark.parametrize(
    ("expiry", "offset", "now", "expired"),
    [
        (100.0, 0.0, 90.0, False),  # 10 s left
        (100.0, 0.0, 95.0, True),  # exactly the 5 s margin
        (100.0, 0.0, 96.0, True),
        (1100.0, 1000.0, 90.0, False),  # decode's clock runs 1000 s ahead of ours
        (1100.0, 1000.0, 97.0, True),
        (None, 0.0, 1e9, False),  # no deadline forwarded: read as usual
        ("soon", 0.0, 1e9, False),
    ],
)
def test_expiry(expiry, offset, now, expired):
    assert kp.is_expired(expiry, offset, now) is expired


def test_pull_plan_starts_on_a_block_and_may_end_inside_one():
    plan = kp.pull_plan(local_hits=32, count=20, block_size=16)
    assert (plan.start, plan.end, plan.num_tokens) == (32, 52, 20)
    assert list(plan.positions) == [2, 3]
    assert list(kp.pull_plan(0, 16, 16).positions) == [0]
