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

from collections.abc import Generator
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
    poll_interval_s,
    retry_delay_s,
)
from sdk._errors import JobTimeout, PlatformConnectionError, PlatformError
from sdk._models import TERMINAL_STATUSES


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


def send(rt: Runtime, call: Call) -> Flow[httpx.Response]:
    """Send `call`, retrying per the policy; return a success answer or raise its error."""
    retry = 0
    while True:
        outcome = yield Send(build_request(rt, call), stream=call.stream)
        assert outcome is not None, "the driver answers every Send"
        delay = retry_delay_s(rt, call, outcome, retry)
        if delay is None:
            break
        retry += 1
        yield Sleep(delay)
    if isinstance(outcome, httpx.TransportError):
        reason = str(outcome) or type(outcome).__name__
        raise PlatformConnectionError(
            f"cannot reach the platform at {rt.credentials.base_url} "
            f"({call.method} {call.path}, {retry + 1} tries): {reason}"
        ) from outcome
    if outcome.is_error:
        raise error_from_response(outcome, rt.wall_clock())
    return outcome


def request_json(rt: Runtime, call: Call) -> Flow[Any]:
    response = yield from send(rt, call)
    return parse_json(response)


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
        if limit is not None:
            params["limit"] = limit - len(items)
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


def wait_for_job(rt: Runtime, job: dict[str, Any], timeout_s: float | None) -> Flow[dict[str, Any]]:
    """Poll a job until it is terminal; JobTimeout after `timeout_s` (None: no limit)."""
    deadline_s = None if timeout_s is None else rt.clock() + timeout_s
    return (yield from _poll(rt, job, deadline_s, timeout_s))


def _poll(
    rt: Runtime, job: dict[str, Any], deadline_s: float | None, timeout_s: float | None
) -> Flow[dict[str, Any]]:
    job_id = str(job["id"])
    polls = 0
    try:
        while job.get("status") not in TERMINAL_STATUSES:
            delay = poll_interval_s(polls)
            if deadline_s is not None:
                remaining_s = deadline_s - rt.clock()
                if remaining_s <= 0:
                    raise JobTimeout(job_id, timeout_s or 0.0)
                delay = min(delay, remaining_s)
            yield Sleep(delay)
            job = yield from request_job(rt, routes.get_job(job_id))
            polls += 1
    except PlatformError as e:
        e.job_id = e.job_id or job_id  # a poll that failed still names its job
        raise
    return job


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
