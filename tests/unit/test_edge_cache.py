"""EdgeCache's rules with a fake Redis and clock: entries live for one generation and at most
MAX_AGE_S, failures are never cached, an unreadable generation reads through."""

from __future__ import annotations

from typing import Any

import pytest
import redis

from control_plane.errors import NotFound
from control_plane.services.tenants.edge_cache import MAX_AGE_S, EdgeCache


class FakeRedis:
    def __init__(self) -> None:
        self.generation: int | None = 0

    def get(self, _key: str) -> bytes | None:
        if self.generation is None:
            raise redis.ConnectionError("down")
        return str(self.generation).encode()


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def lookup(cache: EdgeCache, loads: list[int], value: Any = "v") -> Any:
    view = cache.view()

    def load() -> Any:
        loads.append(1)
        if isinstance(value, Exception):
            raise value
        return value

    return cache._lookup("tenant", "t1", view.generation, load)


def test_an_entry_serves_its_generation_until_it_is_too_old() -> None:
    r, clock, loads = FakeRedis(), Clock(), []
    cache = EdgeCache(r, clock)  # type: ignore[arg-type]
    assert lookup(cache, loads) == "v" and lookup(cache, loads) == "v"
    assert len(loads) == 1
    r.generation = 1  # a committed change somewhere
    lookup(cache, loads)
    assert len(loads) == 2
    clock.t += MAX_AGE_S  # a lost bump cannot keep an entry forever
    lookup(cache, loads)
    assert len(loads) == 3


def test_failures_are_not_cached_and_a_down_redis_reads_through() -> None:
    r, loads = FakeRedis(), []
    cache = EdgeCache(r, Clock())  # type: ignore[arg-type]
    for _ in range(2):
        with pytest.raises(NotFound):
            lookup(cache, loads, NotFound("no such deployment"))
    assert len(loads) == 2
    lookup(cache, loads)
    r.generation = None
    lookup(cache, loads)
    lookup(cache, loads)
    assert len(loads) == 5
