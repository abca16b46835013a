"""worker.runtime.batching.Combiner: items that wait together go in one request."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import pytest

from worker.runtime.batching import Combiner


class Gate:
    """A `send` that records each request and holds it until released."""

    def __init__(self) -> None:
        self.requests: list[list[int]] = []
        self.entered = threading.Semaphore(0)
        self.release = threading.Event()
        self.fail_on: int | None = None  # an item whose request raises

    def send(self, items: Sequence[int]) -> list[str]:
        self.requests.append(list(items))
        self.entered.release()
        assert self.release.wait(5)
        if self.fail_on in items:
            raise ConnectionError("control plane unreachable")
        return [f"answer {i}" for i in items]


def test_a_lone_item_is_sent_at_once_alone() -> None:
    gate = Gate()
    gate.release.set()
    c = Combiner(gate.send, max_inflight=1, max_items=8)
    assert c.call(1) == "answer 1"
    assert c.call(2) == "answer 2"
    assert gate.requests == [[1], [2]]


def _wait_queued(c: Combiner[int, str], n: int) -> None:
    """Until `n` items wait in `c`'s queue (the callers are blocked behind a request)."""
    for _ in range(500):
        with c._cv:
            if len(c._queue) == n:
                return
        threading.Event().wait(0.01)
    raise AssertionError(f"{n} items never queued")


def test_items_that_wait_together_go_in_one_request_and_each_gets_its_answer() -> None:
    gate = Gate()
    c = Combiner(gate.send, max_inflight=1, max_items=3)
    with ThreadPoolExecutor(8) as pool:
        first = pool.submit(c.call, 0)
        assert gate.entered.acquire(timeout=5)  # the first request is under way
        rest = [pool.submit(c.call, i) for i in range(1, 6)]
        _wait_queued(c, 5)
        gate.release.set()
        answers = [first.result(5)] + [f.result(5) for f in rest]
    assert answers == [f"answer {i}" for i in range(6)]
    # the five that waited went in two requests: max_items, then the rest, in order
    assert gate.requests == [[0], [1, 2, 3], [4, 5]]
    assert c.sent == (3, 6)


def test_a_failed_request_fails_its_items_only() -> None:
    gate = Gate()
    gate.fail_on = 2
    c = Combiner(gate.send, max_inflight=1, max_items=2)
    with ThreadPoolExecutor(8) as pool:
        first = pool.submit(c.call, 0)
        assert gate.entered.acquire(timeout=5)
        rest = [pool.submit(c.call, i) for i in (1, 2, 3)]
        _wait_queued(c, 3)
        gate.release.set()
        assert first.result(5) == "answer 0"
        with pytest.raises(ConnectionError):
            rest[0].result(5)
        with pytest.raises(ConnectionError):
            rest[1].result(5)
        assert rest[2].result(5) == "answer 3"
    assert gate.requests == [[0], [1, 2], [3]]


def test_requests_in_flight_are_bounded() -> None:
    gate = Gate()
    c = Combiner(gate.send, max_inflight=2, max_items=8)
    with ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(c.call, 0), pool.submit(c.call, 1)]
        assert gate.entered.acquire(timeout=5) and gate.entered.acquire(timeout=5)
        futures += [pool.submit(c.call, i) for i in (2, 3, 4)]
        _wait_queued(c, 3)  # both slots taken: the third waits
        assert len(gate.requests) == 2
        gate.release.set()
        assert [f.result(5) for f in futures] == [f"answer {i}" for i in range(5)]
    assert sorted(map(sorted, gate.requests)) == [[0], [1], [2, 3, 4]]


def test_a_wrong_number_of_answers_fails_the_request() -> None:
    c: Combiner[int, str] = Combiner(lambda items: ["one"], max_inflight=1, max_items=4)
    assert c.call(7) == "one"
    c2: Combiner[int, str] = Combiner(lambda items: [], max_inflight=1, max_items=4)
    with pytest.raises(RuntimeError, match="0 answers to 1 items"):
        c2.call(7)


def test_limits_must_be_positive() -> None:
    with pytest.raises(ValueError):
        Combiner(lambda items: [], max_inflight=0, max_items=4)
