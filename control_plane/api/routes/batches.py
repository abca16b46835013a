"""/v1/batches: create from JSONL (inline lines, a list, or an s3:// object), read, list,
cancel, and results as JSONL.

Every line is validated before anything is written (batch_lines.py): one bad line is a 422
naming its line number and field, and no batch exists afterwards.
"""

from __future__ import annotations

import hashlib
import json
import logging
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Header, Query
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, model_validator
from sqlalchemy.orm import Session

from common import logs
from control_plane.api import batch_lines
from control_plane.api.context import Ctx, Db, Now, Principal
from control_plane.api.schemas import JobInput, Line, Text
from control_plane.errors import InvalidRequest
from control_plane.services import deployments
from control_plane.services.jobs import admission, batch_slots, batches
from control_plane.services.storage import object_store, storage_access
from control_plane.services.webhooks import targets
from control_plane.settings import Settings

log = logging.getLogger(__name__)
router = APIRouter(prefix="/v1/batches", tags=["batches"])
# Upper bound of `max_in_flight` in the schema; settings.batch_max_in_flight may lower it.
MAX_IN_FLIGHT_LIMIT = 1024


class BatchCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    deployment: Line = Field(max_length=100)
    # Exactly one of the three inputs: a list of JobInput, JSONL text, or an s3:// JSONL object.
    inputs: list[Any] | None = None
    input_jsonl: Text | None = None
    input_uri: Line | None = Field(None, max_length=2_000)
    webhook: Line | None = Field(None, max_length=2_000)
    max_in_flight: int = Field(4, ge=1, le=MAX_IN_FLIGHT_LIMIT)

    @model_validator(mode="after")
    def _one_input(self) -> BatchCreate:
        given = [n for n in ("inputs", "input_jsonl", "input_uri") if getattr(self, n) is not None]
        if len(given) != 1:
            raise ValueError(
                "give exactly one of 'inputs', 'input_jsonl', 'input_uri'"
                + (f" (got {', '.join(given)})" if given else "")
            )
        return self


class BatchPublic(BaseModel):
    id: str
    deployment: str
    status: Literal["running", "completed", "canceled"]
    total: int  # input lines (= jobs)
    max_in_flight: int  # jobs dispatched at once, at most
    counts: dict[str, int]  # jobs per status (every status, zeros included)
    input_uri: str | None
    results_uri: str | None  # s3:// JSONL, once completed
    webhook: str | None
    webhook_status: str
    created_at: str
    completed_at: str | None


class BatchList(BaseModel):
    data: list[BatchPublic]
    next_cursor: str | None


def _request_hash(body: BatchCreate) -> str:
    return hashlib.sha256(json.dumps(body.model_dump(), sort_keys=True).encode()).hexdigest()


def _lines(
    body: BatchCreate, session: Session, settings: Settings, tenant_id: str
) -> list[JobInput]:
    """The batch's inputs, read one line at a time up to the line limit (batch_lines.py)."""
    max_lines = settings.batch_max_lines
    if body.inputs is not None:
        return batch_lines.parse(body.inputs, "inputs", max_lines, raw=False)
    if body.input_jsonl is not None:
        lines = batch_lines.text_lines(body.input_jsonl)
        return batch_lines.parse(lines, "input_jsonl", max_lines, raw=True)
    uri = body.input_uri or ""
    access = storage_access.resolve(session, settings, tenant_id, uri, "input_uri")
    # NOTE: held whole, within batch_max_input_bytes; its lines are decoded as they are reached
    data = object_store.read(access, settings.batch_max_input_bytes)
    return batch_lines.parse(batch_lines.byte_lines(data), "input_uri", max_lines, raw=True)


@router.post(
    "",
    status_code=201,
    response_model=BatchPublic,
    responses={200: {"model": BatchPublic, "description": "replay of an Idempotency-Key"}},
)
def create_batch(
    body: BatchCreate,
    ctx: Ctx,
    session: Db,
    who: Principal,
    at: Now,
    idempotency_key: Annotated[str | None, Header(max_length=180)] = None,
) -> Any:
    who.require("run")
    settings = ctx.settings
    if body.inputs is not None and len(body.inputs) > settings.batch_max_lines:
        # before anything copies the list (the request's hash dumps it whole)
        raise batch_lines.too_many("inputs", settings.batch_max_lines)
    request_hash = _request_hash(body)
    if idempotency_key is not None:
        replay = batches.find_replay(session, who.tenant_id, idempotency_key, request_hash)
        if replay is not None:
            return JSONResponse(batches.to_public(session, replay), status_code=200)
    if body.max_in_flight > settings.batch_max_in_flight:
        raise InvalidRequest(
            f"max_in_flight is {body.max_in_flight}; the limit is {settings.batch_max_in_flight}",
            errors=[{"field": "max_in_flight", "message": "too large"}],
            limit=settings.batch_max_in_flight,
        )
    dep = deployments.get(session, who.tenant_id, body.deployment)
    if body.webhook:
        targets.check_target(body.webhook, settings.webhook_allow_private)
    parsed = _lines(body, session, settings, who.tenant_id)
    # A batch is one request against the tenant's rate; its jobs run at batch priority and
    # enter the in-flight count as pump dispatches them.
    admission.admit(ctx, session, who.tenant_id, 0, ctx.edge.view().limits(session, who.tenant_id))
    batch, created, to_wake = batches.create(
        session,
        dep,
        [p.resolved(dep.spec.defaults) for p in parsed],
        at,
        max_in_flight=body.max_in_flight,
        webhook_url=body.webhook,
        input_uri=body.input_uri,
        idempotency_key=idempotency_key,
        request_hash=request_hash,
        api_key_id=who.key_id,
    )
    # NOTE: the commit comes before any acknowledgement or wake-up (DESIGN §5).
    session.commit()
    logs.bind(batch_id=batch.id, deployment_id=batch.deployment_id)  # the request's log line
    public = batches.to_public(session, batch)
    batch_slots.wake_dispatched(ctx.redis, batch.deployment_id, to_wake, at)
    return JSONResponse(public, status_code=201 if created else 200)


@router.get("", response_model=BatchList)
def list_batches(
    session: Db,
    who: Principal,
    deployment: str | None = None,
    status: str | None = None,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
    cursor: str | None = None,
) -> Any:
    who.require("read")
    rows, next_cursor = batches.list_(
        session, who.tenant_id, deployment=deployment, status=status, limit=limit, cursor=cursor
    )
    return {"data": [batches.to_public(session, b) for b in rows], "next_cursor": next_cursor}


@router.get("/{batch_id}", response_model=BatchPublic)
def get_batch(batch_id: str, session: Db, who: Principal) -> Any:
    who.require("read")
    return batches.to_public(session, batches.get(session, who.tenant_id, batch_id))


@router.post("/{batch_id}/cancel", response_model=BatchPublic)
def cancel_batch(batch_id: str, ctx: Ctx, session: Db, who: Principal, at: Now) -> Any:
    who.require("run")
    batch = batches.cancel(session, ctx.outbox, who.tenant_id, batch_id, at)
    return batches.to_public(session, batch)


@router.get(
    "/{batch_id}/results",
    response_class=StreamingResponse,
    responses={200: {"content": {batches.RESULTS_CONTENT_TYPE: {"schema": {"type": "string"}}}}},
)
def batch_results(batch_id: str, ctx: Ctx, session: Db, who: Principal) -> Any:
    """JSONL, one line per job in input order: from object storage once the batch completed,
    else the jobs finished so far, read from the database."""
    who.require("read")
    batch = batches.get(session, who.tenant_id, batch_id)
    headers = {"X-Batch-Status": batch.status}
    if batch.results_uri:
        chunks = object_store.open_chunks(ctx.settings, batch.results_uri)
        return StreamingResponse(chunks, media_type=batches.RESULTS_CONTENT_TYPE, headers=headers)
    # Assembled now, inside this request's session (a generator would outlive it).
    data = b"".join(batches.iter_results(session, batch.id, terminal_only=True))
    return StreamingResponse(iter([data]), media_type=batches.RESULTS_CONTENT_TYPE, headers=headers)
