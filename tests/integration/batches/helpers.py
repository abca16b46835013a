"""What the batch tests share: direct reads of the test database and the loop's `pump` (`Db`),
finishing a job through the internal endpoints as a worker would (no model), and creating a
batch through the API."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from fastapi.testclient import TestClient
from sqlalchemy import select

from control_plane.db.models import Job
from control_plane.db.session import make_engine, make_sessionmaker
from control_plane.reconcile import batches as batch_reconciler
from control_plane.reconcile.env import Env as ReconcileEnv
from control_plane.services.jobs.dispatch import make_celery
from control_plane.settings import Settings
from tests.integration.api_helpers import WORKER, h

RESULTS_BUCKET = "results-test"


class Db:
    """Direct reads of the test database, and the loop's pump."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.engine = make_engine(settings.database_url)
        self.sessions = make_sessionmaker(self.engine)
        self.celery = make_celery(settings)

    def jobs(self, batch_id: str) -> list[Job]:
        with self.sessions() as s:
            q = select(Job).where(Job.batch_id == batch_id).order_by(Job.batch_index)
            return list(s.scalars(q))

    def count(self, model: type[Any]) -> int:
        with self.sessions() as s:
            return len(list(s.scalars(select(model))))

    def pump(self, redis_client: Any) -> None:
        with self.sessions() as s:
            env = ReconcileEnv(self.settings, redis_client, self.celery, None)  # type: ignore[arg-type]
            batch_reconciler.pump(s, env, datetime.now(UTC))


def finish(client: TestClient, job_id: str, text: str, status: str = "succeeded") -> None:
    r = client.post(f"/internal/jobs/{job_id}/claim", json={"worker_id": "w1"}, headers=WORKER)
    assert r.status_code == 200, r.text
    body: dict[str, Any] = {"worker_id": "w1", "attempt": r.json()["attempt"], "status": status}
    if status == "succeeded":
        body["output"] = {"text": text, "finish_reason": "stop"}
    else:
        body["error"] = {"type": "model_error", "message": text}
    r = client.post(f"/internal/jobs/{job_id}/complete", json=body, headers=WORKER)
    assert r.status_code == 200, r.text


def create(client: TestClient, key: str, body: dict[str, Any], **headers: str) -> Any:
    return client.post("/v1/batches", json={"deployment": "demo", **body}, headers=h(key) | headers)
