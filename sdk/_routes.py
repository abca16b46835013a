"""The REST endpoints of docs/api.md, one function each, returning the `Call` to make."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import quote

from sdk._base import Call


def new_idempotency_key() -> str:
    return str(uuid.uuid4())


def _seg(value: str) -> str:
    """One path segment, percent-encoded ('/' included) so a name can never change the route."""
    if not value:
        raise ValueError("a deployment name or job id must not be empty")
    return quote(value, safe="")


def _query(**params: str | int | None) -> dict[str, str | int]:
    return {k: v for k, v in params.items() if v is not None}


def job_input(value: Mapping[str, Any] | str) -> dict[str, Any]:
    """A JobInput; a bare string is taken as the prompt."""
    return {"prompt": value} if isinstance(value, str) else dict(value)


# --- runs and jobs --------------------------------------------------------------------------


def run(
    deployment: str,
    input: Mapping[str, Any] | str,
    *,
    stream: bool,
    wait_s: float | None,
    idempotency_key: str,
) -> Call:
    body: dict[str, Any] = {"input": job_input(input), "stream": stream}
    if wait_s is not None and not stream:
        body["wait_s"] = round(wait_s, 3)
    return Call(
        "POST",
        f"/v1/deployments/{_seg(deployment)}/run",
        json=body,
        idempotency_key=idempotency_key,
        stream=stream,
    )


def submit(
    deployment: str,
    input: Mapping[str, Any] | str,
    *,
    webhook: str | None,
    webhook_events: Sequence[str] | None,
    ttl_s: float | None,
    idempotency_key: str,
) -> Call:
    body: dict[str, Any] = {"input": job_input(input)}
    if webhook is not None:
        body["webhook"] = webhook
    if webhook_events is not None:
        body["webhook_events"] = list(webhook_events)
    if ttl_s is not None:
        body["ttl_s"] = ttl_s
    return Call(
        "POST",
        f"/v1/deployments/{_seg(deployment)}/jobs",
        json=body,
        idempotency_key=idempotency_key,
    )


def get_job(job_id: str) -> Call:
    return Call("GET", f"/v1/jobs/{_seg(job_id)}")


def list_jobs(deployment: str | None, status: str | None) -> Call:
    return Call("GET", "/v1/jobs", params=_query(deployment=deployment, status=status))


def cancel_job(job_id: str) -> Call:
    # Canceling twice is harmless: replayable.
    return Call("POST", f"/v1/jobs/{_seg(job_id)}/cancel")


# --- deployments ----------------------------------------------------------------------------


def create_deployment(spec: Mapping[str, Any]) -> Call:
    # NOTE: not replayable: a create that reached the server and is re-sent would answer 409.
    return Call("POST", "/v1/deployments", json=dict(spec), replayable=False)


def update_deployment(name: str, spec: Mapping[str, Any]) -> Call:
    body = dict(spec)
    if body.setdefault("name", name) != name:
        raise ValueError(f"the spec's name {body['name']!r} does not match {name!r}")
    return Call("PUT", f"/v1/deployments/{_seg(name)}", json=body)


def get_deployment(name: str) -> Call:
    return Call("GET", f"/v1/deployments/{_seg(name)}")


def list_deployments() -> Call:
    return Call("GET", "/v1/deployments")


def delete_deployment(name: str) -> Call:
    return Call("DELETE", f"/v1/deployments/{_seg(name)}")


# --- billing, workers, webhooks -------------------------------------------------------------


def billing_records(deployment: str | None, worker_id: str | None, phase: str | None) -> Call:
    params = _query(deployment=deployment, worker_id=worker_id, phase=phase)
    return Call("GET", "/v1/billing/records", params=params)


def list_workers(deployment: str | None) -> Call:
    return Call("GET", "/v1/workers", params=_query(deployment=deployment))


def webhook_secret() -> Call:
    return Call("GET", "/v1/webhooks/secret")
