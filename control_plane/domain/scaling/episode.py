"""What a worker above the last spares its callers while a replacement would boot.

When a level (the k-th worker, k ≥ 2) is needed again after more than a boot, a replacement
started at that need would be ready a boot later. The level's price is the queueing it spares
over that boot: the caller-seconds the jobs would wait with the k − 1 workers below it only,
less those they would wait with it too. Neither is observed (the deployment ran with the
workers it had), so both are followed as fluid queues beside the observed one:

- observed: `demand` jobs present (queued + running), `running` of them in a slot; slots turn
  over every service time, so jobs arrive at d(demand)/dt + running / service_s;
- with `slots` slots instead: the same arrivals, served min(jobs, slots) at a time. The jobs
  it holds beyond the observed ones, x, move as dx/dt = (running − min(demand + x, slots)) /
  service_s (negative where it has more slots than the workers that ran: it serves faster),
  and max(demand + x − slots, 0) of its jobs wait. All of them count, however short their
  wait: the callers of a stream that a level's swings touch wait a second or two, and those
  seconds are the tail of its latency. (Counted only past `queue_wait_s`, as the parts of the
  decision count the work present, the fourth worker of a 4 calls/s stream was priced at
  nothing and released at every swing, and 1 % of its callers waited 1.5 s.)

A burst that a few workers drain in 25 s of queueing spares, per level above them, the
seconds its jobs would have queued (a batch of 200 calls a minute apart: about a caller's wait
through a boot per level, so its workers are held between batches); a stream whose swings
touch a level for a tick spares a fraction of one caller's wait (the jobs queue for the next
slot of the workers below); a backlog that outlasts the boot, up to the boot's worth of
queueing for each of the level's slots.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple


class Episode(NamedTuple):
    """One level's episode, from its need until a replacement started then would be ready.
    (A named tuple: each level with an episode builds the next every tick, and a tuple builds
    in half the time of a frozen dataclass.)"""

    began_at: float  # when the level was needed again
    extra_without: float = 0.0  # x of the fluid queue with the workers below the level only
    extra_with: float = 0.0  # x of the fluid queue with the level too
    spared_s: float = 0.0  # caller-seconds of queueing the level spared so far

    def advance(
        self,
        dt: float,
        demand: float,
        running: float,
        service_s: float,
        slots_below: float,
        slots: float,
    ) -> Episode:
        """The episode after `dt` seconds in which `demand` jobs were present, `running` of
        them in a slot (this tick's counts stand for the time since the last)."""
        without = _fluid(self.extra_without, dt, demand, running, service_s, slots_below)
        with_ = _fluid(self.extra_with, dt, demand, running, service_s, slots_below + slots)
        return self._after(dt, without, with_)

    def _after(
        self, dt: float, without: tuple[float, float], with_: tuple[float, float]
    ) -> Episode:
        """The episode after `dt`, given both queues' (x after it, jobs waiting over it)."""
        spared = self.spared_s + dt * (without[1] - with_[1])
        return Episode(self.began_at, without[0], with_[0], spared)


# Builds an Episode from its fields without the named tuple's keyword-handling constructor.
_EPISODE = tuple.__new__


def advance_levels(
    episodes: Sequence[Episode | None],
    dt: float,
    demand: float,
    running: float,
    service_s: float,
    target: int,
    *,
    now: float = -math.inf,
    boot_s: float = math.inf,
) -> tuple[list[Episode | None], list[tuple[int, Episode]]]:
    """Each level's episode ([k]: the level with k levels of `target` slots below it; None: no
    episode) advanced as `Episode.advance` does, and the levels whose episode has lasted
    `boot_s` by `now`, with their episodes (none by default). A level's queue with it is the
    next level's without it: where both follow the same x (their episodes began at the same
    need, as a burst's levels do), it is computed once.

    Every tick of a deployment with episodes runs this over its levels (a burst's twenty),
    so `_fluid` and `Episode._after` are spelled out here, in locals (a third faster than
    calling them; `test_scaling_inflow_episode.py` checks that both ways agree)."""
    out = list(episodes)
    lasted: list[tuple[int, Episode]] = []
    service_s = service_s if service_s > 1e-3 else 1e-3  # as `_fluid`
    floor = -demand
    shared_x: float | None = None  # the last with-queue's x before the tick (None: none)
    x_after = waiting = 0.0  # ... and its x after it and jobs waiting over it
    for k, episode in enumerate(episodes):
        if episode is None:
            shared_x = None
            continue
        began_at, x_without, x_with, spared_s = episode
        if x_without == shared_x:
            without_after, without_waiting = x_after, waiting
        else:
            slots = k * target
            jobs = demand + x_without
            jobs = jobs if jobs > 0.0 else 0.0
            without_waiting = jobs - slots if jobs > slots else 0.0
            x = x_without + dt * (running - (jobs if jobs < slots else slots)) / service_s
            without_after = x if x > floor else floor
        slots = (k + 1) * target
        jobs = demand + x_with
        jobs = jobs if jobs > 0.0 else 0.0
        waiting = jobs - slots if jobs > slots else 0.0
        x = x_with + dt * (running - (jobs if jobs < slots else slots)) / service_s
        x_after = x if x > floor else floor
        shared_x = x_with
        spared_s += dt * (without_waiting - waiting)
        out[k] = episode = _EPISODE(Episode, (began_at, without_after, x_after, spared_s))
        if now - began_at >= boot_s:
            lasted.append((k, episode))
    return out, lasted


def _fluid(
    extra: float,
    dt: float,
    demand: float,
    running: float,
    service_s: float,
    slots: float,
) -> tuple[float, float]:
    """(x after `dt`, jobs waiting over `dt`) of the fluid queue with `slots` slots
    (`advance_levels` spells it out for the levels' every tick)."""
    service_s = service_s if service_s > 1e-3 else 1e-3  # as `policy.waits_allowed`
    jobs = demand + extra
    jobs = jobs if jobs > 0.0 else 0.0
    waiting = jobs - slots if jobs > slots else 0.0
    extra += dt * (running - (jobs if jobs < slots else slots)) / service_s
    floor = -demand  # x never takes away more jobs than are present
    return (extra if extra > floor else floor), waiting
