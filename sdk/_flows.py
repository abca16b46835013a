"""Multi-step API operations written once, without I/O ("sans-io"), for both clients.

A flow is a generator that yields what it needs done — `Send` a request or `Sleep` — and is
sent back the outcome (a response or the transport error); its return value is the result.
`Client` drives flows with blocking calls, `AsyncClient` with awaits, so retries, polling and
pagination exist exactly once:

    flow = request_json(rt, routes.get_job("job_1"))
    action = next(flow)              # Send(GET /v1/jobs/job_1)
    action = flow.send(response)     # ... until StopIteration.value is the result
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass, replace
from typing import Any, TypeVar

import httpx

from sdk import _routes as routes
from sdk._base import (
    Call,
    Runtime,
    build_request,
    error_from_response,
    parse_job,
    parse_json,
    parse_object,
    poll_interval_s,
    retry_delay_s,
)
from sdk._errors import (
    APIConnectionError,
    BatchTimeout,
    DeploymentNotReady,
    JobTimeout,
    PlatformError,
)
from sdk._models import BATCH_TERMINAL_STATUSES, SERVING_WORKER_STATES, TERMINAL_STATUSES


@dataclass(frozen=True, slots=True)
class Send:
    request: httpx.Request
    # Leave the body unread when the answer is a success (an event stream); the driver
    # still reads error answers so they can be parsed.
    stream: bool


@dataclass(frozen=True, slots=True)
class Sleep:
    seconds: float


Action = Send | Sleep
# What the driver sends back: the answer or transport error for Send, None after Sleep.
Outcome = httpx.Response | httpx.TransportError | None
T = TypeVar("T")
Flow = Generator[Action, Outcome, T]
# Called with each state of a polled object (a Job or Batch as JSON), the first one included.
OnUpdate = Callable[[dict[str, Any]], None]
# Items asked for per page of a list: within every list endpoint's maximum.
PAGE_SIZE = 100


def send(rt: Runtime, call: Call) -> Flow[httpx.Response]:
    """Send `call`, retrying per the policy; return a success answer or raise its error."""
    retry = 0
    # NOTE: an outage is timed from the first failure, not from the send: a sync run that
    # waited a minute for its answer before the API died has not been failing for a minute.
    first_failure_s: float | None = None
    while True:
        outcome = yield Send(build_request(rt, call), stream=call.stream)
        assert outcome is not None, "the driver answers every Send"
        if isinstance(outcome, httpx.TransportError) or outcome.is_error:
            now_s = rt.clock()
            first_failure_s = now_s if first_failure_s is None else first_failure_s
            delay = retry_delay_s(rt, call, outcome, retry, now_s - first_failure_s)
        else:
            delay = None
        if delay is None:
            break
        retry += 1
        yield Sleep(delay)
    if isinstance(outcome, httpx.TransportError):
        reason = str(outcome) or type(outcome).__name__
        raise APIConnectionError(
            f"cannot reach the platform at {rt.credentials.base_url} "
            f"({call.method} {call.path}, {retry + 1} tries): {reason}",
            job_id=call.job_id,
        ) from outcome
    if outcome.is_error:
        error = error_from_response(outcome, rt.wall_clock())
        error.job_id = error.job_id or call.job_id  # a call about a job never loses its id
        raise error
    return outcome


def request_json(rt: Runtime, call: Call) -> Flow[Any]:
    response = yield from send(rt, call)
    return parse_json(response)


def request_object(rt: Runtime, call: Call) -> Flow[dict[str, Any]]:
    response = yield from send(rt, call)
    return parse_object(response)


def request_job(rt: Runtime, call: Call) -> Flow[dict[str, Any]]:
    response = yield from send(rt, call)
    return parse_job(response)


def request_list(rt: Runtime, call: Call, limit: int | None) -> Flow[list[dict[str, Any]]]:
    """Every item of a paginated `{"data": [...], "next_cursor": ...}` list, up to `limit`."""
    if limit is not None and limit < 1:
        raise ValueError("limit must be at least 1")
    items: list[dict[str, Any]] = []
    cursor: str | None = None
    while True:
        params = dict(call.params)
        # NOTE: pages stay within every list endpoint's bound; `limit` caps the total.
        params["limit"] = PAGE_SIZE if limit is None else min(PAGE_SIZE, limit - len(items))
        if cursor:
            params["cursor"] = cursor
        body = yield from request_json(rt, replace(call, params=params))
        page = body.get("data") if isinstance(body, dict) else None
        if not isinstance(page, list):
            raise PlatformError(f"GET {call.path}: expected {{'data': [...]}}")
        items.extend(item for item in page if isinstance(item, dict))
        next_cursor = body.get("next_cursor")
        cursor = next_cursor if isinstance(next_cursor, str) and next_cursor else None
        # NOTE: an empty page ends the walk even with a cursor, so a server bug cannot loop us.
        if cursor is None or not page or (limit is not None and len(items) >= limit):
            return items if limit is None else items[:limit]


def wait_for_job(
    rt: Runtime,
    job: dict[str, Any],
    timeout_s: float | None,
    on_update: OnUpdate | None = None,
) -> Flow[dict[str, Any]]:
    """Poll a job until it is terminal; JobTimeout after `timeout_s` (None: no limit).

    `on_update` sees every state of the job, the one given first, as it is fetched.
    """
    deadline_s = None if timeout_s is None else rt.clock() + timeout_s
    return (yield from _poll(rt, job, deadline_s, timeout_s, on_update))


def _poll(
    rt: Runtime,
    job: dict[str, Any],
    deadline_s: float | None,
    timeout_s: float | None,
    on_update: OnUpdate | None = None,
) -> Flow[dict[str, Any]]:
    job_id = str(job["id"])
    return (
        yield from _poll_until(
            rt,
            job,
            routes.get_job(job_id),
            TERMINAL_STATUSES,
            deadline_s,
            lambda: JobTimeout(job_id, timeout_s or 0.0),
            on_update,
        )
    )


def wait_for_batch(
    rt: Runtime,
    batch: dict[str, Any],
    timeout_s: float | None,
    on_update: OnUpdate | None = None,
) -> Flow[dict[str, Any]]:
    """Poll a batch until it is completed or canceled; BatchTimeout after `timeout_s`."""
    batch_id = str(batch["id"])
    deadline_s = None if timeout_s is None else rt.clock() + timeout_s
    return (
        yield from _poll_until(
            rt,
            batch,
            routes.get_batch(batch_id),
            BATCH_TERMINAL_STATUSES,
            deadline_s,
            lambda: BatchTimeout(batch_id, timeout_s or 0.0),
            on_update,
        )
    )


def _poll_until(
    rt: Runtime,
    obj: dict[str, Any],
    call: Call,
    done: frozenset[str],
    deadline_s: float | None,
    timeout_error: Callable[[], PlatformError],
    on_update: OnUpdate | None,
) -> Flow[dict[str, Any]]:
    """GET `call` until the object's status is in `done`, pausing longer and longer."""
    polls = 0
    if on_update is not None:
        on_update(obj)
    while obj.get("status") not in done:
        delay = poll_interval_s(polls)
        if deadline_s is not None:
            remaining_s = deadline_s - rt.clock()
            if remaining_s <= 0:
                raise timeout_error()
            delay = min(delay, remaining_s)
        yield Sleep(delay)
        obj = yield from request_object(rt, call)
        polls += 1
        if on_update is not None:
            on_update(obj)
    return obj


def wait_ready(
    rt: Runtime,
    deployment: str,
    version: int | None,
    timeout_s: float | None,
    on_update: Callable[[list[dict[str, Any]]], None] | None = None,
) -> Flow[dict[str, Any]]:
    """Poll the deployment's workers until one of `version` (None: the current one) serves.

    Returns that worker; DeploymentNotReady when one of them fails or `timeout_s` passes.
    `on_update` sees the workers of the version at every poll.
    """
    deadline_s = None if timeout_s is None else rt.clock() + timeout_s
    if version is None:
        body = yield from request_object(rt, routes.get_deployment(deployment))
        current = body.get("version")
        version = current if isinstance(current, int) else None
    polls = 0
    # Workers that had failed before the wait began are history, not news.
    failed_before: set[object] | None = None
    while True:
        workers = yield from request_list(rt, routes.list_workers(deployment), None)
        mine = [w for w in workers if version is None or w.get("deployment_version") == version]
        if on_update is not None:
            on_update(mine)
        ready = [w for w in mine if w.get("state") in SERVING_WORKER_STATES]
        if ready:
            return ready[0]
        failed = [w for w in mine if w.get("state") == "failed"]
        if failed_before is None:
            failed_before = {w.get("id") for w in failed}
        failed = [w for w in failed if w.get("id") not in failed_before]
        if failed:
            worker = failed[-1]
            why = worker.get("reason") or "no reason given"
            reason = f"worker {worker.get('id')} failed: {why}"
            raise DeploymentNotReady(deployment, version, reason, timed_out=False)
        delay = min(1.0, poll_interval_s(polls))
        if deadline_s is not None:
            remaining_s = deadline_s - rt.clock()
            if remaining_s <= 0:
                states = ", ".join(str(w.get("state")) for w in mine) or "no worker yet"
                reason = f"not serving after {timeout_s:g}s ({states})"
                raise DeploymentNotReady(deployment, version, reason, timed_out=True)
            delay = min(delay, remaining_s)
        yield Sleep(delay)
        polls += 1


def run(
    rt: Runtime, call: Call, *, wait: bool, timeout_s: float | None, started_s: float
) -> Flow[dict[str, Any]]:
    """A sync run: POST, and when the platform answers 202 (still running), poll it.

    `timeout_s` counts from `started_s` (the clock when the caller began), POST included.
    """
    job = yield from request_job(rt, call)
    if not wait:
        return job
    deadline_s = None if timeout_s is None else started_s + timeout_s
    return (yield from _poll(rt, job, deadline_s, timeout_s))


def recover_stream(rt: Runtime, job_id: str, timeout_s: float | None) -> Flow[dict[str, Any]]:
    """After a stream broke off: fetch the job and wait for it to finish."""
    deadline_s = None if timeout_s is None else rt.clock() + timeout_s
    try:
        job = yield from request_job(rt, routes.get_job(job_id))
    except PlatformError as e:
        e.job_id = e.job_id or job_id
        raise
    return (yield from _poll(rt, job, deadline_s, timeout_s))
