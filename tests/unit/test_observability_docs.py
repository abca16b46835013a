"""docs/observability.md lists exactly the families the code exports (name and type), and the
Grafana dashboard (infra/grafana-dashboard.json) queries only those."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

from prometheus_client.metrics import MetricWrapperBase

from control_plane.metrics import families as events
from control_plane.metrics.snapshot import Named, Snapshot, families
from tests.unit.test_engine import _engine
from worker.runtime.metrics import WorkerMetrics

ROOT = Path(__file__).resolve().parents[2]
ROW = re.compile(r"^\| `(platform_[a-z0-9_]+)` \| (counter|gauge|histogram) \|", re.MULTILINE)


def documented() -> dict[str, str]:
    return dict(ROW.findall((ROOT / "docs/observability.md").read_text(encoding="utf-8")))


def _shown(name: str, kind: str) -> str:
    """The family's name as Prometheus shows it (counters end in _total)."""
    return f"{name}_total" if kind == "counter" and not name.endswith("_total") else name


def exported() -> dict[str, str]:
    out: dict[str, str] = {}
    for obj in vars(events).values():
        if isinstance(obj, MetricWrapperBase):
            out[_shown(obj._name, str(obj._type))] = str(obj._type)
    snap = Snapshot(
        {"d": Named("demo", "t")}, frozenset({"d"}), {}, {("idle", "cpu", "builtin"): 1},
        {"d": (1, 1)}, {"demand": 1}, 0,
    )  # fmt: skip
    for metric in families(snap):
        out[_shown(metric.name, str(metric.type))] = str(metric.type)
    worker = WorkerMetrics(started_at=time.monotonic())
    worker.engine, _ = _engine(lambda rid, i: 2)
    for metric in worker.registry.collect():
        if metric.name.startswith("platform_"):
            out[_shown(metric.name, str(metric.type))] = str(metric.type)
    return out


def test_the_docs_list_every_exported_family_with_its_type() -> None:
    assert documented() == exported()


def test_the_dashboard_queries_only_documented_families() -> None:
    dashboard = json.loads((ROOT / "infra/grafana-dashboard.json").read_text(encoding="utf-8"))
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    assert exprs
    known = documented()
    used = {
        re.sub(r"_(bucket|sum|count)$", "", name)
        for e in exprs
        for name in re.findall(r"platform_[a-z0-9_]+", e)
    }
    assert used <= set(known), used - set(known)
    # every panel has a unique id and sits on the grid
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    assert all(p["gridPos"]["x"] >= 0 and p["gridPos"]["x"] + p["gridPos"]["w"] <= 24
               for p in dashboard["panels"])  # fmt: skip
