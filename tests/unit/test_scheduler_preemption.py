"""Priority preemption: a better class preempts the fewest worse sequences (worst class, latest
arrival first) for blocks, for a slot or for the token budget, never for an equal or worse
class, never when it would not make room, and its victims do not come back in the same step."""

from __future__ import annotations

from tests.unit.scheduler_steps import _ids, _plan, _scheduler, _seq, _step
from worker.engine.scheduler import Scheduler
from worker.engine.sequence import Sequence, SequenceStatus


def _running(s: Scheduler, *seqs: Sequence) -> None:
    """Admit ``seqs`` and compute their prompts (one step, beside what already runs),
    sampling a token each."""
    for seq in seqs:
        s.add(seq)
    out = _step(s)
    plan = _plan(out)
    assert all(plan.get(q.request_id) == q.num_prompt_tokens for q in seqs)


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
