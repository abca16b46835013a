"""Property test: whatever order, duplication and timing a worker's phase reports arrive in,
its billing records never go negative, never overlap, tile its life without gaps, and a replay
of every report changes nothing."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta
from decimal import Decimal

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import select

from common.protocol import WorkerState
from control_plane.db.models import BillingRecord, Deployment, Tenant, Worker
from control_plane.db.session import make_engine, make_sessionmaker
from control_plane.domain.engine_choice import Choice
from control_plane.services import deployments
from control_plane.services.workers import billing, worker_records
from control_plane.settings import Settings

T0 = datetime(2026, 1, 1, tzinfo=UTC)
BUILTIN = Choice("builtin", "test")  # the engine a deployment made here resolved to
LIFE = [WorkerState.LOADING, WorkerState.WARMING, WorkerState.IDLE]
SERVE = [WorkerState.BUSY, WorkerState.IDLE]
END = [WorkerState.DRAINING, WorkerState.STOPPED]

reports = st.lists(st.integers(1, 4000), min_size=1, max_size=10).flatmap(
    lambda gaps: st.tuples(
        st.just(gaps),
        st.permutations(range(len(gaps) + 5)),  # delivery order
        st.lists(st.integers(0, len(gaps) + 4), max_size=6),  # duplicated deliveries
    )
)


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=reports)
def test_segments_tile_the_life_whatever_the_delivery(
    database_url: str, data: tuple[list[int], list[int], list[int]]
) -> None:
    gaps_ms, order, dups = data
    cfg = Settings(database_url=database_url)
    sessions = make_sessionmaker(make_engine(database_url))
    with sessions() as s:
        tenant = s.scalars(select(Tenant)).first()
        if tenant is None:
            tenant = Tenant(id="ten_p", name="p", webhook_secret="whsec_AAAA", created_at=T0)
            s.add(tenant)
            s.flush()
        dep = s.scalars(select(Deployment)).first() or deployments.create(
            s, tenant.id, {"name": "p", "model": "store://m/p/", "max_boot_s": 3600}, BUILTIN, T0
        )
        w = worker_records.create(s, dep, "cpu", "test", T0)
        s.commit()
        wid = w.id
    # The worker's true sequence of phases, with increasing times.
    states = LIFE + SERVE * ((len(gaps_ms) + 5 - len(LIFE) - len(END)) // 2 + 1)
    states = states[: len(gaps_ms) + 5 - len(END)] + END
    times = list(itertools.accumulate([1, *gaps_ms, *[1] * 10]))[: len(states)]
    events = [(st_, T0 + timedelta(milliseconds=t)) for st_, t in zip(states, times, strict=False)]
    now = T0 + timedelta(hours=1)
    delivered = [events[i] for i in order if i < len(events)] + [
        events[i] for i in dups if i < len(events)
    ]

    def deliver(batch: list[tuple[WorkerState, datetime]]) -> list[tuple[str, datetime, datetime]]:
        with sessions() as s:
            for state, at in batch:
                worker_records.transition(s, cfg, wid, state, at, now)
                s.commit()
            return [
                (r.phase, r.start, r.end)
                for r in s.scalars(
                    select(BillingRecord)
                    .where(BillingRecord.worker_id == wid)
                    .order_by(BillingRecord.start)
                )
            ]

    first = deliver(delivered)
    assert all(end > start for _, start, end in first), "no empty or negative segment"
    for (_, _, end), (_, start, _) in itertools.pairwise(first):
        assert start == end, "segments neither overlap nor leave gaps"
    if first:
        assert first[0][1] == T0, "billing starts when the worker started"
    with sessions() as s:
        now_w = s.get(Worker, wid)
        assert now_w is not None
        if now_w.state in ("stopped", "failed"):
            assert first and first[-1][2] == now_w.stopped_at, "records end when it ended"
        seconds = sum(
            r.seconds
            for r in s.scalars(select(BillingRecord).where(BillingRecord.worker_id == wid))
        )
        if first:
            span = (first[-1][2] - first[0][1]).total_seconds()
            assert abs(seconds - Decimal(str(span))) <= Decimal("0.001") * len(first)
    assert deliver(delivered) == first, "replaying every report changes nothing"


def test_a_report_read_before_another_transition_commits_leaves_no_gap(database_url: str) -> None:
    """The reconciler settles a busy worker idle while the worker's own report that it drains
    is in flight: the report, whose session had read the worker busy, still bills the idle time
    between the two (it once clashed with the busy segment and was dropped as a replay)."""
    cfg = Settings(database_url=database_url)
    sessions = make_sessionmaker(make_engine(database_url))
    at = [T0 + timedelta(seconds=s) for s in range(20)]
    with sessions() as s:
        tenant = Tenant(id="ten_r", name="r", webhook_secret="whsec_AAAA", created_at=T0)
        s.add(tenant)
        s.flush()
        dep = deployments.create(
            s, tenant.id, {"name": "r", "model": "store://m/r/", "max_boot_s": 3600}, BUILTIN, T0
        )
        wid = worker_records.create(s, dep, "cpu", "test", T0).id
        for state, t in ((WorkerState.LOADING, 1), (WorkerState.IDLE, 2), (WorkerState.BUSY, 3)):
            worker_records.transition(s, cfg, wid, state, at[t], at[19])
        s.commit()
    with sessions() as report, sessions() as tick:
        read = report.get(Worker, wid)  # held: the session reads it busy
        assert read is not None and read.state == WorkerState.BUSY
        worker_records.transition(tick, cfg, wid, WorkerState.IDLE, at[10], at[19])
        tick.commit()
        worker_records.transition(report, cfg, wid, WorkerState.DRAINING, at[12], at[19])
        report.commit()
    with sessions() as s:
        records = [
            (r.phase, r.start, r.end)
            for r in s.scalars(
                select(BillingRecord)
                .where(BillingRecord.worker_id == wid)
                .order_by(BillingRecord.start)
            )
        ]
        assert records[-2:] == [("busy", at[3], at[10]), ("idle", at[10], at[12])]
        assert billing.check(s, tenant.id, at[19]) == []
