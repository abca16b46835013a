"""Driving the scheduler by hand in its unit tests: build one over a small block manager, make
sequences, and step it (schedule, "run" by appending a token to each sequence that samples,
check the books: the budget, the blocks held, the block manager's invariants)."""

from __future__ import annotations

from worker.engine.block_manager import NULL_BLOCK, BlockManager
from worker.engine.params import SamplingParams
from worker.engine.scheduler import Scheduler, SchedulerConfig, SchedulerOutput
from worker.engine.sequence import Sequence

BS = 4


def _scheduler(
    num_blocks: int = 64,
    budget: int = 16,
    max_num_seqs: int = 8,
    chunked: bool = True,
    prefix: bool = False,
) -> Scheduler:
    return Scheduler(
        SchedulerConfig(max_num_seqs, budget, enable_chunked_prefill=chunked),
        BlockManager(num_blocks, BS, enable_prefix_caching=prefix),
    )


def _seq(
    name: str, num_prompt: int, priority: int = 0, arrival: float = 0.0, max_tokens: int = 8
) -> Sequence:
    tokens = [hash((name, i)) % 1000 for i in range(num_prompt)]
    return Sequence(name, tokens, SamplingParams(max_tokens=max_tokens), priority, arrival)


def _step(s: Scheduler) -> SchedulerOutput:
    return _step_sampled(s)[0]


def _step_sampled(s: Scheduler) -> tuple[SchedulerOutput, list[str]]:
    """Schedule, 'run' (append a token to every sequence that samples), check the books.

    Returns the plan and the ids of the sequences that sampled a token."""
    out = s.schedule()
    assert out.num_batched_tokens <= s.config.max_num_batched_tokens
    assert sum(x.num_new_tokens for x in out.scheduled) == out.num_batched_tokens
    sampling = [x.seq for x in out.scheduled if x.samples]
    for x in out.scheduled:
        needed = x.seq.num_computed_tokens + x.num_new_tokens
        assert len(x.seq.block_table) * BS >= needed
    s.update(out)
    for seq in sampling:
        s.append_token(seq, 7)
    s.block_manager.check_invariants(s.running + s.waiting)
    return out, [seq.request_id for seq in sampling]


def _plan(out: SchedulerOutput) -> dict[str, int]:
    return {x.seq.request_id: x.num_new_tokens for x in out.scheduled}


def _ids(seqs: list[Sequence] | tuple[Sequence, ...]) -> list[str]:
    return [q.request_id for q in seqs]


def _num_held(seq: Sequence) -> int:
    return sum(b != NULL_BLOCK for b in seq.block_table)
