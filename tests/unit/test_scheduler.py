"""Scheduler as pure logic: budget accounting, chunked prefill, priorities, preemption order,
priority preemption (victims, slots, blocks, budget), sliding-window freeing, cancellation; and
a replay of real workload traces with a fake runner, checked every step."""

from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path

import pytest

from bench.traces import WORKLOADS, TraceRequest, clip, read_trace
from worker.engine.block_manager import NULL_BLOCK, BlockManager
from worker.engine.params import SamplingParams
from worker.engine.scheduler import Scheduler, SchedulerConfig, SchedulerOutput
from worker.engine.sequence import Sequence, SequenceStatus

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


def test_running_first_then_waiting_within_the_token_budget() -> None:
    s = _scheduler(budget=10)
    s.add(_seq("a", 3))
    assert _plan(_step(s)) == {"a": 3}
    s.add(_seq("b", 20))
    # a decodes (1 token), b gets the rest of the budget as a prompt chunk
    assert _plan(_step(s)) == {"a": 1, "b": 9}
    assert _plan(_step(s)) == {"a": 1, "b": 9}
    out, sampled = _step_sampled(s)
    assert _plan(out) == {"a": 1, "b": 2}  # b's last chunk: it samples its first token
    assert sampled == ["a", "b"]
    assert _plan(_step(s)) == {"a": 1, "b": 1}


def test_max_num_seqs_caps_the_running_set() -> None:
    s = _scheduler(budget=100, max_num_seqs=2)
    for name in "abc":
        s.add(_seq(name, 3))
    assert _plan(_step(s)) == {"a": 3, "b": 3}
    assert [q.request_id for q in s.waiting] == ["c"]
    s.finish(s.running[0])
    assert _plan(_step(s)) == {"b": 1, "c": 3}


def test_without_chunked_prefill_a_prompt_waits_for_a_whole_step() -> None:
    s = _scheduler(budget=10, chunked=False)
    s.add(_seq("a", 4))
    s.add(_seq("long", 12))
    s.add(_seq("short", 2))
    # "long" does not fit the budget and nothing overtakes it
    assert _plan(_step(s)) == {"a": 4}
    assert _plan(_step(s)) == {"a": 1}
    assert [q.request_id for q in s.waiting] == ["long", "short"]


def test_priority_classes_then_first_come_first_served() -> None:
    s = _scheduler(budget=100, max_num_seqs=3)
    s.add(_seq("batch-early", 2, priority=6, arrival=0.0))
    s.add(_seq("async", 2, priority=3, arrival=1.0))
    s.add(_seq("sync-late", 2, priority=0, arrival=3.0))
    s.add(_seq("sync-early", 2, priority=0, arrival=2.0))
    out = _step(s)
    assert [x.seq.request_id for x in out.scheduled] == ["sync-early", "sync-late", "async"]
    assert [q.request_id for q in s.waiting] == ["batch-early"]


def test_preemption_takes_the_lowest_class_latest_arrival_and_admits_nothing() -> None:
    # 6 blocks of 4 tokens; three sequences of 8 tokens hold all of them after their prompt
    s = _scheduler(num_blocks=6, budget=100)
    s.add(_seq("sync-old", 7, priority=0, arrival=0.0))
    s.add(_seq("async", 7, priority=3, arrival=1.0))
    s.add(_seq("sync-new", 7, priority=0, arrival=2.0))
    _step(s)  # prompts: 7 tokens each, 2 blocks each, all blocks used
    assert s.block_manager.num_free_blocks == 0
    # of the worst class: it preempts nobody (see the priority-preemption tests)
    s.add(_seq("waiting", 1, priority=6, arrival=3.0))
    # decode: each needs token 8 (fits in block 2), then token 9 needs a third block
    _step(s)
    out = _step(s)
    # sync-old needs a block: the async one is preempted (lowest class), then sync-old and
    # sync-new fit again; nothing is admitted in a step that preempted
    assert [q.request_id for q in out.preempted] == ["async"]
    assert _plan(out) == {"sync-old": 1, "sync-new": 1}
    assert [q.request_id for q in s.waiting] == ["async", "waiting"]
    preempted = out.preempted[0]
    assert preempted.status is SequenceStatus.WAITING
    assert preempted.num_computed_tokens == 0 and preempted.block_table == []
    assert preempted.num_tokens == 9  # its generated tokens are kept, to be recomputed
    assert s.num_preemptions == 1


def test_a_sequence_that_cannot_grow_preempts_later_ones_then_itself() -> None:
    s = _scheduler(num_blocks=4, budget=100)
    s.add(_seq("a", 8, arrival=0.0))
    s.add(_seq("b", 8, arrival=1.0))
    _step(s)  # 2 blocks each, cache full
    out = _step(s)  # each now needs a third block: b (later) goes, then a fits
    assert [q.request_id for q in out.preempted] == ["b"]
    assert _plan(out) == {"a": 1}
    # a single sequence larger than the cache preempts itself (the engine rejects such
    # requests up front; here the scheduler must still not loop)
    t = _scheduler(num_blocks=2, budget=100)
    t.add(_seq("big", 8))
    _step(t)
    out = _step(t)
    assert [q.request_id for q in out.preempted] == ["big"] and out.is_empty


def test_preempted_sequence_resumes_from_its_cached_blocks() -> None:
    s = _scheduler(num_blocks=6, budget=100, prefix=True)
    s.add(_seq("a", 8, arrival=0.0))
    s.add(_seq("b", 8, arrival=1.0))
    out = _step(s)
    while not out.preempted:  # decode until a and b hold 3 blocks each and want a fourth
        out = _step(s)
    (victim,) = out.preempted
    assert victim.request_id == "b"
    assert victim.num_tokens == 13  # 3 full blocks computed, the 13th token needed a 4th
    # a took the block it needed by evicting b's least useful cached block (its tail)
    s.finish(s.running[0])  # a leaves; b comes back and finds its first 2 blocks cached
    out = _step(s)
    assert _plan(out) == {"b": 13 - 8}
    assert s.block_manager.stats().hits >= 8


def test_finish_frees_blocks_at_once_running_or_waiting() -> None:
    s = _scheduler(num_blocks=8, budget=100, max_num_seqs=1)
    a, b = _seq("a", 9), _seq("b", 3)
    s.add(a)
    s.add(b)
    _step(s)
    assert a.status is SequenceStatus.RUNNING and s.block_manager.num_free_blocks == 5
    s.finish(a)
    assert a.status is SequenceStatus.FINISHED and s.block_manager.num_free_blocks == 8
    s.finish(b)  # still waiting
    assert not s.has_unfinished()
    s.finish(b)  # idempotent
    s.block_manager.check_invariants([])


# priority preemption ------------------------------------------------------------------------


def _running(s: Scheduler, *seqs: Sequence) -> None:
    """Admit ``seqs`` and compute their prompts (one step, beside what already runs),
    sampling a token each."""
    for seq in seqs:
        s.add(seq)
    out = _step(s)
    plan = _plan(out)
    assert all(plan.get(q.request_id) == q.num_prompt_tokens for q in seqs)


def _ids(seqs: list[Sequence] | tuple[Sequence, ...]) -> list[str]:
    return [q.request_id for q in seqs]


def test_a_better_class_preempts_the_fewest_worse_ones_worst_class_latest_first() -> None:
    # 10 blocks; five sequences of 7 prompt tokens hold 2 blocks each: the cache is full
    s = _scheduler(num_blocks=10, budget=100)
    _running(
        s,
        _seq("sync", 7, priority=0, arrival=0.0),
        _seq("async-old", 7, priority=1, arrival=1.0),
        _seq("async-new", 7, priority=1, arrival=2.0),
        _seq("batch-old", 7, priority=2, arrival=0.5),
        _seq("batch-new", 7, priority=2, arrival=3.0),
    )
    assert s.block_manager.num_free_blocks == 0
    # 9 tokens: 3 blocks; one batch sequence (2 blocks) is not enough, two are
    s.add(_seq("late-sync", 9, priority=0, arrival=4.0))
    out = _step(s)
    assert _ids(out.preempted) == ["batch-new", "batch-old"]
    # the better class is planned before the worse ones; the async ones keep running
    assert _plan(out) == {"sync": 1, "late-sync": 9, "async-old": 1, "async-new": 1}
    assert [x.seq.request_id for x in out.scheduled][:2] == ["sync", "late-sync"]
    assert _ids(s.waiting) == ["batch-old", "batch-new"]
    for victim in out.preempted:
        assert victim.status is SequenceStatus.WAITING and victim.block_table == []
        assert victim.num_tokens == 8  # its sampled token is kept, to be recomputed
    assert s.num_preemptions == 2
    # a later better-class arrival takes the next worse class, the latest first
    s.add(_seq("sync-3", 3, priority=0, arrival=5.0))
    out = _step(s)
    assert _ids(out.preempted) == ["async-new"]
    assert "sync-3" in _plan(out)


def test_no_preemption_for_an_equal_class_nor_by_a_worse_one() -> None:
    s = _scheduler(num_blocks=4, budget=100)
    # 5 prompt tokens: 2 blocks each, room for 3 more tokens each
    _running(s, _seq("async-a", 5, priority=1), _seq("async-b", 5, priority=1, arrival=1.0))
    s.add(_seq("async-c", 3, priority=1, arrival=0.5))  # earlier than b, same class
    s.add(_seq("batch", 3, priority=2, arrival=0.0))
    for _ in range(2):
        out = _step(s)
        assert out.preempted == () and _plan(out) == {"async-a": 1, "async-b": 1}
    assert _ids(s.waiting) == ["async-c", "batch"]


def test_no_preemption_when_all_worse_ones_would_not_make_room() -> None:
    s = _scheduler(num_blocks=8, budget=100)
    _running(s, _seq("sync", 20, priority=0), _seq("batch", 7, priority=2, arrival=1.0))
    assert s.block_manager.num_free_blocks == 1
    # 13 tokens need 4 blocks; preempting batch frees only 2 (+1 free): keep it running
    s.add(_seq("big-sync", 13, priority=0, arrival=2.0))
    s.add(_seq("small-sync", 2, priority=0, arrival=3.0))  # fits, but does not overtake
    out = _step(s)
    assert out.preempted == ()
    assert _plan(out) == {"sync": 1, "batch": 1}
    assert s.num_preemptions == 0


def test_a_better_class_preempts_for_a_slot() -> None:
    s = _scheduler(num_blocks=64, budget=100, max_num_seqs=2)
    _running(s, _seq("sync", 3, priority=0), _seq("batch", 3, priority=2, arrival=1.0))
    s.add(_seq("async", 3, priority=1, arrival=2.0))
    out = _step(s)
    assert _ids(out.preempted) == ["batch"]  # plenty of blocks: one slot is all it needs
    assert _plan(out) == {"sync": 1, "async": 3}
    assert _ids(s.running) == ["sync", "async"]
    # the victim comes back when a slot frees, from its kept tokens
    s.finish(s.running[0])
    out = _step(s)
    assert _plan(out) == {"async": 1, "batch": 4}


def test_a_better_class_gets_the_budget_before_worse_running_ones() -> None:
    # four batch sequences decoding use the whole budget of 4 tokens every step
    s = _scheduler(num_blocks=64, budget=4, max_num_seqs=8)
    for i in range(4):
        s.add(_seq(f"batch-{i}", 1, priority=2, arrival=float(i)))
    _step(s)
    assert _plan(_step(s)) == {f"batch-{i}": 1 for i in range(4)}
    # a sync request gets in at the next step, ahead of the worse class's decodes; nothing
    # is preempted for budget
    s.add(_seq("sync", 3, priority=0, arrival=9.0))
    out = _step(s)
    assert _plan(out) == {"sync": 3, "batch-0": 1}
    assert out.preempted == ()
    # a worse-class prompt using every step's whole budget in chunks does not hold it back
    t = _scheduler(num_blocks=64, budget=4)
    t.add(_seq("batch-long", 40, priority=2))
    assert _plan(_step(t)) == {"batch-long": 4}
    t.add(_seq("sync", 6, priority=0, arrival=1.0))
    assert _plan(_step(t)) == {"sync": 4}
    assert _plan(_step(t)) == {"sync": 2, "batch-long": 2}


def test_without_chunked_prefill_a_better_class_waits_for_budget_without_preempting() -> None:
    s = _scheduler(num_blocks=64, budget=8, max_num_seqs=8, chunked=False)
    _running(s, *(_seq(f"sync-{i}", 1, priority=0, arrival=float(i)) for i in range(4)))
    _running(s, _seq("batch", 1, priority=2, arrival=9.0))
    # 4 sync decodes leave 4 tokens: a 6-token async prompt must wait; batch is not preempted
    s.add(_seq("async", 6, priority=1, arrival=10.0))
    out = _step(s)
    assert out.preempted == ()
    assert _plan(out) == {**{f"sync-{i}": 1 for i in range(4)}, "batch": 1}


def test_victims_never_come_back_in_the_step_that_preempted_them() -> None:
    s = _scheduler(num_blocks=6, budget=100)
    _running(s, _seq("batch-a", 7, priority=2), _seq("batch-b", 7, priority=2, arrival=1.0))
    # sync needs 3 blocks, 2 are free: preempting batch-b frees 2, one more than needed
    s.add(_seq("sync", 9, priority=0, arrival=2.0))
    s.add(_seq("batch-c", 1, priority=2, arrival=0.5))  # would fit in the block left over
    out = _step(s)
    assert _ids(out.preempted) == ["batch-b"]
    assert _plan(out) == {"sync": 9, "batch-a": 1}
    # nothing of the victim's class is admitted in the step that preempted it
    assert s.block_manager.num_free_blocks == 1
    assert _ids(s.waiting) == ["batch-c", "batch-b"]


# sliding window --------------------------------------------------------------------------------


def test_a_sliding_window_sequence_holds_a_bounded_number_of_blocks() -> None:
    # window 8: a sequence holds at most 8 / 4 + 2 blocks, however long it gets
    s = Scheduler(
        SchedulerConfig(max_num_seqs=1, max_num_batched_tokens=100),
        BlockManager(num_blocks=16, block_size=BS, enable_prefix_caching=True, sliding_window=8),
    )
    a = _seq("a", 6, priority=2, max_tokens=200)
    s.add(a)
    for _ in range(80):  # 86 tokens: 22 blocks on a cache of 16
        _step(s)
        assert _num_held(a) <= 4
    assert a.num_tokens == 86 and a.block_table.count(NULL_BLOCK) == 19
    # preempted for a slot, it comes back from the blocks inside its window, still cached
    s.add(_seq("sync", 3, priority=0))
    out = _step(s)
    assert _ids(out.preempted) == ["a"] and _plan(out) == {"sync": 3}
    s.finish(s.running[0])
    out = _step(s)
    assert _plan(out) == {"a": 86 - 85 // BS * BS}  # hits: every full block but the last
    assert a.block_table[0] == NULL_BLOCK and _num_held(a) <= 4
    # its first blocks were evicted long ago: a lookup needing the whole chain would miss
    assert s.block_manager.stats().evictions > 0


def test_scheduler_and_block_manager_import_no_torch() -> None:
    code = (
        "import sys\n"
        "import worker.engine.scheduler, worker.engine.block_manager, worker.engine.llm_engine\n"
        "heavy = sorted(m for m in ('torch', 'numpy', 'triton') if m in sys.modules)\n"
        "assert not heavy, heavy\n"
    )
    root = Path(__file__).resolve().parents[2]
    subprocess.run([sys.executable, "-c", code], check=True, cwd=root, timeout=60)


# trace replay -----------------------------------------------------------------------------

# The shared traces sit beside the checkout (CI has them); a bare clone elsewhere does not.
needs_traces = pytest.mark.skipif(
    not (WORKLOADS / "azure_llm_2023_conv.csv").exists(),
    reason=f"workload traces not found in {WORKLOADS} (set PLATFORM_WORKLOADS_DIR)",
)


def _num_held(seq: Sequence) -> int:
    return sum(b != NULL_BLOCK for b in seq.block_table)


def _azure_requests(n: int) -> list[tuple[float, list[int], int]]:
    rng = random.Random(0)
    out = []
    for r in read_trace(WORKLOADS / "azure_llm_2023_conv.csv", limit=n):
        prompt = [rng.randrange(1000) for _ in range(clip(r.prompt_tokens / 16, 1, 256))]
        out.append((r.arrival_s, prompt, clip(r.output_tokens / 8, 1, 64)))
    return out


def _mooncake_requests(n: int) -> list[tuple[float, list[int], int]]:
    """Prompts built from hash ids: requests sharing ids share prompt blocks."""
    out = []
    for r in read_trace(WORKLOADS / "mooncake_conversation.jsonl", limit=n):
        prompt = _prompt_from_hash_ids(r, block_tokens=8, max_tokens=256)
        out.append((r.arrival_s, prompt, clip(r.output_tokens / 16, 1, 64)))
    return out


def _prompt_from_hash_ids(r: TraceRequest, block_tokens: int, max_tokens: int) -> list[int]:
    tokens = [(h * 131 + j) % 50_000 for h in r.hash_ids for j in range(block_tokens)]
    return tokens[: max(1, min(max_tokens, len(tokens)))]


@needs_traces
@pytest.mark.parametrize(
    ("trace", "num_blocks", "prefix", "classes", "window"),
    [
        ("azure", 96, False, 1, None),
        ("azure", 48, True, 1, None),
        ("mooncake", 80, True, 1, None),
        ("azure", 48, True, 3, None),  # priority preemption
        ("mooncake", 64, True, 3, 24),  # and sliding-window freeing
    ],
)
def test_trace_replay_keeps_every_invariant(
    trace: str, num_blocks: int, prefix: bool, classes: int, window: int | None
) -> None:
    requests = _azure_requests(150) if trace == "azure" else _mooncake_requests(150)
    budget, max_num_seqs = 64, 16
    s = Scheduler(
        SchedulerConfig(max_num_seqs, budget),
        BlockManager(num_blocks, BS, enable_prefix_caching=prefix, sliding_window=window),
    )
    max_len = num_blocks * BS
    seqs: list[Sequence] = []
    rng = random.Random(1)
    for i, (arrival, prompt, num_out) in enumerate(requests):
        # what the engine validates: prompt + max_tokens fit in the cache
        prompt = prompt[: max_len - 1]
        num_out = max(1, min(num_out, max_len - len(prompt)))
        priority = rng.randrange(classes)
        params = SamplingParams(max_tokens=num_out)
        seqs.append(Sequence(f"r{i}", prompt, params, priority, arrival))
    # compress time: about 10 arrivals per simulated step of 20 ms
    pending = sorted(seqs, key=lambda q: q.arrival_time)
    clock, steps, max_held = 0.0, 0, 0
    while pending or s.has_unfinished():
        while pending and pending[0].arrival_time * 0.01 <= clock:
            s.add(pending.pop(0))
        running_before = {id(q) for q in s.running}
        out = _step(s)
        max_held = max([max_held, *(_num_held(q) for q in s.running)])
        steps += 1
        assert steps < 20_000, "the replay does not make progress"
        assert len(s.running) <= max_num_seqs
        assert len({id(x.seq) for x in out.scheduled}) == len(out.scheduled)  # none twice
        if out.preempted:
            # admitted in a step that preempted: only a strictly better class than the victims
            worst_kept = min(q.priority for q in out.preempted)
            admitted = [x.seq for x in out.scheduled if id(x.seq) not in running_before]
            assert all(q.priority < worst_kept for q in admitted), "admitted"
            assert not {id(q) for q in out.preempted} & {id(x.seq) for x in out.scheduled}
        for x in out.scheduled:
            seq = x.seq
            if seq.num_output_tokens >= seq.params.max_tokens:
                s.finish(seq)
        clock += 0.02
    assert all(q.status is SequenceStatus.FINISHED for q in seqs)
    assert all(q.num_output_tokens == q.params.max_tokens for q in seqs)
    assert s.block_manager.num_free_blocks == num_blocks, "blocks leaked"
    if prefix and trace == "mooncake":
        # with a window, a running sequence's early blocks are free (evictable) early, and
        # far fewer preemptions mean far fewer re-admissions hitting their own blocks
        assert s.block_manager.stats().hit_rate > (0.1 if window is None else 0.02)
    if classes > 1:
        assert any(q.num_preemptions for q in seqs if q.priority == classes - 1)
    if window is not None:
        assert max_held <= -(-(window - 1 + budget) // BS) + 1
