"""Callers of sync jobs as users make them, each on a thread, and the judgement of what each got.

    sync     the SDK's `client.run` (retries with its idempotency key, polls a 202)
    sse      a plain SSE client of `POST /run` with `"stream": true` (httpx, no retries): it shows
             the `output` deltas since the last `restarted` event, ends at a terminal event
    sdk      the SDK's `Stream` (`client.run(..., stream=True)`), joined
    openai   the `openai` client's streamed completion (`max_retries=0`), joined

Every caller must end, within CALL_TIMEOUT_S, with the job's exact output or with an explicit
error that carries the job's id (the SDK's `.job_id`; the OpenAI error's message; for a
connection cut by an API kill, the `X-Job-Id` the caller was answered with): never a hang,
never another text.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from typing import Any

import httpx
import openai

from sdk import Client, JobTimeout, PlatformError, StreamRestarted
from sdk._sse import SSEDecoder

KINDS = ("sync", "sse", "sdk", "openai")
# Each caller's bound: generous against a cold start after a worker kill on a loaded machine.
CALL_TIMEOUT_S = 120.0


@dataclass
class Outcome:
    kind: str  # one of KINDS
    prompt: str  # unique per caller: how its job is found in the ledger
    text: str | None = None  # the text it ended with (None: it raised, or never ended)
    error: str | None = None  # what it raised (type: message)
    error_job_id: str | None = None  # the job the error named (or the X-Job-Id it had)
    seconds: float | None = None  # None: still running at the bound (a hang)
    timed_out: bool = False  # it gave up waiting (a read or wait timeout): a hang as well


class Caller(threading.Thread):
    """One call of `kind` with a unique prompt; `outcome` once it ended."""

    def __init__(self, platform: dict[str, Any], deployment: str, kind: str, prompt: str,
                 max_tokens: int) -> None:  # fmt: skip
        super().__init__(name=f"caller-{kind}", daemon=True)
        self.url, self.key = platform["url"], platform["api_key"]
        self.deployment, self.max_tokens = deployment, max_tokens
        self.outcome = Outcome(kind, prompt)

    def run(self) -> None:
        started = time.monotonic()
        try:
            getattr(self, f"_{self.outcome.kind}")()
        except BaseException as e:  # judged, not lost in the thread
            self.outcome.error = self.outcome.error or f"{type(e).__name__}: {e}"
        self.outcome.seconds = time.monotonic() - started

    def _input(self) -> dict[str, Any]:
        return {"prompt": self.outcome.prompt, "max_tokens": self.max_tokens}

    def _failed(self, e: BaseException, job_id: str | None) -> None:
        self.outcome.error, self.outcome.error_job_id = f"{type(e).__name__}: {e}", job_id
        self.outcome.timed_out = _timeout(e)

    def _sync(self) -> None:
        with Client(base_url=self.url, api_key=self.key, timeout=60) as c:
            try:
                self.outcome.text = c.run(self.deployment, self._input(), timeout=CALL_TIMEOUT_S)
            except PlatformError as e:
                self._failed(e, e.job_id)

    def _sdk(self) -> None:
        with Client(base_url=self.url, api_key=self.key, timeout=60) as c:
            stream = c.run(self.deployment, self._input(), stream=True, timeout=CALL_TIMEOUT_S)
            deltas: list[str] = []
            try:
                deltas.extend(stream)
            except StreamRestarted as e:
                self._failed(e, e.job_id)
                return
            except PlatformError as e:
                self._failed(e, e.job_id or stream.job_id)
                return
            self.outcome.text = "".join(deltas)
            if stream.text != self.outcome.text:
                self.outcome.error = f"Stream.text {stream.text!r} differs from its deltas"

    def _sse(self) -> None:
        body = {"input": self._input(), "stream": True}
        url = f"{self.url}/v1/deployments/{self.deployment}/run"
        job_id: str | None = None
        timeout = httpx.Timeout(30.0, read=30.0)  # keep-alives come every 10 s
        try:
            with httpx.stream("POST", url, json=body, headers=self._auth(), timeout=timeout) as r:
                job_id = r.headers.get("x-job-id")
                r.raise_for_status()
                self._read_sse(r, job_id)
        except httpx.HTTPError as e:
            self._failed(e, job_id)

    def _read_sse(self, r: httpx.Response, job_id: str | None) -> None:
        decoder, text = SSEDecoder(), ""
        for line in r.iter_lines():
            event = decoder.feed(line)
            if event is None:
                continue
            data = json.loads(event.data)
            if event.event == "restarted":
                text = ""
            elif event.event == "output":
                text += data["delta"]
            elif event.event == "completed":
                self.outcome.text = text
                return
            elif event.event in ("failed", "canceled", "expired", "timed_out"):
                self.outcome.error, self.outcome.error_job_id = f"job {event.event}", job_id
                return
        self.outcome.error, self.outcome.error_job_id = "stream ended without its end", job_id

    def _openai(self) -> None:
        oai = openai.OpenAI(base_url=self.url + "/v1", api_key=self.key, max_retries=0,
                            timeout=60)  # fmt: skip
        job_id: str | None = None
        try:
            stream = oai.completions.create(
                model=self.deployment, prompt=self.outcome.prompt, max_tokens=self.max_tokens,
                stream=True, temperature=0,
            )  # fmt: skip
            job_id = stream.response.headers.get("x-job-id")
            parts = [c.text for chunk in stream for c in chunk.choices]
            self.outcome.text = "".join(parts)
        except openai.APIError as e:
            named = job_id if job_id and (job_id in str(e) or isinstance(e, _CUT)) else None
            self._failed(e, named)
        finally:
            oai.close()

    def _auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.key}"}


def _timeout(e: BaseException) -> bool:
    """The caller stopped waiting (its own bound), rather than being told what happened."""
    causes = [e, e.__cause__, e.__context__]
    kinds = (JobTimeout, httpx.TimeoutException, openai.APITimeoutError)
    return any(isinstance(c, kinds) for c in causes)


# A connection the API's death cut: the OpenAI client can only say so; its caller knows the job
# from the X-Job-Id it was answered with.
_CUT = (openai.APIConnectionError,)


def judge(outcome: Outcome, job_id: str | None, status: str | None, output: str | None) -> str:
    """ "ok" (the job's exact output, or an explicit error naming the job) or what was wrong."""
    if outcome.seconds is None:
        return "hang"
    if outcome.timed_out:
        return f"hang (it gave up waiting: {outcome.error})"
    if job_id is None:
        return f"no job for the call ({outcome.error})"
    if outcome.text is not None and outcome.error is None:
        if status != "succeeded":
            return f"a text for a job that ended {status}"
        return "ok" if outcome.text == output else "a different text"
    if outcome.error_job_id != job_id:
        return f"an error without its job's id: {outcome.error}"
    return "ok"
