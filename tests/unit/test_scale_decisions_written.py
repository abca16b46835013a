"""Which decisions the reconciler writes: changed ones, and unchanged ones every REWRITE_S."""

from __future__ import annotations

from control_plane.services.scaling.scale_decisions import REWRITE_S, Written


def doc(at: str, **changes: object) -> dict[str, object]:
    return {"desired": 1, "actual": 1, "reason": "keepalive", "decided_at": at, **changes}


def test_only_changed_or_old_decisions_are_due() -> None:
    w = Written()
    first = [("a", doc("t0")), ("b", doc("t0"))]
    assert w.due(first, 100.0) == first  # never written
    w.wrote(first, 100.0)
    assert w.due([("a", doc("t1")), ("b", doc("t1"))], 101.0) == []  # only decided_at moved
    changed = [("a", doc("t2", actual=2)), ("b", doc("t2", placement={"choice": "boot"}))]
    assert w.due(changed, 102.0) == changed  # a value, and a field it did not have
    assert w.due([("a", {"desired": 1, "reason": "keepalive"})], 102.0) != []  # a field less
    w.wrote(changed[:1], 102.0)
    assert w.due([("a", doc("t3", actual=2))], 102.0 + REWRITE_S - 1) == []
    assert w.due([("a", doc("t4", actual=2))], 102.0 + REWRITE_S) != []  # its TTL to renew
