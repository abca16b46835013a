"""The worker's start-up phase clock (worker/runtime/metrics.py): which phase each state report
ends and how long it took. Its /metrics served over HTTP and the heartbeat naming their address,
on a real Redis: tests/integration/test_worker_metrics.py."""

from __future__ import annotations

from common.protocol import WorkerState
from worker.runtime.metrics import PhaseClock


def test_the_phase_clock_times_each_start_up_phase_a_worker_completes() -> None:
    clock = PhaseClock(started_at=10.0)
    assert clock.enter(WorkerState.LOADING, 12.5) == ("boot", 2.5)
    assert clock.enter(WorkerState.LOADING, 13.0) is None  # a repeated report
    assert clock.enter(WorkerState.WARMING, 20.0) == ("load", 7.5)
    assert clock.enter(WorkerState.IDLE, 20.5) == ("warm", 0.5)
    assert clock.enter(WorkerState.BUSY, 21.0) is None  # serving is no start-up phase
    # a warm-pool worker: boot ends in the pool (idle), its load starts at its assignment
    pool = PhaseClock(started_at=0.0)
    assert pool.enter(WorkerState.IDLE, 3.0) == ("boot", 3.0)
    assert pool.enter(WorkerState.LOADING, 50.0) is None
    assert pool.enter(WorkerState.IDLE, 54.0) == ("load", 4.0)  # no warm-up: jobs waited
    # a phase that ends in failure is not a completed phase
    failed = PhaseClock(started_at=0.0)
    assert failed.enter(WorkerState.FAILED, 1.0) is None
