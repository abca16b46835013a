"""What the sync and async clients share: request building, response parsing, retry policy.

Everything here is a pure function of its arguments (the clock and the randomness are passed
in), so the two clients differ only in how they send bytes and how they sleep (see _flows.py).
"""

from __future__ import annotations

import email.utils
import json
import math
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from sdk._config import Credentials
from sdk._errors import (
    APIError,
    AuthenticationError,
    ConflictError,
    InvalidRequestError,
    NotFoundError,
    PlatformError,
    RateLimitError,
    ServerError,
)

USER_AGENT = "platform-sdk-python/0.1.0"
JOB_ID_HEADER = "X-Job-Id"
# The status of a batch, on the answer that streams its results.
BATCH_STATUS_HEADER = "X-Batch-Status"
IDEMPOTENCY_HEADER = "Idempotency-Key"
# Answers that mean "the platform did not take the request; try again later".
RETRY_STATUSES = frozenset({429, 502, 503, 504})
# Of those, the ones a proxy may send after the platform already acted on the request.
MAYBE_PROCESSED_STATUSES = frozenset({502, 504})
# Answers that mean the platform is down or restarting (a proxy in front of it, or the API
# without Redis), not that it is busy: retried for as long as an outage may last.
UNAVAILABLE_STATUSES = frozenset({502, 503, 504})


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """When and how long to wait before sending a request again."""

    max_retries: int = 3  # re-sends after the first try; 0 disables retries
    base_s: float = 0.5  # backoff ceiling of the first retry; doubles per retry
    cap_s: float = 8.0  # the backoff ceiling never exceeds this
    max_retry_after_s: float = 60.0  # a longer Retry-After is not waited for: the error is raised
    # While the platform cannot be reached or answers 502/503/504, a request that is safe to
    # send again is retried past `max_retries` until it has been failing this long: an API
    # restart or a rolling deploy takes seconds, longer than three quick tries (0: off).
    max_unavailable_s: float = 30.0


@dataclass(frozen=True, slots=True)
class Runtime:
    """The environment a flow runs in: settings plus the injected clock and randomness."""

    credentials: Credentials
    timeout_s: float | None  # per HTTP request (connect, read, write, pool); None: no limit
    policy: RetryPolicy
    clock: Callable[[], float]  # monotonic seconds, for deadlines
    wall_clock: Callable[[], float]  # Unix seconds, to read Retry-After dates
    rand: Callable[[], float]  # uniform in [0, 1), for backoff jitter


# A local file is read and sent this many bytes at a time: big enough that the cost of each
# piece vanishes, small enough that memory stays flat whatever the file's size.
CHUNK_BYTES = 1024 * 1024


class FileBody(httpx.SyncByteStream, httpx.AsyncByteStream):
    """A local file as a request body, for either client: read CHUNK_BYTES at a time (never
    whole in memory), from its start each time it is sent (a retry sends the whole file again),
    with its length (`size_bytes`, taken when this is made) declared in `Content-Length`, so
    the API knows the size before the first byte.

    NOTE: each piece is a plain (blocking) read, in the asyncio client too: one piece from a
    local disk takes a small fraction of the time sending it takes.
    """

    def __init__(self, path: str | Path, progress: Callable[[int], None] | None = None) -> None:
        self.path = Path(path)
        self.size_bytes = self.path.stat().st_size  # a missing file fails here, before sending
        # hears the bytes handed to the connection so far in this attempt (from 0 on a retry)
        self.progress = progress

    def __iter__(self) -> Iterator[bytes]:
        left, sent = self.size_bytes, 0
        with self.path.open("rb") as f:
            # A file that shrank meanwhile ends early: the server then never sees a whole body.
            while left > 0 and (chunk := f.read(min(CHUNK_BYTES, left))):
                left -= len(chunk)
                yield chunk
                sent += len(chunk)
                if self.progress is not None:
                    self.progress(sent)

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for chunk in self:
            yield chunk


@dataclass(frozen=True, slots=True)
class Call:
    """One API call as the SDK means it; every retry sends the same Call again.

    NOTE: the idempotency key lives here, not in the request, so a call that is re-sent after
    a dropped connection carries the same key and the platform creates at most one job.
    """

    method: str  # GET, POST, PUT, DELETE
    path: str  # "/v1/...", already percent-encoded
    params: Mapping[str, str | int] = field(default_factory=dict)  # query string
    json: Any = None  # request body; None sends no body
    content: bytes | FileBody | None = None  # a raw body instead (a file upload); sent as is
    idempotency_key: str | None = None  # sent as the Idempotency-Key header
    # True when sending twice is harmless (reads, PUT, DELETE, keyed POSTs): then a request
    # that may have reached the server (read error, 502, 504) is retried too.
    replayable: bool = True
    stream: bool = False  # the answer is streamed (SSE, JSONL): do not read it on success
    # The Accept header; None: text/event-stream for a stream, else application/json.
    accept: str | None = None
    # The job this call is about, when it names one: every error it raises carries it.
    job_id: str | None = None


def build_request(rt: Runtime, call: Call) -> httpx.Request:
    accept = call.accept or ("text/event-stream" if call.stream else "application/json")
    headers = {"User-Agent": USER_AGENT, "Accept": accept}
    if rt.credentials.api_key:
        headers["Authorization"] = f"Bearer {rt.credentials.api_key}"
    if call.idempotency_key:
        headers[IDEMPOTENCY_HEADER] = call.idempotency_key
    # NOTE: httpx applies timeouts from the request's extensions; a Request built by hand
    # (rather than by Client.build_request) must carry them itself.
    extensions = {"timeout": httpx.Timeout(rt.timeout_s).as_dict()}
    url = rt.credentials.base_url + call.path
    file = call.content if isinstance(call.content, FileBody) else None
    if file is not None:
        # httpx adds these only to a body it encodes itself (and would send a stream chunked:
        # the declared length lets the API size its parts)
        headers["Content-Length"] = str(file.size_bytes)
        headers["Host"] = httpx.URL(url).netloc.decode("ascii")
    return httpx.Request(
        call.method,
        url,
        params={k: str(v) for k, v in call.params.items()},
        json=call.json if call.content is None else None,
        content=None if file is not None else call.content,
        stream=file,  # either client can read it (sync and async iteration)
        headers=headers,
        extensions=extensions,
    )


# --- retry policy ---------------------------------------------------------------------------


def backoff_s(policy: RetryPolicy, retry: int, rand: Callable[[], float]) -> float:
    """Full jitter: uniform in [0, min(cap, base * 2**retry)] (retry counts from 0)."""
    return rand() * min(policy.cap_s, policy.base_s * 2.0**retry)


def parse_retry_after(value: str | None, now_s: float) -> float | None:
    """Seconds to wait from a Retry-After header (delta-seconds or an HTTP date)."""
    if not value:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        if when.tzinfo is None:
            return None
        seconds = when.timestamp() - now_s
    if not math.isfinite(seconds):
        return None
    return max(0.0, seconds)


def retry_delay_s(
    rt: Runtime,
    call: Call,
    outcome: httpx.Response | httpx.TransportError,
    retry: int,
    failing_s: float = 0.0,
) -> float | None:
    """How long to wait before re-sending `call` after `outcome`, or None to stop here.

    `retry` counts the re-sends so far; `failing_s` is how long the call has been failing
    (since its first failed try). Past `max_retries`, only an outage is retried, until it has
    lasted `max_unavailable_s`.
    """
    policy = rt.policy
    if policy.max_retries == 0:
        return None
    delay = _delay_s(rt, call, outcome, retry)
    if delay is None or retry < policy.max_retries:
        return delay
    if is_unavailable(outcome) and failing_s + delay <= policy.max_unavailable_s:
        return delay
    return None


def is_unavailable(outcome: httpx.Response | httpx.TransportError) -> bool:
    """The platform is down or restarting: no connection, or a 502/503/504."""
    if isinstance(outcome, httpx.TransportError):
        return True
    return outcome.status_code in UNAVAILABLE_STATUSES


def _delay_s(
    rt: Runtime, call: Call, outcome: httpx.Response | httpx.TransportError, retry: int
) -> float | None:
    """The wait before a re-send when `outcome` may be retried at all, else None."""
    policy = rt.policy
    if isinstance(outcome, httpx.TransportError):
        # A connect failure means the request never left; anything later may have arrived.
        never_sent = isinstance(
            outcome, httpx.ConnectError | httpx.ConnectTimeout | httpx.PoolTimeout
        )
        if never_sent or call.replayable:
            return backoff_s(policy, retry, rt.rand)
        return None
    status = outcome.status_code
    if status not in RETRY_STATUSES:
        return None
    if status in MAYBE_PROCESSED_STATUSES and not call.replayable:
        return None
    retry_after = parse_retry_after(outcome.headers.get("Retry-After"), rt.wall_clock())
    if retry_after is None:
        return backoff_s(policy, retry, rt.rand)
    if retry_after > policy.max_retry_after_s:
        return None
    return retry_after


def poll_interval_s(polls: int) -> float:
    """Pause before the next GET of a job that is not finished: 0.25 s growing to 2 s."""
    return min(2.0, 0.25 * 1.5**polls)


def sync_wait_s(http_timeout_s: float | None, remaining_s: float | None) -> float | None:
    """How long the server may hold a sync run before answering 202 with the job.

    Kept below the HTTP read timeout: a run that outlives it must come back as a 202 (the
    job is then polled), never as a client-side read timeout that would lose the answer.
    """
    limits = []
    if http_timeout_s is not None:
        limits.append(max(http_timeout_s * 0.8, http_timeout_s - 5.0))
    if remaining_s is not None:
        limits.append(max(0.0, remaining_s))
    return min(limits) if limits else None


# --- response parsing -----------------------------------------------------------------------


def job_id_header(response: httpx.Response) -> str | None:
    return response.headers.get(JOB_ID_HEADER) or None


def parse_json(response: httpx.Response) -> Any:
    """The JSON body of a successful answer; None for an empty one (204)."""
    if response.status_code == 204 or not response.content:
        return None
    try:
        return response.json()
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise PlatformError(
            f"{response.request.method} {response.request.url.path}: expected JSON, got "
            f"{response.headers.get('content-type', 'no content type')}",
            job_id=job_id_header(response),
        ) from e


def parse_object(response: httpx.Response) -> dict[str, Any]:
    body = parse_json(response)
    if not isinstance(body, dict):
        raise PlatformError(
            f"{response.request.method} {response.request.url.path}: expected a JSON object",
            job_id=job_id_header(response),
        )
    return body


def parse_job(response: httpx.Response) -> dict[str, Any]:
    """A Job body; its id falls back to the X-Job-Id header."""
    job = parse_object(response)
    if not job.get("id"):
        header = job_id_header(response)
        if not header:
            raise PlatformError(
                f"{response.request.method} {response.request.url.path}: the answer has no job id"
            )
        job["id"] = header
    return job


def parse_jsonl_line(line: str, what: str) -> dict[str, Any] | None:
    """One line of a JSONL answer (`what` names it in errors); None for a blank line."""
    if not line.strip():
        return None
    try:
        value = json.loads(line)
    except json.JSONDecodeError as e:
        raise PlatformError(f"{what}: a line is not valid JSON ({e.msg})") from e
    if not isinstance(value, dict):
        raise PlatformError(f"{what}: a line is not a JSON object")
    return value


def summary_rows(body: Any, group_by: str) -> list[dict[str, Any]]:
    """The rows of a GET /v1/usage/summary answer, each with its group under "key"."""
    rows = body.get("data") if isinstance(body, dict) else None
    if not isinstance(rows, list):
        raise PlatformError("GET /v1/usage/summary: expected {'data': [...]}")
    out = []
    for row in rows:
        if isinstance(row, dict):
            # NOTE: the API names the group "group"; "key" and the group's own name
            # ("phase": "busy") are read too, so every row has one "key".
            key = row.get("key", row.get("group", row.get(group_by)))
            out.append({"key": key, **row})
    return out


def is_missing_route(error: APIError) -> bool:
    """A 404 because the platform has no such endpoint (an older server), not a missing thing.

    The API names what it did not find ("deployment 'x' does not exist"); an unknown route
    only says "Not Found".
    """
    return error.status == 404 and error.detail.strip().lower() in ("", "not found")


def secret_of(body: Any) -> str:
    """The secret of a /v1/webhooks/secret (or /rotate) answer."""
    secret = body.get("secret") if isinstance(body, dict) else None
    if not isinstance(secret, str) or not secret:
        raise PlatformError("/v1/webhooks/secret: the answer holds no secret")
    return secret


def error_from_response(response: httpx.Response, now_s: float) -> APIError:
    """Map an error answer (problem+json, or anything else) onto the APIError subclasses."""
    status = response.status_code
    problem: dict[str, Any] = {}
    try:
        body = response.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        body = None
    if isinstance(body, dict):
        problem = body
    title = _text(problem.get("title")) or response.reason_phrase or f"HTTP {status}"
    detail = _text(problem.get("detail"))
    if not problem and response.content:
        detail = response.text.strip()[:300]  # not JSON: a proxy's page, say; keep it short
    type_ = _text(problem.get("type")) or "about:blank"
    job_id = _text(problem.get("job_id")) or job_id_header(response)
    if status == 429:
        retry_after = parse_retry_after(response.headers.get("Retry-After"), now_s)
        return RateLimitError(status, type_, title, detail, problem, job_id, retry_after)
    cls = _ERROR_CLASSES.get(status, ServerError if status >= 500 else APIError)
    return cls(status, type_, title, detail, problem, job_id)


_ERROR_CLASSES: dict[int, type[APIError]] = {
    400: InvalidRequestError,
    401: AuthenticationError,
    403: AuthenticationError,
    404: NotFoundError,
    409: ConflictError,
    413: InvalidRequestError,
    422: InvalidRequestError,
}


def _text(value: object) -> str:
    return value if isinstance(value, str) else ""
