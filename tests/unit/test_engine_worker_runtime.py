"""The worker runtime around the engine: claim → validate → engine → complete → ack, with
BUSY/IDLE reported as the first job starts and the last one ends, and bad input answered as
``invalid_input`` before anything reaches the engine (fakes for the control plane and Redis)."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Sequence
from typing import Any

import pytest

from common.job_input import JobInput
from common.messages import Assignment, Claim
from common.protocol import WorkerState
from tests.unit.test_engine import WORDS, _engine
from tests.unit.test_engine_loop import FakeRedis
from worker.runtime import lifecycle
from worker.runtime.consumer import Delivery
from worker.runtime.control_client import Report
from worker.runtime.engine_loop import EngineLoop
from worker.runtime.lifecycle import WorkerRuntime
from worker.settings import WorkerSettings


class FakeControl:
    def __init__(self, inputs: dict[str, dict[str, Any]]) -> None:
        self.inputs = inputs
        self.completed: dict[str, dict[str, Any]] = {}
        self.num_completes = 0
        self.states: list[str] = []
        self.lock = threading.Lock()
        self.done = threading.Semaphore(0)

    def claim(self, job_id: str) -> dict[str, Any] | None:
        # as the control plane: the worker holding a running job gets its attempt again
        if job_id not in self.inputs or job_id in self.completed:
            return None
        return {
            "claimed": True,
            "job_id": job_id,
            "attempt": 1,
            "input": self.inputs[job_id],
            "execution_timeout_s": 60,
            "deployment": "demo",
        }

    def complete(self, job_id: str, attempt: int, status: str, **fields: Any) -> bool:
        with self.lock:
            self.completed[job_id] = {"status": status, **fields}
            self.num_completes += 1
        self.done.release()
        return True

    def claims(self, job_ids: Sequence[str]) -> list[dict[str, Any] | None]:
        return [self.claim(job_id) for job_id in job_ids]

    def reports(self, reports: Sequence[Report]) -> list[bool]:
        return [self.complete(r.job_id, r.attempt, r.status, **r.fields) for r in reports]

    def report_state(
        self, state: str, reason: str | None = None, *, takes_handoffs: bool = False
    ) -> None:
        with self.lock:
            self.states.append(state + (" (takes hand-offs)" if takes_handoffs else ""))

    def close(self) -> None:
        pass


def _runtime(inputs: dict[str, dict[str, Any]], max_concurrency: int = 4) -> WorkerRuntime:
    assignment = Assignment("dep_1", 1, "file:///m", "q", max_concurrency)
    rt = WorkerRuntime(WorkerSettings(), "wrk_1", "cpu", assignment)
    rt.control = rt.jobs.control = FakeControl(inputs)  # type: ignore[assignment]
    rt.state = WorkerState.IDLE  # loaded and consuming
    rt.redis = FakeRedis()  # type: ignore[assignment]
    rt.redis.set = lambda *a, **k: None  # type: ignore[attr-defined]
    rt.engine, _ = _engine(lambda rid, i: 2 + i % 3, max_num_seqs=max_concurrency)
    rt.loop = EngineLoop(rt.engine, rt.redis, 0.01, rt.jobs.on_finished)
    rt.jobs.attach(rt.engine, rt.loop)
    rt.loop.start()
    return rt


def _deliver(rt: WorkerRuntime, job_ids: list[str]) -> list[str]:
    acked: list[str] = []
    for job_id in job_ids:
        rt.jobs.handle(Delivery(job_id, 0, lambda j=job_id: acked.append(j)))  # type: ignore[misc]
    return acked


def _wait(rt: WorkerRuntime, n: int, acked: list[str], num_acks: int | None = None) -> None:
    control: FakeControl = rt.control  # type: ignore[assignment]
    for _ in range(n):
        assert control.done.acquire(timeout=10)
    deadline = time.monotonic() + 10
    while len(acked) < (num_acks or n):
        assert time.monotonic() < deadline, "not acked"
        time.sleep(0.01)


def test_jobs_run_together_and_are_reported_then_acked() -> None:
    inputs = {f"j{i}": {"prompt": "Hello", "max_tokens": 3 + i} for i in range(3)}
    rt = _runtime(inputs)
    noted: list[str] = []
    note = rt._note_state
    rt._note_state = lambda state: (noted.append(state.value), note(state))  # type: ignore[method-assign,func-returns-value]
    acked = _deliver(rt, list(inputs))
    _wait(rt, 3, acked)
    rt.loop.stop(timeout_s=5)
    control: FakeControl = rt.control  # type: ignore[assignment]
    for i in range(3):
        done = control.completed[f"j{i}"]
        assert done["status"] == "succeeded"
        assert done["generated_tokens"] == 3 + i
        assert done["prompt_tokens"] == len(rt.engine.encode("Hello"))
        assert done["output"]["finish_reason"] == "length"
        assert done["output"]["text"] == "".join(WORDS[2 + k % 3] for k in range(3 + i))
        assert "ttft_s" in done["output"]["timings"]
    assert sorted(acked) == ["j0", "j1", "j2"]
    # BUSY when the first job starts, IDLE only when the last one ends; noted, not reported:
    # the control plane derives them from the claims and the job ends
    assert noted[0] == "busy" and noted[-1] == "idle" and rt.state is WorkerState.IDLE
    assert control.states == []
    assert rt.jobs.inflight == 0
    assert rt.engine.block_manager.num_free_blocks == rt.engine.cache.num_blocks


def test_a_job_from_idle_to_idle_waits_on_no_heartbeat() -> None:
    """BUSY and IDLE are noted, not beaten: a heartbeat is a Redis round trip, and one at each
    flip sat between the claim and the engine, and again at each job's end."""
    rt = _runtime({"j0": {"prompt": "Hello", "max_tokens": 2}})
    beats: list[str] = []
    rt._beat = lambda: beats.append(rt.state.value)  # type: ignore[method-assign]
    acked = _deliver(rt, ["j0"])
    _wait(rt, 1, acked)
    rt.loop.stop(timeout_s=5)
    assert acked == ["j0"] and rt.state is WorkerState.IDLE
    assert beats == []


def test_a_second_delivery_of_a_job_running_here_does_not_run_it_again() -> None:
    # the claim gives back the attempt this worker holds (a retried claim must get its job)
    rt = _runtime({"j": {"prompt": "Hello", "max_tokens": 40}})
    acked = _deliver(rt, ["j", "j"])
    _wait(rt, 1, acked, num_acks=2)
    rt.loop.stop(timeout_s=5)
    control: FakeControl = rt.control  # type: ignore[assignment]
    assert control.num_completes == 1 and control.completed["j"]["generated_tokens"] == 40
    assert acked == ["j", "j"] and rt.jobs.inflight == 0 and rt.jobs._running == {}


def test_bad_input_fails_as_invalid_input_before_the_engine() -> None:
    inputs = {
        "too-long": {"prompt": "Hello " * 40, "max_tokens": 60},
        "bad-param": {"prompt": "Hello", "temperature": -1},
        "no-prompt": {"max_tokens": 3},
    }
    rt = _runtime(inputs)
    acked = _deliver(rt, [*inputs, "not-claimable"])
    _wait(rt, 3, acked, num_acks=4)
    rt.loop.stop(timeout_s=5)
    control: FakeControl = rt.control  # type: ignore[assignment]
    errors = {k: v["error"] for k, v in control.completed.items()}
    assert all(v["status"] == "failed" for v in control.completed.values())
    assert all(e["type"] == "invalid_input" for e in errors.values())
    assert (
        "prompt tokens + max_tokens 60 exceeds the context window of 64"
        in (errors["too-long"]["message"])
    )
    assert errors["bad-param"]["message"].startswith("temperature: ")
    assert errors["no-prompt"]["message"].startswith("prompt: ")
    assert sorted(acked) == sorted([*inputs, "not-claimable"])
    assert rt.engine.scheduler.num_unfinished == 0 and rt.jobs.inflight == 0


def _filler(rt: WorkerRuntime, fills: list[str]) -> threading.Thread:
    """The runtime's fill thread, its fill recording into the control's state log."""
    control: FakeControl = rt.control  # type: ignore[assignment]

    def fill() -> None:
        with control.lock:
            control.states.append("fill")
        fills.append("fill")

    thread = threading.Thread(target=rt._fill_when_quiet, args=(fill,), daemon=True)
    thread.start()
    return thread


def test_a_worker_stopped_before_its_fill_finishes_it_after_reporting_stopped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Scaled down (SIGTERM) while a job runs: the fill waits for the drain, then runs after
    `stopped` (the tenant's records have ended), with the model let go."""
    monkeypatch.setattr(lifecycle, "FILL_DELAY_S", 0.01)
    rt = _runtime({})
    rt.jobs.inflight = 1  # a job in hand
    fills: list[str] = []
    filler = _filler(rt, fills)
    rt.request_stop(signal.SIGTERM)
    time.sleep(0.3)
    assert fills == [], "the fill waits for the jobs in hand"
    rt.jobs.inflight = 0
    rt.loop.stop(timeout_s=5)
    rt._set_state(WorkerState.STOPPED, reason="drained")
    rt._finish_fill(filler)
    control: FakeControl = rt.control  # type: ignore[assignment]
    assert control.states == ["stopped", "fill"] and not filler.is_alive()
    assert rt.engine is None and rt.loop is None


@pytest.mark.parametrize("signals", [[signal.SIGINT], [signal.SIGTERM, signal.SIGTERM]])
def test_the_platform_shutting_down_or_a_second_signal_skips_the_fill(
    signals: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(lifecycle, "FILL_DELAY_S", 0.01)
    rt = _runtime({})
    rt.jobs.inflight = 1
    fills: list[str] = []
    filler = _filler(rt, fills)
    for signum in signals:
        rt.request_stop(signum)
    rt.jobs.inflight = 0
    rt.loop.stop(timeout_s=5)
    rt._finish_fill(filler)
    filler.join(5)
    assert fills == [] and not filler.is_alive()


def test_an_idle_worker_claims_on_the_consumers_thread_a_busy_one_on_its_pool() -> None:
    """The warm path's claim needs no hop to the pool when nothing else is starting or running
    here; while a job is being started, the next claim goes to the pool, so the consumer's
    thread can take the wake-up after it meanwhile."""
    inputs = {"first": {"prompt": "Hello"}, "second": {"prompt": "Hi"}}
    rt = _runtime(inputs)
    control: FakeControl = rt.control  # type: ignore[assignment]
    claimed_on: dict[str, str] = {}
    first_claimed, release_first = threading.Event(), threading.Event()
    claim = control.claim

    def claim_noting_thread(job_id: str) -> dict[str, Any] | None:
        claimed_on[job_id] = threading.current_thread().name
        if job_id == "first":  # still being claimed when the second wake-up comes
            first_claimed.set()
            assert release_first.wait(10)
        return claim(job_id)

    control.claim = claim_noting_thread  # type: ignore[method-assign]
    acked: list[str] = []
    consumer = threading.Thread(
        target=lambda: acked.extend(_deliver(rt, ["first"])), name="consumer"
    )
    consumer.start()
    assert first_claimed.wait(10)
    acked += _deliver(rt, ["second"])  # the first is starting: this one to the pool
    release_first.set()
    consumer.join(10)
    _wait(rt, 2, acked)
    rt.loop.stop(timeout_s=5)
    assert claimed_on["first"] == "consumer", "an idle worker claims on the consumer's thread"
    assert claimed_on["second"].startswith("jobs"), claimed_on
    assert sorted(control.completed) == ["first", "second"] and sorted(acked) == sorted(inputs)
    assert rt.jobs.inflight == 0 and rt.jobs._starting == 0


def test_a_job_handed_to_the_worker_runs_without_a_claim_and_is_held_until_reported() -> None:
    """A delivery that carries its claim's answer (the admission claimed it for this worker)
    goes to the engine as it is: no claim request. The heartbeat's list of held jobs has it
    from the moment it was handed over until its report."""
    inputs = {"handed": {"prompt": "Hello", "max_tokens": 4}}
    rt = _runtime({})  # the fake control plane knows no job: a claim would find none
    control: FakeControl = rt.control  # type: ignore[assignment]
    claim = Claim("handed", 3, JobInput.from_dict(inputs["handed"]), 60.0, "demo")
    reported = threading.Event()
    held_at_report: list[list[str]] = []
    complete = control.complete

    def complete_and_note(job_id: str, attempt: int, status: str, **fields: Any) -> bool:
        held_at_report.append(rt.jobs.held_jobs())
        assert attempt == 3  # the attempt the admission's claim made
        reported.set()
        return complete(job_id, attempt, status, **fields)

    control.complete = complete_and_note  # type: ignore[method-assign]
    claims: list[Sequence[str]] = []
    control.claims = lambda ids: claims.append(ids) or []  # type: ignore[method-assign,func-returns-value]
    acked: list[str] = []
    rt.jobs.handle(Delivery("handed", 0, lambda: acked.append("handed"), claim=claim))
    assert reported.wait(10)
    _wait(rt, 0, acked, num_acks=1)
    rt.loop.stop(timeout_s=5)
    assert claims == [], "no claim was sent"
    assert control.completed["handed"]["status"] == "succeeded"
    assert control.completed["handed"]["generated_tokens"] == 4
    assert held_at_report == [["handed"]] and rt.jobs.held_jobs() == []
