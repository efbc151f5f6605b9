"""Block contents are a function of the exact token prefix; the pool's prefix cache behaves like vLLM's."""

import numpy as np
import pytest

from duplex_sidecars.sim.kv_blocks import BlockPool, OutOfBlocks, block_hashes, num_blocks_for, slot_bytes, token_chain

BS = 4


def test_chain_rows_identify_prefixes():
    a = token_chain([1, 2, 3, 4, 5])
    assert np.array_equal(token_chain([1, 2, 3]), a[:3])  # a prefix has the same rows
    assert not np.array_equal(token_chain([1, 2, 9, 4, 5])[3:], a[3:])  # a changed token changes every later row
    assert not np.array_equal(token_chain([1, 2, 3], model="other"), a[:3])
    # Continuing a chain from its last row equals hashing the whole sequence.
    assert np.array_equal(token_chain([4, 5], prev=a[2].tobytes()), a[3:])


def test_block_hashes_cover_full_blocks_only():
    chain = token_chain(list(range(10)))
    assert block_hashes(chain, BS) == [chain[3].tobytes(), chain[7].tobytes()]
    assert num_blocks_for(10, BS) == 3 and num_blocks_for(8, BS) == 2


def test_a_cache_salt_keeps_a_prompts_blocks_apart():
    # vLLM: cache_salt enters the first block's hash, so every key of a salted prompt differs.
    chain = token_chain(list(range(12)))
    plain, salted = block_hashes(chain, BS), block_hashes(chain, BS, "tenant-a")
    assert block_hashes(chain, BS, "tenant-a") == salted  # the same salt finds the same blocks
    assert not set(salted) & set(plain) and not set(salted) & set(block_hashes(chain, BS, "tenant-b"))
    pool = BlockPool(8, BS, 64)
    ids = pool.allocate(3)
    pool.cache(ids, salted)
    pool.free(ids)
    assert pool.match_prefix(plain) == []
    assert pool.match_prefix(salted) == ids


def test_slot_bytes_tile_the_digest_to_any_slot_size():
    chain = token_chain([1, 2])
    out = slot_bytes(chain, 40)
    assert out.shape == (2, 40)
    assert np.array_equal(out[0, :16], chain[0]) and np.array_equal(out[0, 32:40], chain[0, :8])


def _pool(num_blocks=8, block_bytes=64):
    return BlockPool(num_blocks, BS, block_bytes)


def test_written_blocks_verify_and_others_do_not():
    pool = _pool()
    tokens = list(range(100, 110))
    chain = token_chain(tokens)
    ids = pool.allocate(3)
    pool.write(ids, chain, 0, len(tokens))
    assert pool.verify(ids, chain, 0, 10).ok
    assert pool.verify(ids, chain, 5, 10).ok  # a pull may start or end inside blocks
    other = token_chain(tokens[:6] + [999] + tokens[7:])
    assert pool.verify(ids, other, 0, 10).bad_positions == [1, 2]
    # Only the slots of the requested tokens count: token 6 lives in block 1, outside [0, 4).
    assert pool.verify(ids, other, 0, 4).ok


def test_partial_writes_fill_only_their_slots():
    pool = _pool()
    chain = token_chain(list(range(6)))
    ids = pool.allocate(2)
    pool.write(ids, chain, 0, 5)
    assert pool.verify(ids, chain, 0, 5).ok and not pool.verify(ids, chain, 0, 6).ok
    pool.write(ids, chain, 5, 6)
    assert pool.verify(ids, chain, 0, 6).ok


def test_prefix_cache_hits_longest_cached_prefix():
    pool = _pool()
    chain = token_chain(list(range(12)))
    ids = pool.allocate(3)
    pool.cache(ids, block_hashes(chain, BS))
    hashes = block_hashes(token_chain(list(range(8)) + [77, 78, 79, 80]), BS)
    assert pool.match_prefix(hashes) == ids[:2]


def test_freed_blocks_stay_cached_until_their_memory_is_reused():
    pool = _pool(num_blocks=4)
    chain = token_chain(list(range(8)))
    hashes = block_hashes(chain, BS)
    ids = pool.allocate(2)
    pool.cache(ids, hashes)
    pool.free(ids)
    assert pool.num_free == 4
    hits = pool.match_prefix(hashes)
    assert hits == ids and pool.num_free == 2
    pool.free(hits)
    pool.allocate(4)  # evicts everything, least recently freed first
    assert pool.match_prefix(hashes) == []


def test_eviction_prefers_never_cached_blocks_then_lru():
    pool = _pool(num_blocks=4)
    chain = token_chain(list(range(4)))
    [cached] = pool.allocate(1)
    pool.cache([cached], block_hashes(chain, BS))
    pool.free([cached])
    assert cached not in pool.allocate(3)  # the three never-used blocks come first
    assert pool.match_prefix(block_hashes(chain, BS)) == [cached]


def test_referenced_blocks_are_not_evicted_and_exhaustion_raises():
    pool = _pool(num_blocks=2)
    pool.allocate(2)
    with pytest.raises(OutOfBlocks):
        pool.allocate(1)


def test_block_bytes_must_hold_whole_slots():
    with pytest.raises(ValueError):
        BlockPool(4, 16, 100)


def _chain_by_definition(tokens, model="sim"):
    """The chain computed straight from its definition, one blake2b per token, nothing remembered."""
    import hashlib

    prev = hashlib.blake2b(model.encode(), digest_size=16, person=b"duplex-sim-kv").digest()
    rows = []
    for tok in tokens:
        prev = hashlib.blake2b(prev + tok.to_bytes(4, "little"), digest_size=16).digest()
        rows.append(np.frombuffer(prev, dtype=np.uint8))
    return np.array(rows, dtype=np.uint8).reshape(len(tokens), 16)


@pytest.mark.parametrize("n", [0, 1, 15, 16, 17, 33, 100])
def test_remembered_chain_runs_equal_the_definition(n):
    tokens = [(i * 7919) % 50_000 + 256 for i in range(n)]
    first, again = token_chain(tokens), token_chain(tokens)  # the second call is served from remembered runs
    assert np.array_equal(first, _chain_by_definition(tokens)) and np.array_equal(again, first)
    # A sequence that shares the first run but differs in the second must not pick up the remembered second run.
    changed = tokens[:20] + [1] + tokens[21:]
    assert np.array_equal(token_chain(changed), _chain_by_definition(changed))
    # Nor one that differs only before it: a run's rows depend on everything before the run.
    other_start = [1] * 16 + tokens[16:]
    assert np.array_equal(token_chain(other_start), _chain_by_definition(other_start))
    # Continuing from a remembered row still equals the whole chain; the rows are writable, as before.
    if n > 17:
        assert np.array_equal(token_chain(tokens[17:], prev=first[16].tobytes()), first[17:])
    first[:] = 0
    assert np.array_equal(token_chain(tokens), _chain_by_definition(tokens))


def test_remembered_runs_are_bounded(monkeypatch):
    from duplex_sidecars.sim import kv_blocks

    monkeypatch.setattr(kv_blocks, "_MEMO_RUNS", 8)
    kv_blocks._memo.clear()
    for start in range(0, 40 * 16, 16):
        token_chain(list(range(start, start + 16)), model="bounded")
    assert len(kv_blocks._memo) == 8
    tokens = list(range(3000, 3000 + 16 * 20))
    assert np.array_equal(token_chain(tokens, model="bounded"), _chain_by_definition(tokens, "bounded"))
    assert len(kv_blocks._memo) == 8
