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
        # Both fluid queues in one pass, with conditionals for max/min: every level with an
        # episode runs this every tick (a burst's twenty levels at once).
        service_s = service_s if service_s > 1e-3 else 1e-3  # as `policy.waits_allowed`
        floor = -demand  # x never takes away more jobs than are present
        jobs = demand + self.extra_without
        jobs = jobs if jobs > 0.0 else 0.0
        waiting_without = jobs - slots_below if jobs > slots_below else 0.0
        served = jobs if jobs < slots_below else slots_below
        without = self.extra_without + dt * (running - served) / service_s
        slots_with = slots_below + slots
        jobs = demand + self.extra_with
        jobs = jobs if jobs > 0.0 else 0.0
        waiting_with = jobs - slots_with if jobs > slots_with else 0.0
        served = jobs if jobs < slots_with else slots_with
        with_ = self.extra_with + dt * (running - served) / service_s
        spared = self.spared_s + dt * (waiting_without - waiting_with)
        return Episode(
            self.began_at,
            without if without > floor else floor,
            with_ if with_ > floor else floor,
            spared,
        )
