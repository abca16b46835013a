"""How many more workers a backlog needs, given the workers ready and booting for it.

A worker started now serves nothing until it is ready, a boot from now. By then the workers
already there will have started part of the backlog: each ready one turns its slots over every
service time, and each booting one starts its slots when it is ready and turns them over from
then on. Counted slot for slot instead (a booting worker as `target` slots, as the demand part
counts it), a deployment woken by a stream starts a worker for every `target` jobs queued,
while the workers booting ahead of them would have started those jobs before the new ones
were up: the last workers of such a first wave are ready after the backlog they were started
for has been served.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from control_plane.domain.scaling.policy import ScalingPolicy, waits_allowed

# A slot that starts at r has ended, on average, (x / S - (1 - c²) / 2) jobs by r + x, for
# service times of mean S and coefficient of variation c (the renewal theorem's second term;
# a slot already busy for a while, as a ready worker's are, ends x / S). c is not measured: take
# c = 0, which credits the fewest (for c ≤ 1), so a booting worker is not counted on for jobs
# that, on average, a slot started fresh has not yet served.
FRESH_SLOT_LAG = 0.5


def fresh_slot_ends(seconds: float, service_s: float) -> float:
    """Jobs a slot free at the start has ended, on average, `seconds` later (FRESH_SLOT_LAG).
    (Conditionals for max: a burst's booting workers each run this every tick.)"""
    ends = seconds / (service_s if service_s > 1e-3 else 1e-3) - FRESH_SLOT_LAG
    return ends if ends > 0.0 else 0.0


def backlog_workers(
    policy: ScalingPolicy,
    *,
    now: float,
    boot_s: float,
    service_s: float,
    ready: int,
    running: int,
    queued: int,
    ready_at: Sequence[float],
    rate: float,
) -> int:
    """Workers to start now for the jobs that would still wait, past what may wait for the
    workers there (`policy.waits_allowed`), when a worker started now is ready: the jobs queued
    now and those arriving over the boot at `rate` (per second), less the jobs that the ready
    workers and the booting ones (ready at `ready_at`) start by then."""
    # (conditionals for max: decide() runs this on every tick of a busy deployment)
    target = policy.target_concurrency
    target = 1 if target < 1 else target
    service_s = 1e-3 if service_s < 1e-3 else service_s  # as `waits_allowed` counts a measured 0
    then = now + boot_s
    free = target * ready - running
    starts = (0 if free < 0 else free) + target * ready * boot_s / service_s
    for r in ready_at:  # each booting worker started before now: ready by `then`
        turns = fresh_slot_ends(then - (r if r > now else now), service_s)
        starts += target * (1.0 + turns)
    waiting = queued + rate * boot_s - starts
    may_wait = waits_allowed(policy, ready + len(ready_at), boot_s, service_s)
    more = math.ceil((waiting - may_wait) / target)
    return 0 if more < 0 else more
