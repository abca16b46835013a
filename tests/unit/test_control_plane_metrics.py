"""The pure parts of the control plane's metrics: job latencies from a job's own timestamps,
the state families from a snapshot, route templates; and observations that wait for their
transaction's commit (on a real SQLite session: savepoints, rollbacks, closes)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import create_engine
from sqlalchemy.orm import Session

from control_plane.api.request_log import UNMATCHED, route_of
from control_plane.db.models import Base, Tenant
from control_plane.metrics import families
from control_plane.metrics.families import job_times
from control_plane.metrics.on_commit import after_commit
from control_plane.metrics.snapshot import Fleet, Named, Snapshot
from control_plane.metrics.targets import LiveWorker, target_groups

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def at(s: float) -> datetime:
    return T0 + timedelta(seconds=s)


def test_job_times_come_from_its_timestamps_and_its_reported_timings() -> None:
    timings = {"ttft_s": 0.25, "itl_mean_s": 0.02}
    t = job_times(at(0), at(6.5), at(8), 1, "succeeded", {"timings": timings})
    assert (t.queue_s, t.e2e_s, t.ttft_s, t.mean_itl_s) == (6.5, 8.0, 6.75, 0.02)
    # a retried job: its first claim is not its last attempt's start
    assert job_times(at(0), at(1), at(9), 2, "succeeded", {"timings": timings}).ttft_s is None
    # expired before it ran: only its end
    t = job_times(at(0), None, at(30), 0, "expired", None)
    assert (t.queue_s, t.e2e_s, t.ttft_s, t.mean_itl_s) == (None, 30.0, None, None)
    # a failed job's output carries no timings to trust
    assert job_times(at(0), at(1), at(2), 1, "failed", {"timings": timings}).ttft_s is None
    # whatever a worker put there, only non-negative finite numbers count
    for bad in ("0.2", -1, float("nan"), float("inf"), True, None, [0.1]):
        t = job_times(at(0), at(1), at(2), 1, "succeeded", {"timings": {"ttft_s": bad}})
        assert t.ttft_s is None, bad
    assert job_times(at(0), at(1), at(2), 1, "succeeded", {"timings": "x"}).ttft_s is None
    # clocks of two processes: never a negative duration
    assert job_times(at(5), at(4), at(4), 1, "succeeded", None).queue_s == 0.0


def _parse(snapshot: Snapshot) -> list[tuple[str, dict[str, str], float]]:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(Fleet(lambda: snapshot))
    text = generate_latest(registry).decode()
    return [
        (s.name, dict(s.labels), s.value)
        for f in text_string_to_metric_families(text)
        for s in f.samples
    ]


def test_state_families_are_zero_filled_and_keyed_by_name_and_tenant() -> None:
    snap = Snapshot(
        deployments={
            "dep_1": Named("demo", "ten_a"),
            "dep_2": Named("demo", "ten_b"),  # the same name in another tenant
            "dep_old": Named("old", "ten_a"),  # deleted, a job still running
        },
        live=frozenset({"dep_1", "dep_2"}),
        active_jobs={("dep_1", "queued"): 3, ("dep_old", "running"): 1},
        workers={
            ("idle", "cpu", None): 2,
            ("idle", "cpu", "builtin"): 1,
            ("booting", "h100", "builtin"): 1,
            ("idle", "cpu", "vllm"): 2,
        },
        scaling={"dep_1": (2, 1)},
        decisions={"demand": 7},
        billing_issues=0,
    )
    m = _parse(snap)

    def get(name: str, **labels: str) -> list[float]:
        return [v for n, lb, v in m if n == name and lb == labels]

    assert get("platform_jobs_active", deployment="demo", tenant="ten_a", status="queued") == [3]
    assert get("platform_jobs_active", deployment="demo", tenant="ten_b", status="queued") == [0]
    assert get("platform_jobs_active", deployment="old", tenant="ten_a", status="running") == [1]
    assert get("platform_jobs_active", deployment="old", tenant="ten_a", status="queued") == []
    assert get("platform_workers", state="idle", accelerator="cpu") == [5]  # the pools' too
    assert get("platform_workers", state="busy", accelerator="cpu") == [0]
    assert get("platform_workers", state="booting", accelerator="h100") == [1]
    pool = "platform_warm_pool_workers"
    assert get(pool, state="idle", accelerator="cpu", engine="builtin") == [1]
    assert get(pool, state="idle", accelerator="cpu", engine="vllm") == [2]  # a pool per engine
    assert get(pool, state="booting", accelerator="cpu", engine="builtin") == [0]
    assert get(pool, state="booting", accelerator="h100", engine="vllm") == [0]
    assert get("platform_autoscaler_desired_workers", deployment="demo", tenant="ten_a") == [2]
    assert get("platform_autoscaler_actual_workers", deployment="demo", tenant="ten_a") == [1]
    assert get("platform_scale_decisions_total", reason="demand") == [7]
    assert get("platform_billing_drift_issues") == [0]
    # Redis unreadable: no decision counts, the rest still there
    m = _parse(Snapshot({}, frozenset(), {}, {}, {}, None, 2))
    assert not [n for n, _, _ in m if n.startswith("platform_scale_decisions")]
    assert [v for n, _, v in m if n == "platform_billing_drift_issues"] == [2]


def test_service_discovery_targets_only_valid_addresses() -> None:
    live = [
        LiveWorker("wrk_1", "demo", "ten_a", "cpu"),
        LiveWorker("wrk_2", None, "ten_platform", "cpu"),  # the warm pool's
        LiveWorker("wrk_3", "demo", "ten_a", "cpu"),
        LiveWorker("wrk_4", "demo", "ten_a", "cpu"),
    ]
    beats = [
        b'{"metrics": "127.0.0.1:9001"}',
        b'{"metrics": "[::1]:9002"}',
        b'{"metrics": "127.0.0.1:99999"}',
        b"not json",
    ]
    groups = target_groups(live, beats)
    assert [g["targets"] for g in groups] == [["127.0.0.1:9001"], ["[::1]:9002"]]
    assert groups[0]["labels"] == {
        "worker": "wrk_1",
        "deployment": "demo",
        "tenant": "ten_a",
        "accelerator": "cpu",
    }
    assert "deployment" not in groups[1]["labels"]
    assert target_groups(live[:1], [None]) == []


def test_the_route_label_is_the_template_never_the_path() -> None:
    class Route:
        path_format = "/v1/jobs/{job_id}"

    assert route_of({"route": Route(), "path": "/v1/jobs/job_123"}) == "/v1/jobs/{job_id}"
    assert route_of({"path": "/no/such/thing"}) == UNMATCHED


@pytest.fixture
def session() -> Iterator[Session]:
    engine = create_engine("sqlite://")
    Base.metadata.create_all(engine)
    with Session(engine) as s:
        yield s
    engine.dispose()


def _tenant(session: Session, name: str) -> None:
    session.add(Tenant(id=f"ten_{name}", name=name, webhook_secret="whsec_x"))
    session.flush()


def test_observations_run_after_the_outermost_commit_only(session: Session) -> None:
    seen: list[str] = []
    after_commit(session, lambda: seen.append("no transaction: at once"))
    assert seen == ["no transaction: at once"]
    seen.clear()

    _tenant(session, "a")
    after_commit(session, lambda: seen.append("root"))
    with session.begin_nested():
        _tenant(session, "b")
        after_commit(session, lambda: seen.append("released savepoint"))
    assert seen == [], "nothing before the commit"
    with pytest.raises(RuntimeError), session.begin_nested():
        _tenant(session, "c")
        after_commit(session, lambda: seen.append("rolled-back savepoint"))
        raise RuntimeError
    session.commit()
    assert seen == ["root", "released savepoint"]


def test_a_rollback_or_a_close_drops_what_was_staged(session: Session) -> None:
    seen: list[Any] = []
    _tenant(session, "a")
    with session.begin_nested():
        after_commit(session, lambda: seen.append("inside a savepoint"))
    after_commit(session, lambda: seen.append("outside"))
    session.rollback()
    session.commit()
    assert seen == []
    _tenant(session, "b")
    after_commit(session, lambda: seen.append("closed"))
    session.close()
    _tenant(session, "c")
    session.commit()
    assert seen == []


def test_a_failing_observation_never_fails_the_commit(session: Session) -> None:
    seen: list[str] = []
    _tenant(session, "a")
    after_commit(session, lambda: 1 / 0)  # type: ignore[arg-type]
    after_commit(session, lambda: seen.append("next"))
    session.commit()
    assert seen == ["next"]


@pytest.mark.parametrize(
    ("reason", "kind"),
    [
        (None, "unknown"),
        ("exit_-9", "exit"),
        ("boot_timeout", "boot_timeout"),
        ("heartbeat_lost", "heartbeat_lost"),
        ("image_pull: ErrImagePull: x", "image_pull"),
        ("unschedulable: no node can take it", "unschedulable"),
        ("RuntimeError: image_pull: nope", "exception"),
    ],
)
def test_failure_kinds_are_few(reason: str | None, kind: str) -> None:
    assert families.failure_kind(reason) == kind
