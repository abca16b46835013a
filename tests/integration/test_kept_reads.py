"""`db.kept`: the rows a session reads once and reuses (the reconciler's live deployments and
workers), dropped when the session writes one of their class or rolls back; and a deployment's
spec parsed once per document."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from sqlalchemy import event
from sqlalchemy.orm import Session

from control_plane.db.models import Tenant
from control_plane.db.session import make_engine, make_sessionmaker
from control_plane.domain.engine_choice import Choice
from control_plane.services import deployments
from control_plane.services.workers import worker_records

NOW = datetime(2026, 1, 1, tzinfo=UTC)
BUILTIN = Choice("builtin", "test")  # the engine a deployment made here resolved to


@pytest.fixture
def session(database_url: str) -> Iterator[tuple[Session, list[str]]]:
    engine = make_engine(database_url)
    seen: list[str] = []

    @event.listens_for(engine, "before_cursor_execute")
    def _count(_conn: Any, _cur: Any, statement: str, *_args: Any) -> None:
        seen.append(statement)

    with make_sessionmaker(engine)() as s:
        s.add(Tenant(id="ten_k", name="k", webhook_secret="whsec_x", created_at=NOW))
        s.flush()
        for name in ("a", "b"):
            deployments.create(
                s, "ten_k", {"name": name, "model": f"store://m/{name}/"}, BUILTIN, NOW
            )
        s.commit()
        yield s, seen
    engine.dispose()


def _reads(seen: list[str], table: str) -> int:
    return sum(1 for s in seen if s.lstrip().startswith("SELECT") and f"FROM {table}" in s)


def test_the_live_deployments_are_read_once_per_session(
    session: tuple[Session, list[str]],
) -> None:
    s, seen = session
    seen.clear()
    first = deployments.list_live(s)
    again = deployments.list_live(s)
    assert sorted(d.name for d in first) == ["a", "b"]
    assert again == first and again is not first  # the same rows, a list of the caller's own
    assert _reads(seen, "deployments") == 1


def test_a_deployment_written_through_the_session_is_read_again(
    session: tuple[Session, list[str]],
) -> None:
    s, seen = session
    live = deployments.list_live(s)
    deployments.create(
        s, "ten_k", {"name": "c", "model": "store://m/c/"}, BUILTIN, NOW
    )  # not flushed
    assert sorted(d.name for d in deployments.list_live(s)) == ["a", "b", "c"]
    gone = next(d for d in live if d.name == "a")
    gone.deleted_at = NOW
    assert sorted(d.name for d in deployments.list_live(s)) == ["b", "c"]
    seen.clear()
    deployments.list_live(s)
    assert _reads(seen, "deployments") == 0


def test_a_rollback_drops_what_was_kept(session: tuple[Session, list[str]]) -> None:
    s, seen = session
    deployments.list_live(s)
    dep = deployments.list_live(s)[0]
    worker_records.create(s, dep, "cpu", "test", NOW)
    assert len(worker_records.live(s)) == 1  # a pending worker is flushed first, then read
    s.rollback()
    seen.clear()
    assert worker_records.live(s) == []
    assert len(deployments.list_live(s)) == 2
    assert _reads(seen, "deployments") == 1 and _reads(seen, "workers") == 1


def test_a_spec_is_parsed_once_per_document(session: tuple[Session, list[str]]) -> None:
    s, _ = session
    dep = deployments.get(s, "ten_k", "a")
    assert dep.spec is dep.spec
    assert dep.spec.max_workers == 1
    deployments.update(
        s, "ten_k", "a", {"name": "a", "model": "store://m/a/", "max_workers": 3}, None, NOW
    )
    assert dep.spec.max_workers == 3 and dep.version == 2
