"""Read-only SQL queries the fault scenarios make on the platform's database: running jobs and
their worker's pid, completions after an instant, workers' ends and the final statuses."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from datetime import datetime

from sqlalchemy import func, select

from control_plane.db.models import BillingRecord, Deployment, Job, JobAttempt, Worker
from control_plane.db.session import make_engine, make_sessionmaker
from tests.faults.invariants import TERMINAL_STATUSES


class Ledger:
    """Read-only SQL queries on the platform's database (platform.json → database_url)."""

    def __init__(self, database_url: str) -> None:
        self._engine = make_engine(database_url)
        self._sessions = make_sessionmaker(self._engine)

    def close(self) -> None:
        self._engine.dispose()

    def unfinished(self, ids: Sequence[str]) -> int:
        if not ids:
            return 0
        with self._sessions() as s:
            n = s.scalar(
                select(func.count())
                .select_from(Job)
                .where(Job.id.in_(ids), Job.status.not_in(TERMINAL_STATUSES))
            )
        return int(n or 0)

    def finished(self, deployment: str) -> int:
        with self._sessions() as s:
            n = s.scalar(
                select(func.count())
                .select_from(Job)
                .where(Job.deployment_name == deployment, Job.status.in_(TERMINAL_STATUSES))
            )
        return int(n or 0)

    def running(self, deployment: str) -> list[tuple[str, int, str, int]]:
        """(job id, attempt, worker id, worker pid) of the deployment's running jobs."""
        with self._sessions() as s:
            rows = s.execute(
                select(Job.id, Job.attempt, Worker.id, Worker.pid)
                .join(Worker, Worker.id == Job.worker_id)
                .where(Job.deployment_name == deployment, Job.status == "running")
            ).all()
        return [(j, a, w, pid) for j, a, w, pid in rows if pid]

    def unfinished_of(self, deployment: str) -> list[tuple[str, str, str]]:
        """(job id, deployment id, kind) of the deployment's jobs not ended yet."""
        with self._sessions() as s:
            rows = s.execute(
                select(Job.id, Job.deployment_id, Job.kind).where(
                    Job.deployment_name == deployment, Job.status.not_in(TERMINAL_STATUSES)
                )
            ).all()
        return [(j, d, k) for j, d, k in rows]

    def jobs_since(self, deployment: str, t: datetime) -> list[tuple[str, str | None, str]]:
        """(job id, idempotency key, status) of the deployment's jobs created after `t`."""
        with self._sessions() as s:
            rows = s.execute(
                select(Job.id, Job.idempotency_key, Job.status).where(
                    Job.deployment_name == deployment, Job.created_at > t
                )
            ).all()
        return [(j, key, status) for j, key, status in rows]

    def workers(self, deployment: str) -> list[tuple[str, str, int | None]]:
        """(worker id, state, pid) of every worker the deployment ever had, ended ones too."""
        with self._sessions() as s:
            rows = s.execute(
                select(Worker.id, Worker.state, Worker.pid)
                .join(Deployment, Deployment.id == Worker.deployment_id)
                .where(Deployment.name == deployment)
            ).all()
        return [(w, state, pid) for w, state, pid in rows]

    def has_worker(self, worker_id: str) -> bool:
        with self._sessions() as s:
            return s.get(Worker, worker_id) is not None

    def last_phase(self, worker_id: str) -> tuple[str, str | None, str | None]:
        """(state, reason, phase of its newest billing record or None) of one worker."""
        with self._sessions() as s:
            state, reason = s.execute(
                select(Worker.state, Worker.reason).where(Worker.id == worker_id)
            ).one()
            phase = s.scalar(
                select(BillingRecord.phase)
                .where(BillingRecord.worker_id == worker_id)
                .order_by(BillingRecord.start.desc())
                .limit(1)
            )
        return state, reason, phase

    def worker_failures(self, deployment: str | None = None) -> list[tuple[str, str | None]]:
        """(worker id, reason) of every worker that ended `failed` (of `deployment`'s, when
        given: the scenarios share one platform)."""
        q = select(Worker.id, Worker.reason).where(Worker.state == "failed")
        if deployment is not None:
            q = q.join(Deployment, Deployment.id == Worker.deployment_id).where(
                Deployment.name == deployment
            )
        with self._sessions() as s:
            return [(w, reason) for w, reason in s.execute(q).all()]

    def first_success_after(self, deployment: str, t: datetime) -> datetime | None:
        """When the deployment's first job *started* after `t` succeeded (None: none yet).

        A job already running at `t` may finish without the part that broke (a report needs
        no Redis): only work picked up after the fault shows the service is back.
        """
        with self._sessions() as s:
            return s.scalar(
                select(func.min(Job.completed_at))
                .join(
                    JobAttempt, (JobAttempt.job_id == Job.id) & (JobAttempt.attempt == Job.attempt)
                )
                .where(
                    Job.deployment_name == deployment,
                    Job.status == "succeeded",
                    JobAttempt.started_at > t,
                )
            )

    def statuses(self, ids: Sequence[str]) -> Counter[str]:
        out: Counter[str] = Counter()
        with self._sessions() as s:
            for i in range(0, len(ids), 500):
                chunk = ids[i : i + 500]
                out.update(s.scalars(select(Job.status).where(Job.id.in_(chunk))))
        return out

    def prompts_since(self, deployment: str, t: datetime) -> dict[str, str]:
        """prompt → job id of the deployment's jobs created after `t` (callers that cannot name
        their job before it answers are told apart by their prompts)."""
        with self._sessions() as s:
            rows = s.execute(
                select(Job.id, Job.input).where(
                    Job.deployment_name == deployment, Job.created_at > t
                )
            ).all()
        return {str((doc or {}).get("prompt")): job_id for job_id, doc in rows}

    def job(self, job_id: str) -> tuple[str, str | None]:
        """(status, output text) of a job."""
        with self._sessions() as s:
            status, output = s.execute(select(Job.status, Job.output).where(Job.id == job_id)).one()
        return status, (output or {}).get("text")
