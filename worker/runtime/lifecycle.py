"""Worker lifecycle: boot → load → warm → serve (idle ⇄ busy) → drain → stopped.

Each transition is reported to the control plane (it closes a billing segment); a heartbeat
in Redis tells the reconciler the worker is alive. SIGTERM means drain: stop taking work,
finish the job in hand, report, exit 0.
"""

from __future__ import annotations

import json
import logging
import signal
import threading
import time
from dataclasses import dataclass
from typing import Any

import redis

from worker.protocol import (
    HEARTBEAT_INTERVAL_S,
    HEARTBEAT_TTL_S,
    EventType,
    WorkerState,
    job_cancel_key,
    job_events_key,
    worker_heartbeat_key,
)
from worker.runtime.consumer import consume
from worker.runtime.control_client import ControlClient
from worker.settings import WorkerSettings

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class WorkerIdentity:
    worker_id: str  # id given by the provider
    deployment_id: str  # deployment served
    deployment_version: int  # spec version served
    model_uri: str  # where the weights are
    accelerator: str  # cpu, h100, ...
    queue: str  # broker queue consumed
    max_concurrency: int  # jobs held at once (1 until the batching engine lands)


class WorkerRuntime:
    def __init__(self, settings: WorkerSettings, identity: WorkerIdentity) -> None:
        self.settings = settings
        self.identity = identity
        self.control = ControlClient(
            settings.internal_url, settings.worker_token.get_secret_value(), identity.worker_id
        )
        self.redis = redis.Redis.from_url(settings.redis_url)
        self.state = WorkerState.BOOTING
        self.inflight = 0
        self._stop = threading.Event()
        self.generator: Any = None

    # lifecycle ------------------------------------------------------------------------------

    def request_stop(self, *_: Any) -> None:
        self._stop.set()

    def _set_state(self, state: WorkerState, reason: str | None = None) -> None:
        self.state = state
        self.control.report_state(state.value, reason)
        self._beat()

    def _beat(self) -> None:
        beat = {
            "worker_id": self.identity.worker_id,
            "deployment_id": self.identity.deployment_id,
            "state": self.state.value,
            "inflight": self.inflight,
            "at": time.time(),
        }
        try:
            self.redis.set(
                worker_heartbeat_key(self.identity.worker_id), json.dumps(beat), ex=HEARTBEAT_TTL_S
            )
        except redis.RedisError as exc:
            log.warning("heartbeat failed: %s", exc)

    def _heartbeat_loop(self) -> None:
        while not self._done.wait(HEARTBEAT_INTERVAL_S):
            self._beat()

    def run(self) -> int:
        signal.signal(signal.SIGTERM, self.request_stop)
        signal.signal(signal.SIGINT, self.request_stop)
        self._done = threading.Event()
        threading.Thread(target=self._heartbeat_loop, name="heartbeat", daemon=True).start()
        try:
            self._set_state(WorkerState.LOADING)
            from worker.runtime.loading import load_generator

            self.generator = load_generator(self.identity.model_uri)
            self._set_state(WorkerState.WARMING)
            self._warm_up()
            self._set_state(WorkerState.IDLE)
            consume(
                self.settings.redis_url,
                self.identity.queue,
                self.identity.max_concurrency,
                self._handle,
                self._stop.is_set,
            )
            self._set_state(WorkerState.DRAINING)
            self._set_state(WorkerState.STOPPED, reason="drained")
            return 0
        except Exception as exc:
            log.exception("worker failed")
            try:
                # The reason reaches users through crash-loop errors: type and message, short.
                self._set_state(WorkerState.FAILED, reason=f"{type(exc).__name__}: {exc}"[:100])
            except Exception:
                log.exception("could not report the failure")
            return 1
        finally:
            self._done.set()
            self.control.close()

    def _warm_up(self) -> None:
        from worker.engine.sampling import SamplingParams

        # One short generation compiles kernels and touches every weight once.
        self.generator.run("warm up", SamplingParams(max_tokens=2))

    # jobs -----------------------------------------------------------------------------------

    def _handle(self, job_id: str) -> None:
        claim = self.control.claim(job_id)
        if claim is None:
            log.info("job %s not claimable (done, canceled or taken); skipping", job_id)
            return
        self.inflight += 1
        self._set_state(WorkerState.BUSY)
        try:
            self._execute(job_id, claim)
        finally:
            self.inflight -= 1
            self._set_state(WorkerState.IDLE)

    def _execute(self, job_id: str, claim: dict[str, Any]) -> None:
        from worker.engine.sampling import SamplingParams

        attempt = int(claim["attempt"])
        inp = claim["input"]
        deadline = time.monotonic() + float(claim.get("execution_timeout_s", 600))
        events_key = job_events_key(job_id)
        cancel_key = job_cancel_key(job_id)
        next_poll = 0.0
        reason_holder: dict[str, str] = {}

        def should_abort() -> bool:
            nonlocal next_poll
            now = time.monotonic()
            if now > deadline:
                reason_holder["why"] = "timed_out"
                return True
            if now >= next_poll:
                next_poll = now + self.settings.cancel_poll_s
                if self.redis.exists(cancel_key):
                    reason_holder["why"] = "canceled"
                    return True
            return False

        try:
            params = SamplingParams(
                max_tokens=int(inp.get("max_tokens", 64)),
                temperature=float(inp.get("temperature", 0.0)),
                top_p=float(inp.get("top_p", 1.0)),
                seed=inp.get("seed"),
                stop=_stop_strings(inp.get("stop")),
            )
            prompt_ids = self.generator.encode(inp["prompt"])
            self.generator.validate(prompt_ids, params)
        except ValueError as exc:
            self.control.complete(
                job_id,
                attempt,
                "failed",
                error={"type": "invalid_input", "message": str(exc)},
            )
            return

        text: list[str] = []
        finish_reason = "length"
        generated = 0
        try:
            for step in self.generator.generate(inp["prompt"], params, should_abort):
                # An aborted run ends with a step that carries no token (NO_TOKEN).
                if step.token_id >= 0:
                    generated += 1
                if step.text_delta:
                    text.append(step.text_delta)
                    self.redis.xadd(
                        events_key,
                        {
                            "type": EventType.OUTPUT.value,
                            "data": json.dumps({"delta": step.text_delta}),
                        },
                    )
                if step.finished:
                    finish_reason = step.finish_reason or "stop"
        except Exception as exc:
            log.exception("generation failed for job %s", job_id)
            self.control.complete(
                job_id,
                attempt,
                "failed",
                error={"type": "model_error", "message": f"{type(exc).__name__}: {exc}"},
            )
            return
        status = "succeeded"
        if finish_reason == "abort":
            status = "timed_out" if reason_holder.get("why") == "timed_out" else "canceled"
        accepted = self.control.complete(
            job_id,
            attempt,
            status,
            output={"text": "".join(text), "finish_reason": finish_reason},
            prompt_tokens=len(prompt_ids),
            generated_tokens=generated,
        )
        log.info(
            "job %s attempt %d %s: %d prompt tokens, %d generated%s",
            job_id,
            attempt,
            status,
            len(prompt_ids),
            generated,
            "" if accepted else " (report fenced off)",
        )


def _stop_strings(raw: Any) -> tuple[str, ...]:
    """Stop strings as a tuple; a bare string is one stop string, not its characters."""
    if raw is None:
        return ()
    if isinstance(raw, str):
        return (raw,)
    return tuple(str(s) for s in raw)
