"""Server-sent events of a streamed run, decoded into text deltas (no I/O here).

A run stream (docs/api.md) is: queued, starting*, running, output*, then one of completed /
failed / canceled carrying the final Job; a `restarted` event tells the client to discard the
text it has (the job was run again and its new text departs from it: the output deltas after
it start the text anew). `StreamState` follows it line by line; the clients only read lines
and act on what it says.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sdk._errors import PlatformError, StreamRestarted, job_failure
from sdk._models import JobView

# The event that ends a run stream; each but `completed` (= succeeded) is the job's status.
TERMINAL_EVENTS = frozenset({"completed", "failed", "canceled", "expired", "timed_out"})


@dataclass(frozen=True, slots=True)
class ServerSentEvent:
    event: str  # the `event:` field; "message" when the server sent none
    data: str  # the `data:` lines joined by "\n"
    id: str | None  # the last `id:` seen, per the SSE spec


class SSEDecoder:
    """Incremental decoder for the text/event-stream format (WHATWG HTML, 9.2.6).

    Feed it lines without their terminator; a blank line completes an event.
    """

    def __init__(self) -> None:
        self._event = ""
        self._data: list[str] = []
        self._last_id: str | None = None

    def feed(self, line: str) -> ServerSentEvent | None:
        if not line:
            return self._dispatch()
        if line.startswith(":"):  # a comment: keep-alive
            return None
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "event":
            self._event = value
        elif name == "data":
            self._data.append(value)
        elif name == "id" and "\0" not in value:
            self._last_id = value
        # "retry" and unknown fields are ignored, as the spec says.
        return None

    def _dispatch(self) -> ServerSentEvent | None:
        event, data = self._event or "message", self._data
        self._event, self._data = "", []
        if not data:
            return None
        return ServerSentEvent(event=event, data="\n".join(data), id=self._last_id)


@dataclass(frozen=True, slots=True)
class RunStatus:
    """Where a streamed run stands before its text: from its `queued`, `starting` and `running`
    events. While a worker boots for it (`starting`), the cold start's phase and ETA."""

    status: str  # queued | starting | running
    reason: str | None = None  # starting: no_capacity | loading_weights | warming | crash_loop
    # waiting_for_node | booting | assigning_warm_worker | loading_weights | warming
    phase: str | None = None
    eta_s: float | None = None  # seconds until the worker should be ready; None: not known
    bytes_done: int | None = None  # weight bytes loaded so far (loading_weights)
    bytes_total: int | None = None  # weight bytes to load
    detail: str | None = None  # waiting_for_node: why (the scheduler's words)

    @classmethod
    def from_event(cls, status: str, data: dict[str, Any]) -> RunStatus:
        def number(key: str, kind: type[int] | type[float]) -> Any:
            value = data.get(key)
            if isinstance(value, int | float) and not isinstance(value, bool):
                return kind(value)
            return None

        def text(key: str) -> str | None:
            value = data.get(key)
            return value if isinstance(value, str) else None

        return cls(
            status=status,
            reason=text("reason"),
            phase=text("phase"),
            eta_s=number("eta_s", float),
            bytes_done=number("bytes_done", int),
            bytes_total=number("bytes_total", int),
            detail=text("detail"),
        )


class StreamState:
    """Where a run stream stands: the job id, the text streamed so far, the final job, and its
    latest status (`on_status` hears each new one, in the thread that reads the stream).

    NOTE: deltas handed to the reader cannot be taken back, so after a `restarted` event none
    is handed over any more: the stream is read to its end and `settle` raises StreamRestarted
    with the job (unless its output still continues what the reader has)."""

    def __init__(
        self, job_id: str | None, on_status: Callable[[RunStatus], None] | None = None
    ) -> None:
        self.job_id = job_id  # from X-Job-Id, else from the `queued` event
        self.final: dict[str, Any] | None = None  # the Job of the terminal event
        self.status: RunStatus | None = None
        self.restarted: int | None = None  # the attempt of the last `restarted` event
        self._on_status = on_status
        self._decoder = SSEDecoder()
        self._seen: list[str] = []  # the deltas handed to the reader
        self._text: list[str] = []  # the job's text as the stream has it (since a restart)

    @property
    def done(self) -> bool:
        return self.final is not None

    @property
    def seen_text(self) -> str:
        """The text handed to the reader."""
        return "".join(self._seen)

    @property
    def text(self) -> str:
        """The job's text as streamed so far: after a `restarted` event, from it on."""
        return "".join(self._text)

    def feed_line(self, line: str) -> str | None:
        """The text delta this line completes, if any; records the final job when it comes."""
        event = self._decoder.feed(line)
        if event is None or self.done:
            return None
        data = self._decode(event)
        if event.event in ("queued", "starting", "running"):
            self._status(RunStatus.from_event(event.event, data))
        if event.event == "queued" and not self.job_id:
            job_id = data.get("job_id")
            self.job_id = job_id if isinstance(job_id, str) else None
        elif event.event == "output":
            delta = data.get("delta")
            # the first choice's text (a job with n > 1 streams the others with an `index`;
            # all of them are in the final job's `output.choices`)
            if isinstance(delta, str) and delta and not data.get("index"):
                self._text.append(delta)
                if self.restarted is None:
                    self._seen.append(delta)
                    return delta
        elif event.event == "restarted":
            attempt = data.get("attempt")
            self.restarted = attempt if isinstance(attempt, int) else 0
            self._text = []
        elif event.event in TERMINAL_EVENTS:
            final = dict(data)
            if self.job_id and not final.get("id"):
                final["id"] = self.job_id
            # A terminal event other than `completed` always ends the job with that status,
            # whatever it carries.
            if event.event != "completed" and final.get("status") in (None, "succeeded"):
                final["status"] = event.event
            self.final = final
        # starting / running / unknown events carry no text.
        return None

    def _status(self, status: RunStatus) -> None:
        self.status = status
        if self._on_status is not None:
            self._on_status(status)

    def _decode(self, event: ServerSentEvent) -> dict[str, Any]:
        try:
            data = json.loads(event.data)
        except json.JSONDecodeError as e:
            raise PlatformError(
                f"malformed {event.event!r} event in the run stream", job_id=self.job_id
            ) from e
        return data if isinstance(data, dict) else {}


def settle(job: JobView, seen: str, *, restarted: int | None = None) -> str:
    """Raise unless the streamed job succeeded; else the text still owed to a reader that was
    handed `seen`: the output past it (a stream that broke off, or whose server lost deltas).

    An output that does not continue `seen` raises: StreamRestarted after a `restarted` event
    (`restarted`: its attempt), else PlatformError; never a text that differs from the output.
    """
    if job.status != "succeeded":
        raise job_failure(job)
    final_text = job.text or ""
    if final_text.startswith(seen):
        return final_text[len(seen) :]
    if restarted is not None:
        raise StreamRestarted(job, restarted)
    raise PlatformError(
        f"the text streamed for job {job.id} does not continue into its output; read the "
        "job's output instead",
        job_id=job.id,
    )
