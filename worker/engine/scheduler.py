"""Iteration-level scheduling: which sequences compute how many tokens in the next step.

Pure Python (no torch). One ``schedule()`` call plans one forward pass:

1. Running sequences first, in priority order (class, then arrival): a decoding sequence
   gets 1 token, one mid-prompt gets the next chunk of its prompt, all within the step's token
   budget (``max_num_batched_tokens``).
2. If a running sequence needs a block and none is free, the running sequence that comes
   last in priority order (lowest class, latest arrival) is preempted: its blocks are freed
   and it goes back to waiting, to be recomputed later (its tokens are kept; the prefix cache
   usually still holds its blocks). This repeats until the block fits or the sequence has
   preempted itself.
3. Then, unless step 2 preempted anything, waiting sequences are admitted in priority order
   while the budget, ``max_num_seqs`` and free blocks allow; an admission starts from its
   prefix-cache hits and computes (a chunk of) the rest. Admission stops at the first
   sequence that does not fit (no overtaking within the order).

Example:

    >>> scheduler = Scheduler(config, BlockManager(num_blocks, 16, True))
    >>> scheduler.add(Sequence("a", prompt_ids, params))
    >>> out = scheduler.schedule()  # run the model on out.scheduled ...
    >>> scheduler.update(out)       # ... then record what was computed
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

from worker.engine.block_manager import BlockManager
from worker.engine.sequence import Sequence, SequenceStatus


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    """The scheduler's limits (from ``EngineConfig``)."""

    # most sequences running (holding blocks) at once
    max_num_seqs: int
    # most tokens computed in one step
    max_num_batched_tokens: int
    # allow a prompt to be split across steps
    enable_chunked_prefill: bool = True


@dataclass(frozen=True, slots=True)
class ScheduledSequence:
    """One sequence's share of a step."""

    seq: Sequence
    # tokens computed this step: seq.token_ids[num_computed_tokens : + num_new_tokens]
    num_new_tokens: int

    @property
    def samples(self) -> bool:
        """True when the step computes the sequence's last known token (its logits are used)."""
        return self.seq.num_computed_tokens + self.num_new_tokens == self.seq.num_tokens


@dataclass(frozen=True, slots=True)
class SchedulerOutput:
    """The plan of one step."""

    # sequences to compute, with their token counts (running ones first, then admissions)
    scheduled: tuple[ScheduledSequence, ...]
    # sum of num_new_tokens (<= max_num_batched_tokens)
    num_batched_tokens: int
    # sequences preempted while planning this step (their blocks are already freed)
    preempted: tuple[Sequence, ...]

    @property
    def is_empty(self) -> bool:
        return not self.scheduled


class Scheduler:
    """Queues of waiting and running sequences; decides each step (see the module doc)."""

    def __init__(self, config: SchedulerConfig, block_manager: BlockManager) -> None:
        self.config = config
        self.block_manager = block_manager
        # NOTE: both lists stay sorted by Sequence.sort_key
        self.waiting: list[Sequence] = []
        self.running: list[Sequence] = []
        self.num_preemptions = 0

    def add(self, seq: Sequence) -> None:
        assert seq.status is SequenceStatus.WAITING
        bisect.insort(self.waiting, seq, key=_key)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    @property
    def num_unfinished(self) -> int:
        return len(self.waiting) + len(self.running)

    def schedule(self) -> SchedulerOutput:
        bm = self.block_manager
        budget = self.config.max_num_batched_tokens
        scheduled: list[ScheduledSequence] = []
        preempted: list[Sequence] = []

        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            num_new = min(seq.num_tokens - seq.num_computed_tokens, budget)
            assert num_new > 0, f"{seq} is running with nothing to compute"
            while not bm.can_append(seq, num_new):
                victim = self.running.pop()  # last in priority order; never one scheduled
                self._preempt(victim)
                preempted.append(victim)
                if victim is seq:
                    break
            else:
                bm.append_slots(seq, num_new)
                scheduled.append(ScheduledSequence(seq, num_new))
                budget -= num_new
                i += 1
                continue
            break  # seq preempted itself: it was the last running sequence

        if not preempted:
            while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
                seq = self.waiting[0]
                hits = bm.get_computed_blocks(seq)
                num_new = seq.num_tokens - len(hits) * bm.block_size
                if num_new > budget:
                    if not self.config.enable_chunked_prefill:
                        break
                    num_new = budget
                if not bm.can_allocate(seq, hits, num_new):
                    break
                self.waiting.pop(0)
                bm.allocate(seq, hits, num_new)
                seq.status = SequenceStatus.RUNNING
                bisect.insort(self.running, seq, key=_key)
                scheduled.append(ScheduledSequence(seq, num_new))
                budget -= num_new

        return SchedulerOutput(
            scheduled=tuple(scheduled),
            num_batched_tokens=self.config.max_num_batched_tokens - budget,
            preempted=tuple(preempted),
        )

    def update(self, out: SchedulerOutput) -> None:
        """Record that the step of ``out`` ran: its tokens are now in the cache."""
        for s in out.scheduled:
            s.seq.num_computed_tokens += s.num_new_tokens

    def append_token(self, seq: Sequence, token_id: int) -> None:
        """A token sampled for ``seq``; it is computed (cached) in the sequence's next step."""
        seq.token_ids.append(token_id)

    def finish(self, seq: Sequence) -> None:
        """Remove ``seq`` (finished or aborted) and free its blocks at once."""
        if seq.status is SequenceStatus.FINISHED:
            return
        queue = self.running if seq.status is SequenceStatus.RUNNING else self.waiting
        queue.remove(seq)
        self.block_manager.free(seq)
        seq.status = SequenceStatus.FINISHED

    def _preempt(self, seq: Sequence) -> None:
        self.block_manager.free(seq)
        seq.status = SequenceStatus.WAITING
        seq.num_preemptions += 1
        self.num_preemptions += 1
        bisect.insort(self.waiting, seq, key=_key)


def _key(seq: Sequence) -> tuple[int, float, int]:
    return seq.sort_key
