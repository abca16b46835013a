"""Block manager as pure logic: allocation, reference counts, prefix hits, LRU eviction,
preemption plans, blocks freed out of a sliding window."""

from __future__ import annotations

import copy

import pytest

from worker.engine import block_manager as bm_module
from worker.engine.block_manager import NULL_BLOCK, BlockManager
from worker.engine.params import SamplingParams
from worker.engine.sequence import Sequence

BS = 4


def _seq(tokens: list[int], name: str = "s") -> Sequence:
    return Sequence(name, tokens, SamplingParams(max_tokens=4))


def _admit(bm: BlockManager, seq: Sequence) -> list[int]:
    """Admit ``seq`` with its whole prompt; return the prefix hits used."""
    hits = bm.get_computed_blocks(seq)
    num_new = seq.num_tokens - len(hits) * BS
    assert bm.can_allocate(seq, hits, num_new)
    bm.allocate(seq, hits, num_new)
    seq.num_computed_tokens += num_new  # what the scheduler's update does after the step
    return hits


def test_allocation_counts_blocks_and_frees_them() -> None:
    bm = BlockManager(num_blocks=8, block_size=BS, enable_prefix_caching=False)
    a = _seq(list(range(10)), "a")  # 10 tokens: 3 blocks
    _admit(bm, a)
    assert len(a.block_table) == 3 and bm.num_free_blocks == 5
    assert bm.usage == pytest.approx(3 / 8)

    # decoding: the 11th and 12th tokens fit in block 3; the 13th needs a 4th block
    for token in (10, 11, 12):
        a.token_ids.append(token)
        assert bm.can_append(a, 1)
        bm.append_slots(a, 1)
        a.num_computed_tokens += 1
    assert len(a.block_table) == 4
    bm.check_invariants([a])

    bm.free(a)
    assert bm.num_free_blocks == 8 and a.block_table == [] and a.num_computed_tokens == 0
    bm.check_invariants([])
    with pytest.raises(AssertionError, match="freed twice"):
        b = _seq([1, 2, 3], "b")
        _admit(bm, b)
        table = list(b.block_table)
        bm.free(b)
        b.block_table = table
        bm.free(b)


def test_cannot_allocate_beyond_the_free_blocks() -> None:
    bm = BlockManager(num_blocks=3, block_size=BS, enable_prefix_caching=False)
    a = _seq(list(range(9)), "a")  # 3 blocks
    assert bm.can_allocate(a, [], 9)
    assert not bm.can_allocate(_seq(list(range(13))), [], 13)  # 4 blocks
    _admit(bm, a)
    a.token_ids.append(9)
    assert bm.can_append(a, 1)  # block 3 has room
    b = _seq([1], "b")
    assert not bm.can_allocate(b, [], 1)


def test_shared_prefix_blocks_are_reference_counted() -> None:
    bm = BlockManager(num_blocks=16, block_size=BS, enable_prefix_caching=True)
    prefix = list(range(100, 108))  # two full blocks
    a = _seq([*prefix, 1, 2, 3], "a")
    b = _seq([*prefix, 4, 5], "b")
    assert _admit(bm, a) == []
    hits = _admit(bm, b)
    assert hits == a.block_table[:2]
    assert b.num_cached_tokens == 8
    for block_id in hits:
        assert bm.blocks[block_id].ref_count == 2
    bm.check_invariants([a, b])

    bm.free(a)  # b still holds the prefix
    assert [bm.blocks[i].ref_count for i in hits] == [1, 1]
    bm.check_invariants([b])
    bm.free(b)
    bm.check_invariants([])
    stats = bm.stats()
    assert (stats.queries, stats.hits) == (11 + 10, 8)
    assert stats.hit_rate == pytest.approx(8 / 21)


def test_the_last_prompt_token_is_always_computed() -> None:
    bm = BlockManager(num_blocks=16, block_size=BS, enable_prefix_caching=True)
    a = _seq(list(range(8)), "a")  # exactly two full blocks
    _admit(bm, a)
    first_block = a.block_table[0]
    bm.free(a)
    same = _seq(list(range(8)), "same")
    # only the first block may hit: the second holds the token whose logits we need
    assert bm.get_computed_blocks(same) == [first_block]
    hits = _admit(bm, same)
    assert len(hits) == 1 and same.num_cached_tokens == 4
    # the recomputed tokens went to a fresh block, never into the shared one
    assert same.block_table[1] not in hits


def test_a_hash_collision_is_a_miss(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bm_module, "hash_block", lambda parent, tokens: b"same key")
    bm = BlockManager(num_blocks=16, block_size=BS, enable_prefix_caching=True)
    a = _seq([1, 2, 3, 4, 5], "a")
    _admit(bm, a)
    other = _seq([9, 9, 9, 9, 5], "other")  # same (colliding) key, different tokens
    assert bm.get_computed_blocks(other) == []
    twin = _seq([1, 2, 3, 4, 7], "twin")
    assert bm.get_computed_blocks(twin) == a.block_table[:1]


def test_free_cached_blocks_are_evicted_least_recently_freed_first() -> None:
    bm = BlockManager(num_blocks=6, block_size=BS, enable_prefix_caching=True)
    a = _seq(list(range(0, 9)), "a")  # blocks: 2 full + 1 partial
    b = _seq(list(range(100, 109)), "b")
    _admit(bm, a)
    _admit(bm, b)
    a_full, b_full = a.block_table[:2], b.block_table[:2]
    bm.free(a)  # freed first: evicted first, its tail block before its head
    bm.free(b)
    assert bm.num_free_blocks == 6
    bm.check_invariants([])

    c = _seq([*range(200, 204), 1], "c")  # 2 blocks: the 2 uncached ones go first
    _admit(bm, c)
    assert bm.stats().evictions == 0
    d = _seq([*range(300, 308), 1], "d")  # 3 blocks: evicts a's tail, a's head, b's tail
    _admit(bm, d)
    assert bm.stats().evictions == 3
    assert sorted(d.block_table) == sorted([a_full[1], a_full[0], b_full[1]])
    # b's first block survived: a request with b's prefix still hits it
    again = _seq(list(range(100, 109)), "again")
    assert bm.get_computed_blocks(again) == b_full[:1]
    bm.check_invariants([c, d])


def test_reusing_a_free_cached_block_takes_it_off_the_free_list() -> None:
    bm = BlockManager(num_blocks=3, block_size=BS, enable_prefix_caching=True)
    a = _seq(list(range(9)), "a")
    _admit(bm, a)
    bm.free(a)  # 3 free blocks, 2 of them cached
    again = _seq([*range(8), 50, 51, 52, 53], "again")  # 8 cached tokens + 4 new: 1 new block
    hits = bm.get_computed_blocks(again)
    assert len(hits) == 2
    # the hits are free but are not room for the new block: only 1 block is
    assert bm.can_allocate(again, hits, 4)
    assert not bm.can_allocate(again, hits, 5)
    _admit(bm, again)
    assert bm.num_free_blocks == 0
    bm.check_invariants([again])


def test_prefix_caching_off_never_hits() -> None:
    bm = BlockManager(num_blocks=8, block_size=BS, enable_prefix_caching=False)
    a = _seq(list(range(9)), "a")
    _admit(bm, a)
    bm.free(a)
    assert bm.get_computed_blocks(_seq(list(range(9)))) == []
    assert all(b.block_hash is None for b in bm.blocks)


# sliding window -------------------------------------------------------------------------------


def _decode(bm: BlockManager, seq: Sequence, num_tokens: int) -> None:
    """Compute ``num_tokens`` more tokens one step at a time, as the scheduler does."""
    for _ in range(num_tokens):
        seq.token_ids.append(seq.num_tokens % 50)
        assert bm.can_append(seq, 1)
        bm.append_slots(seq, 1)
        seq.num_computed_tokens += 1
        bm.free_out_of_window(seq)


def test_blocks_out_of_every_future_window_are_freed_behind_placeholders() -> None:
    # window 6: a query at position p reads keys p-5 .. p
    bm = BlockManager(num_blocks=8, block_size=BS, enable_prefix_caching=True, sliding_window=6)
    a = _seq(list(range(9)), "a")
    _admit(bm, a)
    # 9 computed: the next query (position 9) reads keys 4..9: block 0 (keys 0..3) goes
    assert bm.num_out_of_window(9) == 1
    assert bm.free_out_of_window(a) == 1
    assert a.block_table[0] == NULL_BLOCK and len(a.block_table) == 3
    assert bm.free_out_of_window(a) == 0  # idempotent
    bm.check_invariants([a])
    # the freed block was full, hence hashed: it stays in the prefix cache, free
    assert bm.num_free_blocks == 6 and bm.stats().evictions == 0
    _decode(bm, a, 20)  # 29 tokens: reads keys from 24 on; blocks 0..5 freed
    assert a.block_table[:6] == [NULL_BLOCK] * 6 and NULL_BLOCK not in a.block_table[6:]
    # held: blocks 6 and 7 (keys 24..31); the table length still counts logical blocks
    assert len(a.block_table) == 8 and bm.num_free_blocks == 6
    bm.check_invariants([a])
    # 8 blocks for 29+ tokens on a cache of 8: only possible because the head was freed
    _decode(bm, a, 10)
    bm.check_invariants([a])
    bm.free(a)  # placeholders are skipped
    assert bm.num_free_blocks == 8 and a.block_table == []
    bm.check_invariants([])


def test_unhashed_blocks_go_back_to_the_free_list() -> None:
    bm = BlockManager(num_blocks=4, block_size=BS, enable_prefix_caching=False, sliding_window=4)
    a = _seq(list(range(3)), "a")
    _admit(bm, a)
    _decode(bm, a, 10)  # 13 tokens: reads keys from 9 on; blocks 0, 1 freed
    assert a.block_table[:2] == [NULL_BLOCK] * 2
    assert bm.num_free_blocks == 2 and bm.stats().evictions == 0
    bm.check_invariants([a])


def test_shared_blocks_keep_their_other_owners() -> None:
    bm = BlockManager(num_blocks=16, block_size=BS, enable_prefix_caching=True, sliding_window=5)
    prefix = list(range(100, 108))
    a = _seq([*prefix, 1, 2, 3, 4], "a")
    b = _seq([*prefix, 7], "b")
    _admit(bm, a)
    hits = _admit(bm, b)  # b's next query (position 8) reads keys 4..8: block 0 is not needed
    assert hits == [NULL_BLOCK, a.block_table[1]]
    assert bm.blocks[a.block_table[1]].ref_count == 2
    first, second = a.block_table[:2]
    assert bm.free_out_of_window(a) == 2  # a's next query (12) reads keys 8..12
    assert bm.blocks[first].ref_count == 0 and bm.blocks[second].ref_count == 1  # b's
    bm.check_invariants([a, b])


@pytest.mark.parametrize("window", [5, 6])
def test_a_window_hit_needs_only_the_blocks_the_next_query_reads(window: int) -> None:
    bm = BlockManager(
        num_blocks=4, block_size=BS, enable_prefix_caching=True, sliding_window=window
    )
    prefix = list(range(100, 108))
    a = _seq([*prefix, 1, 2, 3, 4], "a")
    _admit(bm, a)
    first, second = a.block_table[:2]
    bm.free_out_of_window(a)  # block 0 (window 6), or blocks 0, 1 (window 5); head first
    c = _seq(list(range(200, 208)), "c")  # 2 new blocks: the uncached one, then evicts `first`
    _admit(bm, c)
    assert bm.stats().evictions == 1 and first in c.block_table
    b = _seq([*prefix, 7], "b")
    hits = bm.get_computed_blocks(b)
    if window == 6:
        # b's next query (position 8) reads keys 3..8: block 0 is needed, and gone
        assert hits == []
        return
    # a chained lookup would miss at block 0; the next query reads keys 4..8, all in block 1
    assert hits == [NULL_BLOCK, second]
    bm.free(c)
    _admit(bm, b)
    assert b.num_computed_tokens == 9 and b.num_cached_tokens == 8
    bm.check_invariants([a, b])


def test_a_placeholder_inside_the_window_breaks_the_invariants() -> None:
    bm = BlockManager(num_blocks=8, block_size=BS, enable_prefix_caching=False, sliding_window=6)
    a = _seq(list(range(9)), "a")
    _admit(bm, a)
    bm.free_out_of_window(a)
    taken = a.block_table[1]
    a.block_table[1] = NULL_BLOCK  # block 1 holds keys 4..7, read by the next query
    bm.blocks[taken].ref_count -= 1
    bm._free.append(taken)
    with pytest.raises(AssertionError, match="nulls"):
        bm.check_invariants([a])
    plain = BlockManager(num_blocks=8, block_size=BS, enable_prefix_caching=False)
    b = _seq(list(range(9)), "b")
    _admit(plain, b)
    assert plain.free_out_of_window(b) == 0  # no window: nothing is ever freed early
    plain.check_invariants([b])


def test_can_allocate_with_a_preemption_plan_matches_preempting() -> None:
    bm = BlockManager(num_blocks=6, block_size=BS, enable_prefix_caching=True)
    victim = _seq(list(range(12)), "victim")  # 3 full blocks, all cached
    other = _seq(list(range(50, 62)), "other")
    _admit(bm, victim)
    _admit(bm, other)
    # 8 tokens hit the victim's first 2 blocks; 5 more need 2 new blocks
    w = _seq([*range(8), 90, 91, 92, 93, 94], "w")
    hits = bm.get_computed_blocks(w)
    assert hits == victim.block_table[:2]
    assert not bm.can_allocate(w, hits, 5)
    # preempting the victim frees 3 blocks, but 2 of them are w's hits, not room
    for plan, expected in (([victim], False), ([victim, other], True)):
        assert bm.can_allocate(w, hits, 5, preempting=plan) is expected
        trial = copy.deepcopy((bm, w, plan))
        for seq in trial[2]:
            trial[0].free(seq)
        assert trial[0].can_allocate(trial[1], hits, 5) is expected
    bm.check_invariants([victim, other])
