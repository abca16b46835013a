"""KV-cache blocks: allocation, reference counts, prefix caching, LRU eviction. Pure Python.

The cache is ``num_blocks`` fixed-size blocks of ``block_size`` tokens. A sequence owns the
blocks of its ``block_table``; a block shared by several sequences (a common prompt prefix)
has one reference per owner.

Prefix caching: a *full* block is keyed by a chained hash, ``hash(parent's hash, its token
ids)``, so equal keys mean equal prefixes. A lookup walks a new sequence's full blocks from the
first and stops at the first miss; every hit is checked against the tokens stored with the
block (a hash collision is a miss, never wrong keys/values). When its last owner lets go, a
hashed block keeps its contents and its key and waits in an LRU list of free cached blocks: a
later request with the same prefix takes it back; a new allocation that finds no never-used
block evicts the least recently freed one.

Example:

    >>> bm = BlockManager(num_blocks=64, block_size=16, enable_prefix_caching=True)
    >>> hits = bm.get_computed_blocks(seq)
    >>> if bm.can_allocate(seq, hits, num_new_tokens):
    ...     bm.allocate(seq, hits, num_new_tokens)
    >>> bm.free(seq)
"""

from __future__ import annotations

import hashlib
from array import array
from collections import Counter, OrderedDict, deque
from collections.abc import Iterable
from dataclasses import dataclass

from worker.engine.sequence import Sequence

_ROOT_HASH = b""
# block-table placeholder of a block freed for being out of every future query's window
NULL_BLOCK = -1


class Block:
    """One physical block of the KV cache."""

    __slots__ = ("block_hash", "block_id", "parent_hash", "ref_count", "token_ids")

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        # owners (sequences whose block_table holds it)
        self.ref_count = 0
        # prefix-cache key once full and registered; None otherwise
        self.block_hash: bytes | None = None
        # what the key stands for, to tell a true hit from a hash collision
        self.parent_hash: bytes = _ROOT_HASH
        self.token_ids: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class PrefixCacheStats:
    """Counters since start; tokens, so a hit rate reads as a share of prompt work saved."""

    # tokens looked up at admission (whole sequences, preempted ones again when re-admitted)
    queries: int
    # of those, tokens found cached
    hits: int
    # cached blocks whose contents were dropped to make room
    evictions: int

    @property
    def hit_rate(self) -> float:
        return self.hits / self.queries if self.queries else 0.0


def hash_block(parent_hash: bytes, token_ids: Iterable[int]) -> bytes:
    """Chained key of one full block: 128-bit BLAKE2b of the parent key and the token ids."""
    h = hashlib.blake2b(parent_hash, digest_size=16)
    h.update(array("q", token_ids).tobytes())
    return h.digest()


class BlockManager:
    """Owns the free lists, reference counts and the prefix-cache index."""

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        enable_prefix_caching: bool,
        sliding_window: int | None = None,
    ) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError(
                f"num_blocks ({num_blocks}) and block_size ({block_size}) must be >= 1"
            )
        if sliding_window is not None and sliding_window < 1:
            raise ValueError(f"sliding_window: must be >= 1, got {sliding_window}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        # keys every layer's query sees (None: some layer sees all; never free blocks early)
        self.sliding_window = sliding_window
        self.blocks = [Block(i) for i in range(num_blocks)]
        # never-used (or uncached) free blocks, taken first
        self._free: deque[int] = deque(range(num_blocks))
        # free blocks that still hold a registered prefix; least recently freed first
        self._free_cached: OrderedDict[int, None] = OrderedDict()
        # prefix-cache index: key -> block holding it (in use or free)
        self._cached: dict[bytes, int] = {}
        self._queries = 0
        self._hits = 0
        self._evictions = 0

    # accounting ---------------------------------------------------------------------------

    @property
    def num_free_blocks(self) -> int:
        """Blocks an allocation may take (free cached ones included: they can be evicted)."""
        return len(self._free) + len(self._free_cached)

    @property
    def usage(self) -> float:
        """Share of blocks owned by some sequence."""
        return 1.0 - self.num_free_blocks / self.num_blocks

    def stats(self) -> PrefixCacheStats:
        return PrefixCacheStats(self._queries, self._hits, self._evictions)

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    # prefix cache -------------------------------------------------------------------------

    def get_computed_blocks(self, seq: Sequence) -> list[int]:
        """Cached blocks holding a prefix of ``seq`` (no references taken, nothing counted);
        with a sliding window, ``NULL_BLOCK`` for the leading ones no query will read.

        NOTE: at most ``num_tokens - 1`` tokens can hit: the last token is always computed,
        since its logits give the next token. So computed tokens never land in a shared block.
        """
        if not self.enable_prefix_caching:
            return []
        max_blocks = (seq.num_tokens - 1) // self.block_size
        hashes = self._block_hashes(seq, max_blocks)
        if self.sliding_window is not None:
            return self._computed_blocks_in_window(seq, hashes, max_blocks)
        hits: list[int] = []
        for i in range(max_blocks):
            block_id = self._lookup(seq, hashes, i)
            if block_id is None:
                break
            hits.append(block_id)
        return hits

    def _computed_blocks_in_window(
        self, seq: Sequence, hashes: list[bytes], max_blocks: int
    ) -> list[int]:
        """The longest prefix of ``k`` blocks whose last blocks, those the first query after it
        reads, are all cached; the blocks before them need not be (they become NULL_BLOCK)."""
        best, run = 0, 0  # run: cached blocks in a row ending at block i
        found: list[int | None] = []
        for i in range(max_blocks):
            block_id = self._lookup(seq, hashes, i)
            found.append(block_id)
            run = run + 1 if block_id is not None else 0
            k = i + 1
            if run >= k - self.num_out_of_window(k * self.block_size):
                best = k
        skipped = self.num_out_of_window(best * self.block_size)
        hits = [NULL_BLOCK] * skipped
        for block_id in found[skipped:best]:
            assert block_id is not None
            hits.append(block_id)
        return hits

    def _lookup(self, seq: Sequence, hashes: list[bytes], i: int) -> int | None:
        """The cached block holding ``seq``'s block ``i``, None on a miss.

        The block's own tokens and its parent key are compared, so a hash collision is a miss,
        never wrong keys/values.
        """
        block_id = self._cached.get(hashes[i])
        if block_id is None:
            return None
        block = self.blocks[block_id]
        bs = self.block_size
        parent = hashes[i - 1] if i else _ROOT_HASH
        if (
            block.parent_hash != parent
            or list(block.token_ids) != seq.token_ids[i * bs : (i + 1) * bs]
        ):
            return None
        return block_id

    def _block_hashes(self, seq: Sequence, num_blocks: int) -> list[bytes]:
        """Keys of ``seq``'s first ``num_blocks`` full blocks, extending ``seq.block_hashes``."""
        bs = self.block_size
        hashes = seq.block_hashes
        while len(hashes) < num_blocks:
            i = len(hashes)
            parent = hashes[-1] if hashes else _ROOT_HASH
            hashes.append(hash_block(parent, seq.token_ids[i * bs : (i + 1) * bs]))
        return hashes

    # allocation ---------------------------------------------------------------------------

    def can_allocate(
        self,
        seq: Sequence,
        computed_blocks: list[int],
        num_new_tokens: int,
        preempting: Iterable[Sequence] = (),
    ) -> bool:
        """Whether a waiting ``seq`` can start: its prefix hits plus ``num_new_tokens``;
        with ``preempting``, as if those running sequences were freed first (a preemption plan:
        their hashed blocks stay cached, so ``computed_blocks`` stay valid)."""
        # references the plan would drop, per block
        dropped = Counter(b for s in preempting for b in s.block_table if b != NULL_BLOCK)
        freed = sum(1 for b, n in dropped.items() if self.blocks[b].ref_count == n)
        num_computed = len(computed_blocks) * self.block_size
        needed = self.blocks_needed(num_computed + num_new_tokens) - len(computed_blocks)
        # free hits get reused, not allocated: they do not count as room for new blocks
        free_hits = sum(
            1 for b in computed_blocks if b != NULL_BLOCK and self.blocks[b].ref_count == dropped[b]
        )
        return needed <= self.num_free_blocks + freed - free_hits

    def allocate(self, seq: Sequence, computed_blocks: list[int], num_new_tokens: int) -> None:
        """Admit ``seq``: take references on its prefix hits, then room for the new tokens."""
        assert not seq.block_table, f"{seq} already holds blocks"
        for block_id in computed_blocks:
            if block_id == NULL_BLOCK:
                continue
            block = self.blocks[block_id]
            if block.ref_count == 0:
                del self._free_cached[block_id]
            block.ref_count += 1
        seq.block_table = list(computed_blocks)
        seq.num_computed_tokens = len(computed_blocks) * self.block_size
        if seq.num_cached_tokens < 0:
            seq.num_cached_tokens = seq.num_computed_tokens
        self._queries += seq.num_tokens
        self._hits += seq.num_computed_tokens
        self.append_slots(seq, num_new_tokens)

    def can_append(self, seq: Sequence, num_new_tokens: int) -> bool:
        """Whether a running ``seq`` can compute ``num_new_tokens`` more tokens."""
        total = seq.num_computed_tokens + num_new_tokens
        return self.blocks_needed(total) - len(seq.block_table) <= self.num_free_blocks

    def append_slots(self, seq: Sequence, num_new_tokens: int) -> None:
        """Give ``seq`` blocks for its next ``num_new_tokens`` tokens and register the blocks
        those tokens fill in the prefix cache.

        NOTE: a block is registered when the step that writes its last token is scheduled,
        before the forward runs; a sequence admitted in the same step may hit it because each
        layer writes every new key/value before any query of the step reads the cache.
        """
        total = seq.num_computed_tokens + num_new_tokens
        needed = self.blocks_needed(total) - len(seq.block_table)
        assert needed <= self.num_free_blocks, "append_slots without can_append"
        for _ in range(needed):
            seq.block_table.append(self._take_free_block())
        if self.enable_prefix_caching:
            self._register_full_blocks(seq, total // self.block_size)

    def _take_free_block(self) -> int:
        if self._free:
            block_id = self._free.popleft()
        else:
            block_id, _ = self._free_cached.popitem(last=False)  # least recently freed
            block = self.blocks[block_id]
            assert block.block_hash is not None
            del self._cached[block.block_hash]
            block.block_hash = None
            self._evictions += 1
        block = self.blocks[block_id]
        assert block.ref_count == 0
        block.ref_count = 1
        return block_id

    def _register_full_blocks(self, seq: Sequence, num_full_blocks: int) -> None:
        hashes = self._block_hashes(seq, num_full_blocks)
        bs = self.block_size
        for i in range(num_full_blocks):
            block_id = seq.block_table[i]
            if block_id == NULL_BLOCK:
                continue  # freed out of the window (or never taken): nothing to register
            block = self.blocks[block_id]
            if block.block_hash is not None:
                continue  # a prefix hit, or registered in an earlier step
            key = hashes[i]
            if key in self._cached:
                continue  # another block already holds this prefix: keep that one
            block.block_hash = key
            block.parent_hash = hashes[i - 1] if i else _ROOT_HASH
            block.token_ids = tuple(seq.token_ids[i * bs : (i + 1) * bs])
            self._cached[key] = block.block_id

    def free(self, seq: Sequence) -> None:
        """Drop ``seq``'s references; blocks nobody holds become free (hashed ones cached).

        Blocks are released tail first, so a sequence's last blocks (least likely to be shared)
        are evicted before its first ones.
        """
        for block_id in reversed(seq.block_table):
            if block_id != NULL_BLOCK:
                self._release(block_id)
        seq.block_table = []
        seq.num_computed_tokens = 0

    def _release(self, block_id: int) -> None:
        block = self.blocks[block_id]
        assert block.ref_count > 0, f"block {block_id} freed twice"
        block.ref_count -= 1
        if block.ref_count == 0:
            if block.block_hash is not None:
                self._free_cached[block_id] = None
            else:
                self._free.append(block_id)

    # sliding window -----------------------------------------------------------------------

    def num_out_of_window(self, num_computed_tokens: int) -> int:
        """Leading blocks that no query at a position >= ``num_computed_tokens`` reads."""
        if self.sliding_window is None:
            return 0
        first_read = num_computed_tokens - self.sliding_window + 1  # oldest key still read
        return max(first_read, 0) // self.block_size

    def free_out_of_window(self, seq: Sequence) -> int:
        """Release ``seq``'s blocks that its future queries can no longer read (after its
        ``num_computed_tokens`` grew); returns how many were released.

        NOTE: call it only once the step that computed those tokens has run: a block released
        here may be handed to another sequence and overwritten in the very next step.
        """
        table = seq.block_table
        end = min(self.num_out_of_window(seq.num_computed_tokens), len(table))
        # placeholders form a prefix: walk back from its end to the last one already placed
        start = end
        while start > 0 and table[start - 1] != NULL_BLOCK:
            start -= 1
        # head first, as successive decode steps free them: the oldest is evicted first
        for i in range(start, end):
            self._release(table[i])
            table[i] = NULL_BLOCK
        return end - start

    # checks -------------------------------------------------------------------------------

    def check_invariants(self, live: Iterable[Sequence]) -> None:
        """Assert the books balance against the live sequences (tests and debugging)."""
        owners = [0] * self.num_blocks
        for seq in live:
            table = seq.block_table
            num_null = table.count(NULL_BLOCK)
            assert table[:num_null] == [NULL_BLOCK] * num_null, f"{seq}: a hole in its table"
            # only blocks no future query reads may be placeholders (none without a window)
            assert num_null <= self.num_out_of_window(seq.num_computed_tokens), f"{seq} nulls"
            held = table[num_null:]
            assert len(set(held)) == len(held), f"{seq} repeats a block"
            for block_id in held:
                owners[block_id] += 1
            assert seq.num_computed_tokens <= len(table) * self.block_size
        free = list(self._free) + list(self._free_cached)
        free_set = set(free)
        assert len(free_set) == len(free), "a block is free twice"
        for block in self.blocks:
            assert block.ref_count == owners[block.block_id], f"block {block.block_id} refs"
            is_free = block.block_id in free_set
            assert is_free == (block.ref_count == 0), f"block {block.block_id} free state"
            if block.block_hash is not None:
                assert self._cached[block.block_hash] == block.block_id
        assert all(self.blocks[b].block_hash is not None for b in self._free_cached)
        assert len(self._cached) == sum(b.block_hash is not None for b in self.blocks)
