"""HTTP client for the control plane's /internal endpoints, with retries.

Reports must not be lost: a completion is retried with backoff for minutes; the control plane
makes them idempotent (fenced by attempt), so a repeat is harmless.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from common import tracing
from common.protocol import (
    CLAIMS_PATH,
    REPORTS_PATH,
    claim_path,
    complete_path,
    worker_state_path,
)
from worker.runtime.json_http import TRANSPORT_ERRORS, Answer, JsonHttp

log = logging.getLogger(__name__)
# How long a claim is retried (the job is re-dispatched by the reconciler after that), and a
# report (its outcome must not be lost: minutes).
CLAIM_DEADLINE_S = 60
REPORT_DEADLINE_S = 600


@dataclass(frozen=True, slots=True)
class Report:
    """A job's outcome as the worker reports it."""

    job_id: str
    attempt: int  # the fence: only this attempt may end the job
    status: str  # terminal status
    # output, error, prompt_tokens, generated_tokens; the ones without a value left out
    fields: dict[str, Any]
    # the report's span (the job's trace), None when not traced
    traceparent: str | None = None


class ControlClient:
    def __init__(self, base_url: str, token: str, worker_id: str) -> None:
        self.worker_id = worker_id
        self._http = JsonHttp(base_url, {"Authorization": f"Bearer {token}"}, timeout_s=30.0)

    def close(self) -> None:
        self._http.close()

    def _post(
        self,
        path: str,
        body: dict[str, Any],
        *,
        deadline_s: float,
        headers: dict[str, str] | None = None,
    ) -> Answer:
        delay = 0.2
        give_up = time.monotonic() + deadline_s
        while True:
            try:
                resp = self._http.post(path, body, headers)
                if resp.status_code < 500:
                    return resp
                log.warning("control plane answered %d on %s", resp.status_code, path)
            except TRANSPORT_ERRORS as exc:
                log.warning("control plane unreachable on %s: %s", path, exc)
            if time.monotonic() + delay > give_up:
                raise RuntimeError(f"control plane did not accept {path} within {deadline_s}s")
            time.sleep(delay)
            delay = min(delay * 2, 5.0)

    def report_state(
        self, state: str, reason: str | None = None, *, takes_handoffs: bool = False
    ) -> None:
        body: dict[str, Any] = {"state": state, "at": time.time(), "reason": reason}
        if takes_handoffs:  # it pops its hand-off list from now on
            body["takes_handoffs"] = True
        resp = self._post(worker_state_path(self.worker_id), body, deadline_s=60)
        resp.raise_for_status()

    def claim(self, job_id: str) -> dict[str, Any] | None:
        resp = self._post(
            claim_path(job_id), {"worker_id": self.worker_id}, deadline_s=CLAIM_DEADLINE_S
        )
        if resp.status_code == 409:
            return None
        resp.raise_for_status()
        data: dict[str, Any] = resp.json()
        return data

    def complete(
        self,
        job_id: str,
        attempt: int,
        status: str,
        *,
        headers: dict[str, str] | None = None,
        **fields: Any,
    ) -> bool:
        """True if accepted; False if the attempt was fenced off (canceled or superseded).
        `headers`: a `traceparent` (the report joins the job's trace)."""
        body = {"worker_id": self.worker_id, "attempt": attempt, "status": status, **fields}
        resp = self._post(
            complete_path(job_id), body, deadline_s=REPORT_DEADLINE_S, headers=headers
        )
        if resp.status_code == 409:
            return False
        resp.raise_for_status()
        return True

    # Several jobs in one request (worker/runtime/batching.py); a lone job takes the route of
    # one, whose request span joins the job's trace.

    def claims(self, job_ids: Sequence[str]) -> list[dict[str, Any] | None]:
        """Each job's claim (as `claim`), None for a job that is not claimable."""
        if len(job_ids) == 1:
            return [self.claim(job_ids[0])]
        body = {"worker_id": self.worker_id, "job_ids": list(job_ids)}
        resp = self._post(CLAIMS_PATH, body, deadline_s=CLAIM_DEADLINE_S)
        resp.raise_for_status()
        return [c if c["claimed"] else None for c in resp.json()["claims"]]

    def reports(self, reports: Sequence[Report]) -> list[bool]:
        """Each report accepted (True) or fenced off (False), as `complete`."""
        if len(reports) == 1:
            r = reports[0]
            headers = {tracing.TRACEPARENT: r.traceparent} if r.traceparent else None
            return [self.complete(r.job_id, r.attempt, r.status, headers=headers, **r.fields)]
        items = [
            {
                "job_id": r.job_id,
                "attempt": r.attempt,
                "status": r.status,
                "traceparent": r.traceparent,
                **r.fields,
            }
            for r in reports
        ]
        body = {"worker_id": self.worker_id, "reports": items}
        resp = self._post(REPORTS_PATH, body, deadline_s=REPORT_DEADLINE_S)
        resp.raise_for_status()
        return [bool(r["ok"]) for r in resp.json()["reports"]]
