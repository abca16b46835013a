"""The reconcilers' plans (`control_plane/domain/plans/`) as pure functions of what the tick
read: each returns the actions the actuator applies, and nothing else happens in them."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta

import pytest

from common.protocol import WorkerState
from control_plane.domain import endings, fleet
from control_plane.domain.crash_loop import BootHistory
from control_plane.domain.placement import BOOT, POOL, Estimates, PoolCandidate
from control_plane.domain.plans import actions as a
from control_plane.domain.plans.batches import BatchLoad, plan_batch
from control_plane.domain.plans.billing import MAX_SEGMENT_S, OpenSegment, plan_rolls
from control_plane.domain.plans.jobs import (
    HANDOFF_LOST,
    WORKER_LOST,
    plan_expiry,
    plan_redispatch,
    plan_take_back,
)
from control_plane.domain.plans.pool import (
    SHRINK,
    PoolWorker,
    growing_engines,
    plan_pool,
    wants_history,
)
from control_plane.domain.plans.scale import (
    DeploymentView,
    DeploymentWorker,
    plan_orphans,
    plan_scale,
    split,
)
from control_plane.domain.plans.workers import ExitedWorker, LiveWorker, plan_exits, plan_liveness
from control_plane.domain.pool import PoolTarget
from control_plane.domain.scaling import DeploymentState, ScalingPolicy, decide
from control_plane.domain.scaling.decide import gate
from tests.unit.scaling_states import state as decide_state

NOW = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)
T = NOW.timestamp()
POLICY = ScalingPolicy(min_workers=0, max_workers=8, target_concurrency=1, queue_wait_s=0)
DEP = DeploymentView("dep_1", "demo", 2)
EST = Estimates(boot_s=30.0, load_s=10.0, warm_s=1.0)
NO_FAILURES = BootHistory(0, None, None)


def ago(s: float) -> datetime:
    return NOW - timedelta(seconds=s)


# workers ----------------------------------------------------------------------------------------


def test_exits_are_recorded_for_the_workers_the_database_knows() -> None:
    """A clean exit ends its worker at the reap; a crash or a kill at its last sign of life:
    its last heartbeat, its current state's start or its latest job claim or report, whichever
    is latest (never after now)."""
    known = {
        "w1": ExitedWorker(ago(3), ago(60), None),
        "w2": ExitedWorker(ago(3), ago(60), ago(10)),
        "w3": ExitedWorker(ago(3), ago(1), None),
        "w4": ExitedWorker(None, ago(2), None),
        "w5": ExitedWorker(ago(3), ago(60), ago(0.5)),  # reported a job after its last beat
    }
    exited = [("w1", 0), ("w2", 137), ("w3", -9), ("w4", 1), ("w5", -9), ("gone", 1)]
    assert plan_exits(exited, known, NOW) == [
        a.RecordExit("w1", 0, NOW),
        a.RecordExit("w2", 137, ago(3)),
        a.RecordExit("w3", -9, ago(1)),
        a.RecordExit("w4", 1, ago(2)),
        a.RecordExit("w5", -9, ago(0.5)),
    ]
    # a pod that could not start: its reason replaces the bare exit code
    stuck = plan_exits([("w3", -9)], known, NOW, {"w3": "image_pull: ErrImagePull"})
    assert stuck == [a.RecordExit("w3", -9, ago(1), "image_pull: ErrImagePull")]


def test_a_silent_worker_is_lost_at_its_last_beat_and_a_beat_is_noted() -> None:
    alive = LiveWorker("w1", "dep_1", WorkerState.IDLE, ago(60), ago(60), ago(5), ago(1), 600.0)
    silent = LiveWorker("w2", "dep_1", WorkerState.BUSY, ago(60), ago(50), ago(30), None, 600.0)
    slow = LiveWorker("w3", None, WorkerState.BOOTING, ago(700), ago(700), None, ago(1), 600.0)
    actions = plan_liveness([alive, silent, slow], heartbeat_grace_s=20.0, now=NOW)
    assert a.NoteHeartbeat("w1", ago(1)) in actions
    assert a.LoseWorker("w2", "dep_1", "heartbeat_lost", ago(30)) in actions
    assert a.LoseWorker("w3", None, "boot_timeout", NOW) in actions
    assert not any(isinstance(x, a.LoseWorker) and x.worker_id == "w1" for x in actions)


def test_a_beat_from_a_clock_ahead_is_noted_as_now_and_never_goes_back() -> None:
    ahead = LiveWorker(
        "w1", None, WorkerState.IDLE, ago(60), ago(60), ago(5), NOW + timedelta(9), 1
    )
    behind = LiveWorker("w2", None, WorkerState.IDLE, ago(60), ago(60), ago(5), ago(30), 1)
    notes = [x for x in plan_liveness([ahead, behind], 20.0, NOW) if isinstance(x, a.NoteHeartbeat)]
    assert notes == [a.NoteHeartbeat("w1", NOW), a.NoteHeartbeat("w2", ago(5))]


# jobs -------------------------------------------------------------------------------------------


def test_a_lost_attempt_is_taken_back_until_the_job_is_out_of_attempts() -> None:
    lost = [("j1", 1, ago(3)), ("j2", fleet.MAX_ATTEMPTS, ago(4))]
    back, ended = plan_take_back(lost, WORKER_LOST)
    assert back == a.TakeBack("j1", 1, ago(3), WORKER_LOST)
    assert isinstance(ended, a.EndJobs) and ended.lost == (("j2", fleet.MAX_ATTEMPTS, ago(4)),)
    ((job_id, ending),) = ended.endings
    assert job_id == "j2" and ending.status == "failed" and ending.reason == WORKER_LOST
    assert ending.error is not None and f"{fleet.MAX_ATTEMPTS} times" in ending.error["message"]
    (handoff,) = plan_take_back([("j3", 1, NOW)], HANDOFF_LOST)
    assert handoff == a.TakeBack("j3", 1, NOW, HANDOFF_LOST)


def test_overdue_jobs_expire_and_overruns_time_out_in_one_ending() -> None:
    (ended,) = plan_expiry(["j1"], [("j2", 60.0)])
    assert ended.endings == (("j1", endings.expired()), ("j2", endings.timed_out(60.0)))
    assert plan_expiry([], []) == []


def test_wake_ups_are_sent_again_only_where_the_queue_is_empty() -> None:
    waiting = [("j1", "d1", "sync"), ("j2", "d2", "async")]
    assert plan_redispatch(waiting, {"d1": True, "d2": False}) == [a.Redispatch("j1", "d1", "sync")]


# scale ------------------------------------------------------------------------------------------


def worker(
    wid: str, state: WorkerState, version: int = 2, reason: str | None = None
) -> DeploymentWorker:
    return DeploymentWorker(wid, state, version, reason, T - 60)


def scale_state(**kw: object) -> DeploymentState:
    """A deployment called just now, one job per worker (`decide`'s tests' state otherwise)."""
    return decide_state(**{"policy": POLICY, "last_arrival_at": T, **kw})


def test_workers_of_an_old_version_drain_and_the_decision_starts_new_ones_from_the_pool() -> None:
    workers = split([worker("old", WorkerState.BUSY, version=1)], DEP.version)
    state = scale_state(queued=2)
    decision = decide(state, T)
    assert decision.start == 2
    pool = [PoolCandidate("p1"), PoolCandidate("p2", holds_model=True)]
    plan = plan_scale(DEP, workers, state, decision, NO_FAILURES, pool, EST, NOW)
    drain, first, second = plan.actions
    assert drain == a.StopWorker("old", DEP.id, fleet.NEW_VERSION)
    assert isinstance(first, a.StartWorker) and isinstance(second, a.StartWorker)
    # each pool worker at most once: the host holding the model first, then the other
    assert (first.placement.worker_id, second.placement.worker_id) == ("p2", "p1")
    assert second.placement.choice == POOL and plan.reports_cold_start


def test_a_deployment_over_several_accelerators_never_takes_a_pool_worker() -> None:
    """A pool worker holds one accelerator: a deployment whose workers need more (vLLM's tensor
    parallelism) boots its own, however fast the pool would be, and leaves the pool workers to
    others; one on vLLM with one accelerator takes them (the candidates are its engine's)."""
    state = scale_state(queued=2)
    decision = decide(state, T)
    pool = [PoolCandidate("p1", holds_model=True), PoolCandidate("p2")]
    split_over_2 = dataclasses.replace(DEP, engine="vllm", accelerator_count=2)
    plan = plan_scale(split_over_2, split([], 2), state, decision, NO_FAILURES, pool, EST, NOW)
    starts = [x for x in plan.actions if isinstance(x, a.StartWorker)]
    assert len(starts) == 2
    assert all(x.placement.choice == BOOT and x.placement.worker_id is None for x in starts)
    # on one accelerator, vLLM's or the built-in engine's, it takes them
    for engine in ("vllm", "builtin"):
        one = dataclasses.replace(DEP, engine=engine)
        taken = plan_scale(one, split([], 2), state, decision, NO_FAILURES, pool, EST, NOW)
        starts = [x for x in taken.actions if isinstance(x, a.StartWorker)]
        assert [x.placement.worker_id for x in starts] == ["p1", "p2"]


def test_without_pool_workers_a_start_boots() -> None:
    state = scale_state(queued=1)
    plan = plan_scale(DEP, split([], 2), state, decide(state, T), NO_FAILURES, [], EST, NOW)
    (start,) = plan.actions
    assert isinstance(start, a.StartWorker) and start.placement.choice == BOOT


def test_the_crash_loop_gate_holds_the_jobs_back_then_fails_them() -> None:
    state = scale_state(queued=1)
    decision = decide(state, T)
    backing_off = BootHistory(1, ago(0.5), "exit_1")
    plan = plan_scale(DEP, split([], 2), state, decision, backing_off, [], EST, NOW)
    assert plan.actions == [a.HoldWaiting(DEP.id, "crash_loop", announce=True)]
    assert (plan.decision.reason, plan.decision.desired) == ("crash_backoff", 0)
    given_up = BootHistory(3, ago(1), "exit_1")
    plan = plan_scale(DEP, split([], 2), state, decision, given_up, [], EST, NOW)
    (fail,) = plan.actions
    assert (
        isinstance(fail, a.FailWaiting)
        and "3 workers of deployment 'demo'" in fail.error["message"]
    )
    assert not plan.reports_cold_start


def test_more_workers_next_to_serving_ones_hold_the_jobs_without_a_cold_start_event() -> None:
    workers = split([worker("w1", WorkerState.BUSY)], 2)
    state = scale_state(queued=3, running=1, ready=1)
    decision = decide(state, T)
    plan = plan_scale(DEP, workers, state, decision, NO_FAILURES, [], EST, NOW)
    assert plan.actions[-1] == a.HoldWaiting(DEP.id, "no_capacity", announce=False)


def test_the_surplus_drains_idle_workers_first() -> None:
    workers = split([worker("busy", WorkerState.BUSY), worker("idle", WorkerState.IDLE)], 2)
    state = scale_state(running=1, ready=2, last_arrival_at=T - 3600)
    decision = decide(state, T)
    assert decision.desired < decision.capacity
    plan = plan_scale(DEP, workers, state, decision, None, [], EST, NOW)
    assert plan.actions == [a.StopWorker("idle", DEP.id, fleet.SCALE_DOWN)]


def test_the_gate_after_decide_is_decide_with_the_gate() -> None:
    """`gate` applied to an ungated decision is what `decide` gives with the gate's inputs:
    the reconciler reads the boot history only when workers would start, and decides once."""
    for queued in (0, 1, 5):
        for ready in (0, 1):
            s = scale_state(queued=queued, ready=ready)
            for allowed, give_up in ((False, False), (False, True), (True, True)):
                gated = dataclasses.replace(s, start_allowed=allowed, give_up=give_up)
                after = gate(
                    decide(s, T), start_allowed=allowed, give_up=give_up, work_present=queued > 0
                )
                assert after == decide(gated, T)


def test_workers_of_deleted_deployments_drain_once() -> None:
    workers = [
        ("w1", "gone", WorkerState.IDLE),
        ("w2", "gone", WorkerState.DRAINING),
        ("w3", "dep_1", WorkerState.IDLE),
    ]
    assert plan_orphans(workers, {"dep_1"}) == [
        a.StopWorker("w1", "gone", fleet.DEPLOYMENT_DELETED)
    ]


# pool, batches, billing ------------------------------------------------------------------------


def test_the_pool_grows_toward_its_target_and_shrinks_booting_workers_first() -> None:
    target = {("cpu", "builtin"): PoolTarget("cpu", "builtin", 2, 0.5, "expected")}
    assert wants_history(2, 0, cold_start_under_way=False)
    assert growing_engines(target, [], cold_start_under_way=False) == {"builtin"}
    grow = plan_pool(target, [], False, {"builtin": NO_FAILURES}, NOW)
    assert grow == [a.BootPoolWorker("cpu", "builtin", 2, "expected", 0.5)] * 2
    assert not wants_history(2, 0, cold_start_under_way=True)
    assert growing_engines(target, [], cold_start_under_way=True) == set()
    assert plan_pool(target, [], True, {}, NOW) == []
    pooled = [
        PoolWorker("idle", "cpu", WorkerState.IDLE),
        PoolWorker("boot", "cpu", WorkerState.BOOTING),
    ]
    assert plan_pool({}, pooled, False, {}, NOW) == [
        a.StopWorker("boot", None, SHRINK),
        a.StopWorker("idle", None, SHRINK),
    ]


def test_each_engine_has_its_pool_and_its_own_boot_history() -> None:
    """The pools of one type are one per engine: each grows toward its own target, counting
    only its own workers, and failed vLLM pool boots back off vLLM's pool alone."""
    targets = {
        ("cpu", "builtin"): PoolTarget("cpu", "builtin", 1, 0.2, "floor"),
        ("cpu", "vllm"): PoolTarget("cpu", "vllm", 2, 0.9, "covers_expected"),
    }
    # a built-in pool worker does not count toward vLLM's pool, nor the other way round
    pooled = [PoolWorker("b1", "cpu", WorkerState.IDLE, "builtin")]
    assert growing_engines(targets, pooled, cold_start_under_way=False) == {"vllm"}
    clean = {"vllm": NO_FAILURES}
    assert (
        plan_pool(targets, pooled, False, clean, NOW)
        == [a.BootPoolWorker("cpu", "vllm", 2, "covers_expected", 0.9)] * 2
    )
    # vLLM's pool boots failed just now: it waits out its backoff; the built-in one grows
    failed = BootHistory(3, NOW - timedelta(seconds=1), "exit_1")
    assert growing_engines(targets, [], cold_start_under_way=False) == {"builtin", "vllm"}
    history = {"builtin": NO_FAILURES, "vllm": failed}
    assert plan_pool(targets, [], False, history, NOW) == [
        a.BootPoolWorker("cpu", "builtin", 1, "floor", 0.2)
    ]
    # no vLLM deployment any more (or no vLLM on the platform): its pool workers drain
    vllm_pooled = [PoolWorker("v1", "cpu", WorkerState.IDLE, "vllm")]
    builtin_only = {("cpu", "builtin"): targets[("cpu", "builtin")]}
    assert plan_pool(builtin_only, vllm_pooled, False, {"builtin": NO_FAILURES}, NOW) == [
        a.BootPoolWorker("cpu", "builtin", 1, "floor", 0.2),
        a.StopWorker("v1", None, SHRINK),
    ]


def test_a_batch_is_topped_up_to_its_limit_and_completes_once_every_line_ended() -> None:
    assert plan_batch(BatchLoad("b", "d", 4, in_flight=1, waiting=10)) == [
        a.DispatchLines("b", "d", 3)
    ]
    assert plan_batch(BatchLoad("b", "d", 4, in_flight=2, waiting=1)) == [
        a.DispatchLines("b", "d", 1)
    ]
    assert plan_batch(BatchLoad("b", "d", 4, in_flight=4, waiting=1)) == []
    assert plan_batch(BatchLoad("b", "d", 4, in_flight=0, waiting=0)) == [a.CompleteBatch("b")]


@pytest.mark.parametrize(
    ("since_s", "beat_s", "rolled"),
    [
        (MAX_SEGMENT_S + 1, 1.0, True),  # a minute in one phase, beating: rolled at its beat
        (MAX_SEGMENT_S - 1, 1.0, False),  # not a minute yet
        (MAX_SEGMENT_S + 1, MAX_SEGMENT_S, False),  # silent since: not billed on trust
    ],
)
def test_an_open_segment_rolls_after_a_minute_up_to_the_last_sign_of_life(
    since_s: float, beat_s: float, rolled: bool
) -> None:
    seg = OpenSegment("w1", WorkerState.IDLE, False, ago(since_s), ago(beat_s))
    expected = [a.RollSegment("w1", "idle", ago(since_s), ago(beat_s))] if rolled else []
    assert plan_rolls([seg], NOW) == expected
