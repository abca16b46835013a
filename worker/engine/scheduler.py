"""Iteration-level scheduling: which sequences compute how many tokens in the next step.

Pure Python (no torch). One ``schedule()`` call plans one forward pass. Sequences are taken in
priority order (class, then arrival), running and waiting ones interleaved by class:

1. Within a class, running sequences come first: a decoding sequence gets 1 token, one
   mid-prompt gets the next chunk of its prompt, all within the step's token budget
   (``max_num_batched_tokens``).
2. A waiting sequence is admitted once every running sequence of its class or a better one has
   had its share, *before* running sequences of worse classes: so a better-class request never
   waits for the budget that worse classes would take (it waits only for work of its own class
   or better). An admission starts from its prefix-cache hits and computes (a chunk of) the
   rest. Admission stops at the first sequence that does not fit (no overtaking).
3. Priority preemption: if that waiting sequence lacks free blocks or a ``max_num_seqs`` slot,
   running sequences of a strictly worse class, not yet scheduled in this step, are preempted
   for it, in preemption order (worst class first, latest arrival first within a class), as
   few as let it in. If even all of them would not, none is preempted and it waits. A
   sequence of its own class or a better one is never preempted for it; lacking budget is no
   reason to preempt (the worse classes have not taken any yet).
4. If a running sequence needs a block and none is free, the running sequence that comes last
   in priority order is preempted. This repeats until the block fits or the sequence has
   preempted itself. Nothing is admitted after that in the step.

A preempted sequence's blocks are freed and it goes back to waiting, to be recomputed later
(its tokens are kept; the prefix cache usually still holds its blocks). Against thrashing: a
step admits, after a preemption, only sequences of a strictly better class than its victims,
so a victim never comes back in the step that preempted it; and a victim can only be preempted
for a strictly better class, never in return by the one it displaced.

After a step ran (``update``), blocks that a sequence's future queries can no longer read
under a sliding window are freed (``BlockManager.free_out_of_window``).

Example:

    >>> scheduler = Scheduler(config, BlockManager(num_blocks, 16, True))
    >>> scheduler.add(Sequence("a", prompt_ids, params))
    >>> out = scheduler.schedule()  # run the model on out.scheduled ...
    >>> scheduler.update(out)       # ... then record what was computed
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field
from typing import Any

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

    # sequences to compute, with their token counts, in planning order (by class; running
    # before admissions within a class)
    scheduled: tuple[ScheduledSequence, ...]
    # sum of num_new_tokens (<= max_num_batched_tokens)
    num_batched_tokens: int
    # sequences preempted while planning this step (their blocks are already freed)
    preempted: tuple[Sequence, ...]
    # the token masks of the step's sequences with structured outputs, being computed while
    # the model runs (a `worker.engine.structured.StepMasks`, set by the engine); None: none
    masks: Any = None

    @property
    def is_empty(self) -> bool:
        return not self.scheduled


@dataclass(slots=True)
class _Step:
    """The step being planned (private to ``Scheduler.schedule``)."""

    # tokens left in the step's budget
    budget: int
    scheduled: list[ScheduledSequence] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)
    # only waiting sequences of a class below this may be admitted (preemptions lower it)
    admit_below: float = math.inf


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
        step = _Step(budget=self.config.max_num_batched_tokens)
        # NOTE: running[:i] are exactly the running sequences scheduled in this step; an
        # admission is inserted among them (its class is better than running[i]'s), and every
        # preemption pops from running[i:], so a victim is never one already scheduled.
        i = 0
        while step.budget > 0:
            head = self.waiting[0] if self.waiting else None
            if head is not None and head.priority >= step.admit_below:
                head = None
            if i < len(self.running) and (
                head is None or self.running[i].priority <= head.priority
            ):
                if self._schedule_running(self.running[i], step):
                    i += 1
            elif head is not None:
                if self._admit(head, i, step):
                    i += 1
                else:
                    step.admit_below = -math.inf  # no overtaking: admissions end here
            else:
                break
        return SchedulerOutput(
            scheduled=tuple(step.scheduled),
            num_batched_tokens=self.config.max_num_batched_tokens - step.budget,
            preempted=tuple(step.preempted),
        )

    def _schedule_running(self, seq: Sequence, step: _Step) -> bool:
        """Give a running ``seq`` its share; False if it had to preempt itself for blocks."""
        bm = self.block_manager
        num_new = min(seq.num_tokens - seq.num_computed_tokens, step.budget)
        assert num_new > 0, f"{seq} is running with nothing to compute"
        while not bm.can_append(seq, num_new):
            victim = self.running.pop()  # last in priority order
            self._preempt(victim, step)
            # short of blocks: an admission now would only be preempted again
            step.admit_below = -math.inf
            if victim is seq:
                return False  # it was the last running sequence
        bm.append_slots(seq, num_new)
        step.scheduled.append(ScheduledSequence(seq, num_new))
        step.budget -= num_new
        return True

    def _admit(self, seq: Sequence, num_scheduled: int, step: _Step) -> bool:
        """Admit the waiting head ``seq``, preempting for it if it needs to and may (module
        doc, 3); False if it does not fit."""
        bm = self.block_manager
        may_preempt = num_scheduled < len(self.running) and self.running[-1].priority > seq.priority
        if len(self.running) >= self.config.max_num_seqs and not may_preempt:
            return False  # no slot, and none to take: spare the prefix lookup
        hits = bm.get_computed_blocks(seq)
        num_new = seq.num_tokens - len(hits) * bm.block_size
        if num_new > step.budget:
            if not self.config.enable_chunked_prefill:
                return False
            num_new = step.budget
        victims = self._victims_for(seq, hits, num_new, num_scheduled)
        if victims is None:
            return False
        for victim in victims:
            assert self.running[-1] is victim
            self.running.pop()
            self._preempt(victim, step)
            # a victim must not come back in this step (nor anything of its class or worse)
            step.admit_below = min(step.admit_below, victim.priority)
        assert self.waiting[0] is seq  # victims are of a worse class: queued behind it
        self.waiting.pop(0)
        bm.allocate(seq, hits, num_new)
        seq.status = SequenceStatus.RUNNING
        bisect.insort(self.running, seq, key=_key)
        step.scheduled.append(ScheduledSequence(seq, num_new))
        step.budget -= num_new
        return True

    def _victims_for(
        self, seq: Sequence, hits: list[int], num_new: int, num_scheduled: int
    ) -> list[Sequence] | None:
        """The fewest running sequences to preempt, in preemption order, so that waiting
        ``seq`` gets a slot and blocks: [] if it fits as is, None if no allowed set does.

        Only sequences not yet scheduled in this step (``running[num_scheduled:]``) and of a
        strictly worse class than ``seq`` may be preempted.
        """
        candidates: list[Sequence] = []
        for victim in reversed(self.running[num_scheduled:]):  # worst class, latest first
            if victim.priority <= seq.priority:
                break
            candidates.append(victim)

        def fits(k: int) -> bool:
            if len(self.running) - k >= self.config.max_num_seqs:
                return False
            return self.block_manager.can_allocate(seq, hits, num_new, candidates[:k])

        if fits(0):
            return []
        if not candidates or not fits(len(candidates)):
            return None  # preempting would not be enough: preempt nothing
        # each further victim can only add room (slots, blocks): bisect for the fewest
        lo, hi = 1, len(candidates)
        while lo < hi:
            mid = (lo + hi) // 2
            if fits(mid):
                hi = mid
            else:
                lo = mid + 1
        return candidates[:lo]

    def update(self, out: SchedulerOutput) -> None:
        """Record that the step of ``out`` ran: its tokens are now in the cache, and blocks
        now out of every future query's sliding window can go."""
        bm = self.block_manager
        for s in out.scheduled:
            s.seq.num_computed_tokens += s.num_new_tokens
            if bm.sliding_window is not None:
                bm.free_out_of_window(s.seq)

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

    def _preempt(self, seq: Sequence, step: _Step) -> None:
        step.preempted.append(seq)
        self.block_manager.free(seq)
        seq.status = SequenceStatus.WAITING
        seq.num_preemptions += 1
        self.num_preemptions += 1
        bisect.insort(self.waiting, seq, key=_key)


def _key(seq: Sequence) -> tuple[int, float, int]:
    return seq.sort_key
