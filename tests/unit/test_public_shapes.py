"""The public shapes the services build (`to_public`, for the hot paths: no pydantic model per
answer) against the response models the API documents (`api/schemas.py`, the OpenAPI schema):
the same fields, and a document the model accepts and returns unchanged. A field added to one
and not the other fails here."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from pydantic import BaseModel

from common.job_input import JobInput
from control_plane.api.responses import JobPublic, JobUsage, KeyPublic, WorkerPublic
from control_plane.db.models import ApiKey, Job, Worker
from control_plane.services.jobs import job_store
from control_plane.services.tenants import api_keys
from control_plane.services.workers import worker_records

T0 = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)


def same_shape(model: type[BaseModel], doc: dict[str, Any], optional: set[str]) -> None:
    """`doc` has every field of `model` but the `optional` ones it may leave out (the routes add
    them), nothing else, and validates to itself."""
    fields = set(model.model_fields)
    assert set(doc) <= fields, f"not in {model.__name__}: {sorted(set(doc) - fields)}"
    assert fields - set(doc) <= optional, f"missing: {sorted(fields - set(doc) - optional)}"
    assert model.model_validate(doc).model_dump(include=set(doc), mode="json") == doc


def a_job(**change: Any) -> Job:
    job = Job(
        id="job_1",
        tenant_id="ten_1",
        deployment_id="dep_1",
        deployment_name="demo",
        deployment_version=2,
        kind="sync",
        status="succeeded",
        status_reason=None,
        input=JobInput("Hi", max_tokens=4).to_dict(),
        output={"text": "there", "finish_reason": "length"},
        error=None,
        attempt=1,
        webhook_url="https://example.com/hook",
        webhook_status="delivered",
        prompt_tokens=2,
        generated_tokens=4,
        created_at=T0,
        started_at=T0 + timedelta(seconds=1),
        completed_at=T0 + timedelta(seconds=3),
    )
    for key, value in change.items():
        setattr(job, key, value)
    return job


def test_a_job_as_the_services_build_it_is_the_documented_job() -> None:
    optional = {"queue_position", "eta_s", "cold_start"}  # added by GET /v1/jobs/{id}
    same_shape(JobPublic, job_store.to_public(a_job()), optional)
    waiting = a_job(status="queued", output=None, started_at=None, completed_at=None)
    same_shape(JobPublic, job_store.to_public(waiting), optional)
    same_shape(JobUsage, job_store.usage_of(a_job()), set())


def test_a_worker_and_a_key_as_the_services_build_them_are_the_documented_ones() -> None:
    worker = Worker(
        id="wrk_1",
        deployment_id="dep_1",
        deployment_version=2,
        state="idle",
        reason=None,
        accelerator="cpu",
        engine="vllm",
        started_at=T0,
        stopped_at=None,
    )
    same_shape(WorkerPublic, worker_records.to_public(worker, "demo"), set())
    key = ApiKey(id="key_1", prefix="abc", scopes="run read", name="ci", created_at=T0)
    same_shape(KeyPublic, dict(api_keys.key_public(key)), set())
