"""Pure fleet policies of the reconciler: drain of old versions, capacity, scale-down order,
liveness verdicts, retries after a lost worker, jobs a worker never received."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from common.protocol import WorkerState
from control_plane.domain import fleet
from control_plane.domain.fleet import Held, WorkerView, unheld

NOW = datetime(2026, 1, 1, tzinfo=UTC)
S = WorkerState


def w(id_: str, state: WorkerState, version: int = 2, reason: str | None = None) -> WorkerView:
    return WorkerView(id_, state, version, reason)


def test_old_versions_drain_once() -> None:
    workers = [
        w("old", S.IDLE, 1),
        w("old-asked", S.BUSY, 1, fleet.NEW_VERSION),
        w("old-draining", S.DRAINING, 1),
        w("new", S.IDLE, 2),
    ]
    assert [x.id for x in fleet.to_drain(workers, 2)] == ["old"]


def test_capacity_excludes_stopping_and_old_workers() -> None:
    workers = [
        w("a", S.IDLE),
        w("b", S.BOOTING),
        w("c", S.DRAINING),
        w("d", S.IDLE, 1),
        w("e", S.BUSY, reason=fleet.SCALE_DOWN),
    ]
    assert [x.id for x in fleet.capacity(workers, 2)] == ["a", "b"]


def test_scale_down_stops_idle_then_booting_then_busy() -> None:
    active = [w("busy", S.BUSY), w("boot", S.LOADING), w("idle1", S.IDLE), w("idle2", S.IDLE)]
    assert [x.id for x in fleet.scale_down_victims(active, 3)] == ["idle1"]
    assert [x.id for x in fleet.scale_down_victims(active, 1)] == ["idle1", "idle2", "boot"]
    assert [x.id for x in fleet.scale_down_victims(active, 0)][-1] == "busy"
    assert fleet.scale_down_victims(active, 4) == []
    assert fleet.scale_down_victims(active, 9) == []


def verdict(
    state: WorkerState, age_s: float, beat: bool, last_beat_s: float | None = None
) -> fleet.Liveness:
    started = NOW - timedelta(seconds=age_s)
    last = None if last_beat_s is None else NOW - timedelta(seconds=last_beat_s)
    return fleet.liveness(state, started, started, last, beat, 600.0, 20.0, NOW)


def test_liveness() -> None:
    assert verdict(S.IDLE, 5, beat=False).reason is None, "no heartbeat yet, within the grace"
    assert verdict(S.IDLE, 500, beat=True).reason is None
    lost = verdict(S.BUSY, 500, beat=False, last_beat_s=30)
    assert lost.reason == "heartbeat_lost"
    assert lost.ended_at == NOW - timedelta(seconds=30), "billed up to its last heartbeat"
    assert verdict(S.LOADING, 601, beat=True).reason == "boot_timeout"
    assert verdict(S.IDLE, 601, beat=True).reason is None, "max_boot_s only while booting"


def test_retries_after_a_lost_worker() -> None:
    assert [fleet.retries_left(a) for a in (1, 2, 3, 4)] == [True, True, False, False]


def test_a_job_its_worker_never_listed_is_lost_once_a_beat_grace_newer_misses_it() -> None:
    running = [("job_a", 1, "w1"), ("job_b", 1, "w1"), ("job_c", 2, "w2"), ("job_d", 1, "w3")]
    memory: dict[tuple[str, int], float] = {}
    # w1 holds job_b only; w2 holds job_c; w3 has no beat (no verdict without one)
    first = {"w1": Held(100.0, frozenset({"job_b"})), "w2": Held(50.0, frozenset({"job_c"}))}
    lost, memory = unheld(running, first, memory, 10.0)
    assert lost == [] and memory == {("job_a", 1): 100.0}
    # the same beat read again, or newer ones within the grace: still waiting
    for at in (100.0, 105.0, 109.9):
        lost, memory = unheld(running, {"w1": Held(at, frozenset({"job_b"}))}, memory, 10.0)
        assert lost == [] and memory == {("job_a", 1): 100.0}
    lost, memory = unheld(running, {"w1": Held(110.0, frozenset({"job_b"}))}, memory, 10.0)
    assert lost == [("job_a", 1)] and memory == {}


def test_a_job_its_worker_lists_later_was_received() -> None:
    running = [("job_a", 1, "w1")]
    lost, memory = unheld(running, {"w1": Held(100.0, frozenset())}, {}, 10.0)
    assert memory == {("job_a", 1): 100.0}
    lost, memory = unheld(running, {"w1": Held(101.0, frozenset({"job_a"}))}, memory, 10.0)
    assert lost == [] and memory == {}, "forgotten once listed"
    # a new attempt of the job starts its own wait
    lost, memory = unheld([("job_a", 2, "w1")], {"w1": Held(200.0, frozenset())}, memory, 10.0)
    assert lost == [] and memory == {("job_a", 2): 200.0}
