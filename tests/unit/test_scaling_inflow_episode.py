"""The arrival rate read off the work present (`scaling/inflow.py`) and the queueing a level
spares while a replacement would boot (`scaling/episode.py`), on a fake clock."""

from __future__ import annotations

import math
import random

import pytest

from control_plane.domain.scaling.episode import Episode, advance_levels
from control_plane.domain.scaling.inflow import observe
from control_plane.domain.scaling.policy import PANIC_WINDOW_S
from control_plane.domain.scaling.queueing import MAX_EXACT_SLOTS, workers_for_stream

T0 = 1_000_000.0
SERVICE_S = 4.0
TICK_S = 2.0


def test_a_surge_shows_in_the_inflow_within_a_few_ticks() -> None:
    # 8 jobs running on one worker, the queue growing by 6 a tick: 3 arrivals a second, and
    # the 8 running jobs end 2 a second (4 a tick, replaced from the queue)
    inflow = observe(None, T0, 8, 8, SERVICE_S)
    assert inflow.rate == 0.0
    for i in range(1, 4):
        inflow = observe(inflow, T0 + TICK_S * i, 8 + 6 * i, 8, SERVICE_S)
    seen = (6 + TICK_S * 8 / SERVICE_S) / TICK_S  # 5 a second
    assert inflow.rate == pytest.approx(seen * (1 - math.exp(-3 * TICK_S / PANIC_WINDOW_S)))
    assert inflow.rate > 3.0


def test_a_steady_stream_reads_as_its_rate_and_a_batch_fades() -> None:
    # 16 jobs running throughout, 4 end and 4 arrive each tick: 2 a second
    inflow = observe(None, T0, 16, 16, SERVICE_S)
    for i in range(1, 30):
        inflow = observe(inflow, T0 + TICK_S * i, 16, 16, SERVICE_S)
    assert inflow.rate == pytest.approx(16 / SERVICE_S, rel=1e-2)
    # a batch of 40 at once, then nothing more: its jobs end and nothing replaces them
    at = T0 + TICK_S * 30
    inflow = observe(inflow, at, 56, 16, SERVICE_S)
    high = inflow.rate
    demand = 56.0
    for i in range(1, 10):
        demand -= TICK_S * 16 / SERVICE_S
        inflow = observe(inflow, at + TICK_S * i, round(demand), 16, SERVICE_S)
    assert high > 5 and inflow.rate < 0.5


def spared(demands: list[tuple[float, float]], below: float, slots: float) -> float:
    """Caller-seconds spared over ticks of (demand, running), the first at the need."""
    episode = Episode(T0)
    for demand, running in demands:  # the first tick's counts stand for the tick before it
        episode = episode.advance(TICK_S, demand, running, SERVICE_S, below, slots)
    return episode.spared_s


def test_a_level_spares_nothing_where_the_workers_below_hold_the_work() -> None:
    assert spared([(8.0, 8.0)] * 15, below=8.0, slots=8.0) == 0.0


def test_a_batch_the_level_serves_at_once_is_priced_by_the_queue_it_spares() -> None:
    # 24 jobs at once, served by three workers of 8 slots: without the third, 8 jobs queue
    # until the first slots free (a service time, 4 s) and the rest follow; with it, none
    demands = [(24.0, 24.0), (12.0, 12.0), (0.0, 0.0)] + [(0.0, 0.0)] * 12
    s = spared(demands, below=16.0, slots=8.0)
    assert 8 * TICK_S <= s <= 8 * 2 * SERVICE_S


def test_a_backlog_that_outlasts_the_boot_is_priced_by_the_queue_it_grows() -> None:
    # a stream that keeps three workers' slots full: without the third worker, its 8 jobs
    # wait, and 2 more a second pile up behind them (the arrivals the third would have served)
    demands = [(24.0, 24.0)] * 15
    s = spared(demands, below=16.0, slots=8.0)
    piled = sum(8 + 8 / SERVICE_S * TICK_S * i for i in range(15)) * TICK_S
    assert s == pytest.approx(piled)


def test_a_bursts_levels_advance_together_as_each_would_alone() -> None:
    # Levels whose episodes began at the same need share a queue (one's with it is the next
    # one's without it); others, begun at other needs or with a level between them without an
    # episode, share nothing. Every episode ends where its own `advance` takes it.
    rng = random.Random(9)
    for _ in range(300):
        target = rng.choice([1, 4, 8])
        episodes: list[Episode | None] = [None]
        x = 0.0
        for _ in range(rng.randint(0, 20)):
            if rng.random() < 0.2:
                episodes.append(None)
                continue
            if rng.random() < 0.4:  # begun at another need: its own x
                x = rng.uniform(-20, 20)
            below, x = x, rng.uniform(-20, 20)
            episodes.append(Episode(T0, below, x))
        for _ in range(rng.randint(1, 15)):
            demand = float(rng.randint(0, 200))
            running = float(rng.randint(0, int(demand)))
            service_s = rng.choice([0.0, SERVICE_S, rng.uniform(0.5, 30)])
            alone = [
                None
                if e is None
                else e.advance(TICK_S, demand, running, service_s, k * target, target)
                for k, e in enumerate(episodes)
            ]
            together, _ = advance_levels(episodes, TICK_S, demand, running, service_s, target)
            assert together == alone
            episodes = together


def test_a_stream_gets_the_workers_whose_queueing_is_worth_their_cost() -> None:
    # one call a second of 4 s each (4 slots busy on average) on workers of 8 slots, a
    # caller-second of waiting priced at 20 worker-seconds (a 600 s penalty, 30 s boots):
    # with one worker a call waits 0.059 s on average (Erlang C), 1.2 worker-seconds a second
    # that a second worker spares, for 1 worker-second
    assert workers_for_stream(1.0, 4.0, 8, 20.0, 100) == 2
    # ... priced ten times lower, the queueing no longer pays for it
    assert workers_for_stream(1.0, 4.0, 8, 2.0, 100) == 1
    # ... nor where callers may wait 10 s for a slot (the owner's allowance)
    assert workers_for_stream(1.0, 4.0, 8, 20.0, 100, wait_s=10.0) == 1
    # never fewer than keep up with the load, never more than the ceiling, none for no load
    assert workers_for_stream(10.0, 4.0, 8, 0.0, 100) == 6  # 40 slots busy: 48 keep up
    assert workers_for_stream(10.0, 4.0, 8, 20.0, 3) == 3
    assert workers_for_stream(0.0, 4.0, 8, 20.0, 100) == 0
    counts = [workers_for_stream(r / 4, 4.0, 8, 20.0, 1000) for r in range(1, 200)]
    assert counts == sorted(counts)


def _plain_workers_for_stream(
    rate: float, service_s: float, target: int, price: float, max_workers: int, wait_s: float
) -> int:
    """`workers_for_stream` as its docstring says, computed the plain way: Erlang B from no
    slots for every count of workers tried."""
    load = rate * service_s
    if load <= 0.0:
        return 0
    m = max(math.floor(load / target) + 1, 1)
    if m * target > MAX_EXACT_SLOTS:
        return min(math.ceil((load + 3.0 * math.sqrt(load)) / target), max_workers)
    if m > max_workers:
        return max_workers
    service_s = max(service_s, 1e-3)

    def wait(workers: int) -> float:
        slots, b = workers * target, 1.0
        for k in range(1, slots + 1):
            b = load * b / (k + load * b)
        theta = (slots - load) / service_s
        erlang_c = slots * b / (slots - load * (1.0 - b))
        return erlang_c * math.exp(-theta * wait_s) * (wait_s + 1.0 / theta)

    while m < max_workers and rate * (wait(m) - wait(m + 1)) * price > 1.0:
        m += 1
    return m


def test_a_streams_workers_match_the_plain_computation() -> None:
    # The recursion runs once over the slots, over floats, past MAX_EXACT_SLOTS as ints: the
    # same counts as recomputing Erlang B for every count tried, at any load and any width.
    rng = random.Random(11)
    cases = [
        (rng.expovariate(1 / rng.choice([0.5, 5.0, 50.0])), rng.uniform(0.01, 30), t, p, 10_000)
        for t in (1, 4, 8)
        for p in (2.0, 20.0, 200.0)
        for _ in range(40)
    ]
    # streams whose first count is just under MAX_EXACT_SLOTS and whose next workers pass it
    cases += [(r, 1.0, 1, 10_000.0, 10_000) for r in (4_000.0, 4_090.0, 4_095.0, 4_096.0)]
    cases += [(4_000.0, 1.0, 8, 10_000.0, 10_000), (30.0, 4.0, 8, 20.0, 3)]
    for rate, service_s, target, price, max_workers in cases:
        for wait_s in (0.0, 1.0):
            args = (rate, service_s, target, price, max_workers, wait_s)
            assert workers_for_stream(*args) == _plain_workers_for_stream(*args), args


def test_more_calls_never_get_fewer_workers() -> None:
    # The forecast asks for the workers of the lower end of its horizon by asking at its lower
    # rate (`decide`): that is the fewer workers only while more calls never get fewer.
    rng = random.Random(4)
    for _ in range(3000):
        service_s = rng.choice([0.0, 0.5, SERVICE_S, rng.uniform(0.01, 60)])
        target = rng.choice([1, 2, 8, 16])
        price = rng.choice([2.0, 20.0, 600 / 84, rng.uniform(0.1, 200)])
        wait_s = rng.choice([0.0, 1.0, rng.uniform(0, 5)])
        low = rng.expovariate(1 / rng.choice([0.1, 1.0, 10.0, 50.0]))
        high = low * (1 + rng.choice([1e-12, 1e-6, 1e-3, 0.05, 0.5]))
        fewer = workers_for_stream(low, service_s, target, price, 10_000, wait_s)
        assert fewer <= workers_for_stream(high, service_s, target, price, 10_000, wait_s)
