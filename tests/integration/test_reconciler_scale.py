"""The reconciler's tick reads state for all deployments in a few set-based queries: the number
of SQL statements of a steady tick does not grow with the number of deployments."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import redis
from sqlalchemy import Engine, event

from bench.reconciler_tick import RecordingProvider, populate
from control_plane.db.session import make_engine, make_sessionmaker
from control_plane.domain.clock import iso
from control_plane.reconcile.driver import Reconciler
from control_plane.reconcile.env import Env
from control_plane.services.jobs.dispatch import make_celery
from control_plane.services.scaling import scale_decisions
from control_plane.settings import Settings


@dataclass
class Counted:
    """A reconciler on the real Redis and database, with every SQL statement it sends kept
    (whitespace folded) in `seen`."""

    loop: Reconciler
    provider: RecordingProvider
    redis: redis.Redis
    engine: Engine
    seen: list[str] = field(default_factory=list)


@pytest.fixture
def counted(database_url: str, redis_url: str) -> Iterator[Counted]:
    r = redis.Redis.from_url(redis_url)
    settings = Settings(database_url=database_url, redis_url=redis_url, warm_pool_max=0)
    engine = make_engine(database_url)
    provider = RecordingProvider()
    loop = Reconciler(
        Env(settings, r, make_celery(settings), provider),  # type: ignore[arg-type]
        make_sessionmaker(engine),
    )
    c = Counted(loop, provider, r, engine)

    @event.listens_for(engine, "before_cursor_execute")
    def _count(_conn: Any, _cur: Any, statement: str, *_args: Any) -> None:
        c.seen.append(" ".join(statement.split()))

    yield c
    engine.dispose()
    r.close()


def test_a_steady_tick_costs_the_same_statements_for_5_or_40_deployments(
    database_url: str, counted: Counted
) -> None:
    now = datetime.now(UTC)
    loop, provider, seen = counted.loop, counted.provider, counted.seen
    clock = iter(now + timedelta(seconds=1 + i) for i in range(10))

    def ticks(n: int) -> list[int]:
        counts = []
        for _ in range(n):
            seen.clear()
            loop.tick(next(clock))
            counts.append(len(seen))
        return counts

    populate(database_url, 5, 15, now)
    small = ticks(3)
    populate(database_url, 35, 105, now, first=5)
    large = ticks(3)
    # each deployment gets its 2 workers on the tick after its jobs appear (an insert each);
    # the ticks after that only look, and look at all deployments at once
    assert len(provider.started) == 2 * 40
    assert small[1:] == large[1:] == [small[2]] * 2, (small, large)
    assert small[2] < 60, small


def test_a_steady_tick_reads_deployments_and_workers_once_and_rewrites_no_decision(
    database_url: str, counted: Counted
) -> None:
    """Every step of a tick shares one read of the live deployments and one of the live
    workers (`db.kept`); an unchanged decision is written again only after REWRITE_S."""
    now = datetime.now(UTC)
    loop, r, seen = counted.loop, counted.redis, counted.seen
    populate(database_url, 3, 9, now)

    def decided_at() -> set[str]:
        docs = scale_decisions.latest(r, [f"dep_{i:06d}" for i in range(3)])
        return {doc["decided_at"] for doc in docs.values()}

    for i in range(3):
        seen.clear()
        loop.tick(now + timedelta(seconds=1 + i))
    live_deployments = [
        s for s in seen if s.endswith("FROM deployments WHERE deployments.deleted_at IS NULL")
    ]
    live_workers = [s for s in seen if "FROM workers WHERE workers.state IN" in s]
    assert (len(live_deployments), len(live_workers)) == (1, 1), seen
    # tick 0 started the workers, tick 1 counted them, tick 2 decided the same: not written
    assert decided_at() == {iso(now + timedelta(seconds=2))}
    loop.tick(now + timedelta(seconds=2 + scale_decisions.REWRITE_S))
    assert decided_at() == {iso(now + timedelta(seconds=2 + scale_decisions.REWRITE_S))}
