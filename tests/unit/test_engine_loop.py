"""The worker's engine thread: many jobs in one engine, deltas streamed in one pipeline per
step, cancel flags and deadlines, engine failures; and the consumer's message helpers.
(A fake Redis here; the end-to-end tests run the real one.)"""

from __future__ import annotations

import json
import queue
import threading
import time
from collections import defaultdict
from typing import Any

import pytest

from common.protocol import job_cancel_key, job_events_key
from tests.unit.test_engine import BOS, ScriptedRunner, _engine
from worker.engine.params import SamplingParams
from worker.runtime.consumer import _acker, priority_of
from worker.runtime.engine_loop import EngineLoop, Job, JobResult


class FakeRedis:
    def __init__(self) -> None:
        self.streams: dict[str, list[dict[str, Any]]] = defaultdict(list)
        self.keys: set[str] = set()
        self.pipelines = 0

    def pipeline(self, transaction: bool = False) -> FakePipeline:
        self.pipelines += 1
        return FakePipeline(self)


class FakePipeline:
    def __init__(self, redis: FakeRedis) -> None:
        self.redis = redis
        self.ops: list[Any] = []

    def exists(self, key: str) -> None:
        self.ops.append(lambda: int(key in self.redis.keys))

    def xadd(self, key: str, fields: dict[str, Any], **_: Any) -> None:
        self.ops.append(lambda: self.redis.streams[key].append(fields))

    def execute(self) -> list[Any]:
        return [op() for op in self.ops]


class Harness:
    def __init__(
        self, script: Any = lambda rid, i: 2, cancel_poll_s: float = 0.01, **config: Any
    ) -> None:
        self.engine, self.runner = _engine(script, **config)
        self.redis = FakeRedis()
        self.results: queue.SimpleQueue[tuple[Job, JobResult]] = queue.SimpleQueue()
        self.loop = EngineLoop(
            self.engine,
            self.redis,  # type: ignore[arg-type]
            cancel_poll_s=cancel_poll_s,
            on_finished=lambda job, result: self.results.put((job, result)),
        )
        self.loop.start()

    def job(self, job_id: str, max_tokens: int = 4, deadline_s: float = 60.0) -> Job:
        params = SamplingParams(max_tokens=max_tokens)
        return Job(job_id, 1, [BOS, 2], params, time.monotonic() + deadline_s)

    def wait(self, n: int) -> dict[str, JobResult]:
        out = {}
        for _ in range(n):
            job, result = self.results.get(timeout=10)
            out[job.job_id] = result
        return out

    def deltas(self, job_id: str) -> str:
        return "".join(
            json.loads(e["data"])["delta"] for e in self.redis.streams[job_events_key(job_id)]
        )


def test_jobs_share_the_engine_and_stream_their_text() -> None:
    h = Harness(max_num_seqs=4)
    for i in range(5):
        h.loop.submit(h.job(f"j{i}", max_tokens=3 + i))
    results = h.wait(5)
    h.loop.stop(timeout_s=5)
    for i in range(5):
        r = results[f"j{i}"]
        assert r.status == "succeeded" and r.error is None
        assert r.output is not None
        assert r.output["text"] == "Hello" * (3 + i) == h.deltas(f"j{i}")
        assert r.output["finish_reason"] == "length" and r.output["cached_tokens"] == 0
        assert set(r.output["timings"]) >= {"queue_s", "ttft_s", "itl_mean_s"}
        assert (r.prompt_tokens, r.generated_tokens) == (2, 3 + i)
        # each delta names its attempt and where it starts in the attempt's text
        entries = [json.loads(e["data"]) for e in h.redis.streams[job_events_key(f"j{i}")]]
        offsets = [len("".join(e["delta"] for e in entries[:k])) for k in range(len(entries))]
        assert [(e["attempt"], e["offset"]) for e in entries] == [(1, o) for o in offsets]
    # one pipeline per step for all deltas (plus cancel polls), not one round trip per token
    assert h.redis.pipelines < sum(3 + i for i in range(5)) * 2
    assert not h.loop._thread.is_alive()


def test_cancel_flag_and_deadline_abort_jobs() -> None:
    gate = threading.Event()

    def slow(rid: str, i: int) -> int:
        gate.wait(0.01)
        return 2

    h = Harness(slow, max_num_seqs=4)
    h.loop.submit(h.job("cancel-me", max_tokens=10_000 // 200))
    h.loop.submit(h.job("too-slow", max_tokens=50, deadline_s=0.05))
    h.loop.submit(h.job("fine", max_tokens=3))
    h.redis.keys.add(job_cancel_key("cancel-me"))
    results = h.wait(3)
    h.loop.stop(timeout_s=5)
    assert results["cancel-me"].status == "canceled"
    assert results["too-slow"].status == "timed_out"
    assert results["fine"].status == "succeeded"
    for r in (results["cancel-me"], results["too-slow"]):
        assert r.output is not None and r.output["finish_reason"] == "abort"
    assert h.engine.block_manager.num_free_blocks == h.engine.cache.num_blocks


def test_a_job_just_claimed_starts_without_a_cancel_poll() -> None:
    """Its claim found it not canceled: the engine's first step for it makes no round trip
    for its flag (the one pipeline is its delta); a job in flight for longer is polled."""
    h = Harness(cancel_poll_s=5.0, max_num_seqs=4)
    h.loop.submit(h.job("short", max_tokens=1))
    assert h.wait(1)["short"].status == "succeeded"
    assert h.redis.pipelines == 1 and h.deltas("short") == "Hello"
    h.loop.stop(timeout_s=5)

    def slow(rid: str, i: int) -> int:
        time.sleep(0.01)
        return 2

    h = Harness(slow, cancel_poll_s=0.05, max_num_seqs=4)
    h.loop.submit(h.job("long", max_tokens=60))  # ~0.6 s
    time.sleep(0.2)  # past its first poll
    h.redis.keys.add(job_cancel_key("long"))
    assert h.wait(1)["long"].status == "canceled"
    h.loop.stop(timeout_s=5)


def test_engine_failure_fails_the_jobs_in_flight_and_keeps_serving() -> None:
    calls = {"n": 0}

    def flaky(rid: str, i: int) -> int:
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("device lost")
        return 2

    h = Harness(flaky)
    h.loop.submit(h.job("a", max_tokens=5))
    first = h.wait(1)["a"]
    assert first.status == "failed"
    assert first.error == {"type": "model_error", "message": "RuntimeError: device lost"}
    h.loop.submit(h.job("b", max_tokens=2))
    assert h.wait(1)["b"].status == "succeeded"
    h.loop.stop(timeout_s=5)


def test_a_duplicate_job_is_refused_not_run_twice() -> None:
    h = Harness(lambda rid, i: (time.sleep(0.005), 2)[1])
    h.loop.submit(h.job("dup", max_tokens=20))
    h.loop.submit(h.job("dup", max_tokens=20))
    results = [h.results.get(timeout=10)[1] for _ in range(2)]
    h.loop.stop(timeout_s=5)
    assert sorted(r.status for r in results) == ["failed", "succeeded"]
    failed = next(r for r in results if r.status == "failed")
    assert failed.error is not None and "already running" in failed.error["message"]


def test_consumer_helpers() -> None:
    assert priority_of({"priority": 3}) == 3
    assert priority_of({}) == 0
    assert priority_of({"priority": "x"}) == 0
    done: queue.SimpleQueue[Any] = queue.SimpleQueue()
    ack = _acker(done, "message")  # type: ignore[arg-type]
    ack()
    ack()  # idempotent: a message is acknowledged once
    assert done.get_nowait() == "message"
    with pytest.raises(queue.Empty):
        done.get_nowait()


def test_runner_is_released_for_every_job() -> None:
    h = Harness()
    h.loop.submit(h.job("x", max_tokens=2))
    h.wait(1)
    h.loop.stop(timeout_s=5)
    assert isinstance(h.runner, ScriptedRunner) and h.runner.released == ["x"]


def test_a_job_of_n_choices_prefills_once_and_streams_each_choice() -> None:
    h = Harness(max_num_seqs=8, enable_prefix_caching=True)
    prompt = [BOS, *[2] * 9]  # two full 4-token blocks and a partial one
    job = Job("many", 1, prompt, SamplingParams(max_tokens=3), time.monotonic() + 60, n=3)
    h.loop.submit(job)
    (result,) = h.wait(1).values()
    h.loop.stop(timeout_s=5)
    assert result.status == "succeeded" and result.output is not None
    choices = result.output["choices"]
    assert [c["index"] for c in choices] == [0, 1, 2]
    assert all(c["text"] == "Hello" * 3 and c["finish_reason"] == "length" for c in choices)
    # the prompt counts once, every choice's tokens count
    assert (result.prompt_tokens, result.generated_tokens) == (len(prompt), 9)
    # the first choice computed the prompt; the others found its full blocks cached
    assert choices[0]["cached_tokens"] == 0
    assert all(c["cached_tokens"] == 8 for c in choices[1:])
    entries = [json.loads(e["data"]) for e in h.redis.streams[job_events_key("many")]]
    for index in range(3):
        text = "".join(e["delta"] for e in entries if e.get("index", 0) == index)
        assert text == "Hello" * 3
    assert h.engine.block_manager.num_free_blocks == h.engine.cache.num_blocks


def test_canceling_a_job_of_n_choices_aborts_them_all() -> None:
    def slow(rid: str, i: int) -> int:
        time.sleep(0.02)
        return 2

    h = Harness(slow, max_num_seqs=8)
    job = Job("many", 1, [BOS, 2], SamplingParams(max_tokens=50), time.monotonic() + 60, n=4)
    h.loop.submit(job)
    time.sleep(0.1)
    h.redis.keys.add(job_cancel_key("many"))
    (result,) = h.wait(1).values()
    h.loop.stop(timeout_s=5)
    assert result.status == "canceled"
    assert h.engine.block_manager.num_free_blocks == h.engine.cache.num_blocks
    assert not h.engine.has_unfinished_requests()
