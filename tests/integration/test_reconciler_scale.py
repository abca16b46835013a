"""The reconciler's tick reads state for all deployments in a few set-based queries: the number
of SQL statements of a steady tick does not grow with the number of deployments."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import redis
from sqlalchemy import event

from bench.reconciler_tick import RecordingProvider, populate
from control_plane.db.session import make_engine, make_sessionmaker
from control_plane.reconcile.driver import Reconciler
from control_plane.reconcile.env import Env
from control_plane.services.dispatch import make_celery
from control_plane.settings import Settings


def test_a_steady_tick_costs_the_same_statements_for_5_or_40_deployments(
    database_url: str, redis_url: str
) -> None:
    now = datetime.now(UTC)
    r = redis.Redis.from_url(redis_url)
    settings = Settings(database_url=database_url, redis_url=redis_url, warm_pool_max=0)
    engine = make_engine(database_url)
    seen: list[str] = []

    @event.listens_for(engine, "before_cursor_execute")
    def _count(_conn: Any, _cur: Any, statement: str, *_args: Any) -> None:
        seen.append(statement)

    provider = RecordingProvider()
    loop = Reconciler(
        Env(settings, r, make_celery(settings), provider),  # type: ignore[arg-type]
        make_sessionmaker(engine),
    )
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
    engine.dispose()
    # each deployment gets its 2 workers on the tick after its jobs appear (an insert each);
    # the ticks after that only look, and look at all deployments at once
    assert len(provider.started) == 2 * 40
    assert small[1:] == large[1:] == [small[2]] * 2, (small, large)
    assert small[2] < 60, small
