"""What the tests of callers across faults share: two API processes' apps served over real HTTP
on one database and a Redis of the test's own (the callers wait on one, the worker reports to
the other, as with `PLATFORM_API_PROCESSES=2`: an end then reaches the caller through Redis, not
handed over in its process), a worker's part driven from the test (claim, stream deltas as
the engine loop writes them, complete), and the callers: a sync call, a raw SSE stream, the
SDK's Stream and the OpenAI client's stream.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import redis

from common.protocol import JOB_EVENTS_MAXLEN, EventType, job_events_key
from control_plane.api.app import create_app
from control_plane.db.migrate import upgrade
from control_plane.db.session import make_engine, make_sessionmaker
from control_plane.domain.plans.actions import TakeBack
from control_plane.reconcile.actuator import Actuator
from control_plane.reconcile.env import Env
from control_plane.services.jobs.dispatch import make_celery
from control_plane.settings import Settings
from sdk._sse import SSEDecoder
from tests.integration.api_helpers import SPEC, WORKER, WORKER_TOKEN, h, served, tenant_keys
from tests.integration.killable_redis import KillableRedis


@dataclass
class Apis:
    caller: str  # base URL of the API the callers use
    reports: str  # base URL of the other API process, the worker's
    key: str  # a tenant's admin key; its deployment `demo` exists
    settings: Settings
    redis_server: KillableRedis


@contextlib.contextmanager
def two_apis(tmp_path: Path, redis_server: KillableRedis) -> Iterator[Apis]:
    tmp_path.mkdir(parents=True, exist_ok=True)
    database_url = f"sqlite:///{tmp_path / 'platform.db'}"
    upgrade(database_url)
    settings = Settings(
        database_url=database_url,
        redis_url=redis_server.url,
        worker_token=WORKER_TOKEN,
        validate_models=False,  # the deployed model does not exist; no worker loads it
    )
    key = tenant_keys(database_url)["a"]
    with served(create_app(settings)) as a, served(create_app(settings)) as b:
        caller, reports = f"http://{a}", f"http://{b}"
        assert httpx.post(caller + "/v1/deployments", json=SPEC, headers=h(key)).is_success
        yield Apis(caller, reports, key, settings, redis_server)


class Worker:
    """A worker's part, through the reports' API process and Redis: what `worker/runtime`
    sends, without an engine."""

    def __init__(self, apis: Apis) -> None:
        self.apis = apis
        self.redis = redis.Redis.from_url(apis.settings.redis_url)

    def job_waiting(self, other_than: set[str] = frozenset(), timeout_s: float = 10.0) -> str:  # type: ignore[assignment]
        """The id of the tenant's newest job, once there is one not in `other_than`."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            r = httpx.get(self.apis.caller + "/v1/jobs", headers=h(self.apis.key))
            ids = [str(j["id"]) for j in r.json()["data"]] if r.is_success else []
            if ids and ids[0] not in other_than:
                return ids[0]
            time.sleep(0.02)
        raise AssertionError("no job was created")

    def claim(self, job_id: str) -> int:
        r = httpx.post(
            f"{self.apis.reports}/internal/jobs/{job_id}/claim",
            json={"worker_id": "wrk_test"},
            headers=WORKER,
        )
        assert r.status_code == 200, r.text
        return int(r.json()["attempt"])

    def stream(
        self, job_id: str, attempt: int, text: str, *, piece: int = 5, lose: set[int] = frozenset()
    ) -> None:
        """`text` as deltas of `attempt`, `piece` characters each; those numbered in `lose`
        are never written (lost in a Redis restart)."""
        for n, at in enumerate(range(0, len(text), piece)):
            if n in lose:
                continue
            data = {"delta": text[at : at + piece], "attempt": attempt, "offset": at}
            body = {"type": EventType.OUTPUT.value, "data": json.dumps(data)}
            self.redis.xadd(job_events_key(job_id), body, maxlen=JOB_EVENTS_MAXLEN)  # type: ignore[arg-type]

    def complete(self, job_id: str, attempt: int, text: str) -> None:
        body = {
            "worker_id": "wrk_test",
            "attempt": attempt,
            "status": "succeeded",
            "output": {"text": text, "finish_reason": "stop"},
            "prompt_tokens": 1,
            "generated_tokens": 1,
        }
        r = httpx.post(
            f"{self.apis.reports}/internal/jobs/{job_id}/complete", json=body, headers=WORKER
        )
        assert r.status_code == 200, r.text

    def lose(self, job_id: str, attempt: int) -> None:
        """Its worker died: the reconciler takes the job back as a new attempt."""
        from bench.reconciler_tick import RecordingProvider

        s = self.apis.settings
        env = Env(s, self.redis, make_celery(s), RecordingProvider())
        engine = make_engine(s.database_url)
        with make_sessionmaker(engine)() as session:
            act = Actuator(session, env, datetime.now(UTC))
            act.apply([TakeBack(job_id, attempt, datetime.now(UTC), "worker_lost")])
            act.commit()
        engine.dispose()

    def close(self) -> None:
        self.redis.close()


@dataclass
class Caller:
    """One call on a thread: `result` once it returned, `error` if it raised."""

    call: Callable[[], Any]
    result: Any = None
    error: BaseException | None = None
    ended_at: float | None = None  # time.monotonic() when it returned or raised
    thread: threading.Thread = field(init=False)

    def __post_init__(self) -> None:
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self.result = self.call()
        except BaseException as e:  # surfaced by the test, not lost in the thread
            self.error = e
        self.ended_at = time.monotonic()

    def join(self, timeout_s: float) -> Any:
        self.thread.join(timeout_s)
        assert not self.thread.is_alive(), f"the call did not end within {timeout_s:g} s"
        if self.error is not None:
            raise self.error
        return self.result


@dataclass
class RawStream:
    events: list[tuple[str, dict[str, Any]]]  # (event, data) in order, keep-alives left out
    text: str  # the output deltas since the last `restarted`, joined: what a client shows


def raw_sse(apis: Apis, prompt: str = "x", timeout_s: float = 60.0) -> RawStream:
    """A streamed run read as a plain SSE client does, until the stream ends."""
    decoder, out, text = SSEDecoder(), [], ""
    body = {"input": {"prompt": prompt}, "stream": True}
    url = f"{apis.caller}/v1/deployments/demo/run"
    with httpx.stream("POST", url, json=body, headers=h(apis.key), timeout=timeout_s) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            event = decoder.feed(line)
            if event is None:
                continue
            data = json.loads(event.data)
            out.append((event.event, data))
            if event.event == "restarted":
                text = ""
            elif event.event == "output":
                text += data["delta"]
    return RawStream(out, text)
