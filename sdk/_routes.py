"""The REST endpoints of docs/api.md, one function each, returning the `Call` to make."""

from __future__ import annotations

import os
import uuid
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

from sdk._base import Call, FileBody

# A time filter: an aware datetime (sent in UTC) or an ISO 8601 string; None: no bound.
Time = datetime | str | None


def new_idempotency_key() -> str:
    return str(uuid.uuid4())


def _seg(value: str, what: str) -> str:
    """One path segment, percent-encoded ('/' included) so a name can never change the route.
    `what` names it in the error for an empty or blank one ("job id")."""
    if not value or not value.strip():
        raise ValueError(f"the {what} must not be empty")
    return quote(value, safe="")


def _query(**params: str | int | None) -> dict[str, str | int]:
    return {k: v for k, v in params.items() if v is not None}


def _time(value: datetime | str | None) -> str | None:
    """A query-string time: ISO 8601 in UTC ("2024-05-01T12:00:00Z"); a str is sent as is."""
    if value is None or isinstance(value, str):
        return value
    if value.tzinfo is None:
        raise ValueError(f"{value!r} has no time zone: pass an aware datetime (e.g. UTC)")
    return value.astimezone(UTC).isoformat().replace("+00:00", "Z")


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
        f"/v1/deployments/{_seg(deployment, 'deployment name')}/run",
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
        f"/v1/deployments/{_seg(deployment, 'deployment name')}/jobs",
        json=body,
        idempotency_key=idempotency_key,
    )


def get_job(job_id: str) -> Call:
    return Call("GET", f"/v1/jobs/{_seg(job_id, 'job id')}", job_id=job_id)


def list_jobs(deployment: str | None, status: str | None) -> Call:
    return Call("GET", "/v1/jobs", params=_query(deployment=deployment, status=status))


def cancel_job(job_id: str) -> Call:
    # Canceling twice is harmless: replayable.
    return Call("POST", f"/v1/jobs/{_seg(job_id, 'job id')}/cancel", job_id=job_id)


# --- deployments ----------------------------------------------------------------------------


def create_deployment(spec: Mapping[str, Any], dry_run: bool = False) -> Call:
    if dry_run:  # writes nothing: harmless to repeat
        return Call("POST", "/v1/deployments", params={"dry_run": "true"}, json=dict(spec))
    # NOTE: not replayable: a create that reached the server and is re-sent would answer 409.
    return Call("POST", "/v1/deployments", json=dict(spec), replayable=False)


def update_deployment(name: str, spec: Mapping[str, Any], dry_run: bool = False) -> Call:
    body = dict(spec)
    if body.setdefault("name", name) != name:
        raise ValueError(f"the spec's name {body['name']!r} does not match {name!r}")
    params = {"dry_run": "true"} if dry_run else {}
    return Call("PUT", f"/v1/deployments/{_seg(name, 'deployment name')}", params=params, json=body)


def get_deployment(name: str) -> Call:
    return Call("GET", f"/v1/deployments/{_seg(name, 'deployment name')}")


def list_deployments() -> Call:
    return Call("GET", "/v1/deployments")


def delete_deployment(name: str) -> Call:
    return Call("DELETE", f"/v1/deployments/{_seg(name, 'deployment name')}")


# --- billing, workers, webhooks -------------------------------------------------------------


def billing_records(
    deployment: str | None,
    worker_id: str | None,
    phase: str | None,
    since: datetime | str | None = None,
    until: datetime | str | None = None,
) -> Call:
    params = _query(
        deployment=deployment,
        worker_id=worker_id,
        phase=phase,
        since=_time(since),
        until=_time(until),
    )
    return Call("GET", "/v1/billing/records", params=params)


def billing_check() -> Call:
    return Call("GET", "/v1/billing/check")


def list_workers(deployment: str | None) -> Call:
    return Call("GET", "/v1/workers", params=_query(deployment=deployment))


def webhook_secret() -> Call:
    return Call("GET", "/v1/webhooks/secret")


def rotate_webhook_secret() -> Call:
    # NOTE: not replayable: a second rotation would push the secret receivers know out of
    # the overlap before anyone saw the one in between
    return Call("POST", "/v1/webhooks/secret/rotate", replayable=False)


# --- batches --------------------------------------------------------------------------------

# What `batches.create` takes: a list of JobInputs (a str is a prompt), a path to a local
# JSONL file, or a "store://path.jsonl" / "s3://bucket/key.jsonl" the platform reads itself.
BatchSource = Sequence[Mapping[str, Any] | str] | str | os.PathLike[str]


def batch_source(source: BatchSource) -> dict[str, Any]:
    """The BatchCreate member for `source`: `inputs`, `input_jsonl` (a file's text) or `input_uri`.

    NOTE: a local file is sent as text and validated by the platform line by line, so a bad
    line is reported with its line number before anything is created.
    """
    if isinstance(source, str) and source.startswith(("s3://", "store://")):
        return {"input_uri": source}
    if isinstance(source, str | os.PathLike):
        return {"input_jsonl": Path(source).read_text(encoding="utf-8")}
    if isinstance(source, Mapping):
        raise TypeError("a batch takes a list of inputs, not one input: pass [input]")
    return {"inputs": [job_input(item) for item in source]}


def create_batch(
    deployment: str,
    source: BatchSource,
    *,
    webhook: str | None,
    max_in_flight: int | None,
    idempotency_key: str,
) -> Call:
    body: dict[str, Any] = {"deployment": deployment, **batch_source(source)}
    if webhook is not None:
        body["webhook"] = webhook
    if max_in_flight is not None:
        body["max_in_flight"] = max_in_flight
    return Call("POST", "/v1/batches", json=body, idempotency_key=idempotency_key)


def get_batch(batch_id: str) -> Call:
    return Call("GET", f"/v1/batches/{_seg(batch_id, 'batch id')}")


def list_batches(deployment: str | None, status: str | None) -> Call:
    return Call("GET", "/v1/batches", params=_query(deployment=deployment, status=status))


def cancel_batch(batch_id: str) -> Call:
    return Call("POST", f"/v1/batches/{_seg(batch_id, 'batch id')}/cancel")


def batch_results(batch_id: str) -> Call:
    return Call(
        "GET",
        f"/v1/batches/{_seg(batch_id, 'batch id')}/results",
        stream=True,
        accept="application/jsonl",
    )


# --- API keys -------------------------------------------------------------------------------

# The scopes a key can hold (docs/api.md); a new key gets ["run", "read"] unless told.
SCOPES = ("admin", "deploy", "run", "read")


def create_key(name: str, scopes: Sequence[str] | None) -> Call:
    body: dict[str, Any] = {"name": name}
    if scopes is not None:
        body["scopes"] = list(scopes)
    # NOTE: not replayable: a create that reached the server and is re-sent makes a 2nd key.
    return Call("POST", "/v1/keys", json=body, replayable=False)


def list_keys() -> Call:
    return Call("GET", "/v1/keys")


def revoke_key(key_id: str) -> Call:
    return Call("DELETE", f"/v1/keys/{_seg(key_id, 'key id')}")


# --- files (the tenant's namespace in the platform's store: store://path) -------------------


def _file_path(path: str) -> str:
    """A store path as URL path segments: '/' separates, everything else is percent-encoded."""
    path = path.removeprefix("store://")
    if not path or path.endswith("/"):
        raise ValueError(f"{path!r} is not a file path (e.g. 'models/demo/config.json')")
    return "/".join(quote(segment, safe="") for segment in path.split("/"))


def upload_file(path: str, content: bytes | FileBody) -> Call:
    # A PUT of the same bytes to the same path is harmless to repeat.
    return Call(
        "PUT",
        f"/v1/files/{_file_path(path)}",
        content=content,
        accept="application/json",
    )


def list_files(prefix: str) -> Call:
    return Call("GET", "/v1/files", params=_query(prefix=prefix.removeprefix("store://") or None))


def delete_file(path: str) -> Call:
    return Call("DELETE", f"/v1/files/{_file_path(path)}")


# --- usage (per-job usage and cost summaries) -----------------------------------------------

# What `usage_summary` can group by (GET /v1/usage/summary).
GROUP_BY = ("deployment", "day", "hour", "api_key", "phase")


def list_usage(
    deployment: str | None, since: datetime | str | None, until: datetime | str | None
) -> Call:
    params = _query(deployment=deployment, since=_time(since), until=_time(until))
    return Call("GET", "/v1/usage", params=params)


def usage_summary(
    group_by: str, since: datetime | str | None, until: datetime | str | None
) -> Call:
    params = _query(group_by=group_by, since=_time(since), until=_time(until))
    return Call("GET", "/v1/usage/summary", params=params)


# --- logs -----------------------------------------------------------------------------------


def log_target(target: str) -> tuple[str, str]:
    """The query parameter naming `target`: a job id (`job_…`), a worker id (`wrk_…`), else a
    deployment's name. Ids are told apart by their prefix (docs/api.md "Logs")."""
    if not target or not target.strip():
        raise ValueError("the job id, worker id or deployment name must not be empty")
    if target.startswith("job_"):
        return "job", target
    if target.startswith("wrk_"):
        return "worker", target
    return "deployment", target


def logs(target: str, since: Time | float, limit: int | None, follow: bool) -> Call:
    """GET /v1/logs; `since`: a time, an ISO string or an age ("15m"; a number: seconds)."""
    kind, value = log_target(target)
    when = str(since) if isinstance(since, int | float) else _time(since)
    params = _query(**{kind: value}, since=when, limit=limit)
    if follow:
        return Call("GET", "/v1/logs", params={**params, "follow": "true"}, stream=True,
                    accept="application/x-ndjson")  # fmt: skip
    return Call("GET", "/v1/logs", params=params)
