"""`decide(state, now)`: how many workers one deployment should have now, and why.

Pure: the live reconciler and the simulator (`bench/autoscale_sim.py`) call this same function
with the state they observed; it does no I/O and keeps no state of its own (what it must
remember between ticks travels in `Memory`, returned with the decision).

The parts, each a worker count:
- demand: the work present now (queued + running), never queue length alone; while
  workers boot, or where the arrivals over a boot are known (a forecast) or the workers were
  booted for this wake (a pre-warm plan), no more than the backlog still needs once a new one
  could be ready (`backlog.py`: the workers there serve part of it first, at the higher of the
  models' rate and the one read off the work present, `inflow.py`) and the levels the past
  keeps from one need to the next, which bounds KPA's parts too;
- KPA: Knative-style stable (60 s) and panic (6 s) windows over concurrency; in panic the
  count never goes down while work is present (once none is, the levels' holds keep the
  workers the windows asked for, each for its own price);
- forecast (dense traffic): arrivals forecast over the boot horizon, turned into concurrency by
  Little's law and into workers at the demand quantile the cost rule picks (`policy.py`), and
  at least the workers whose spared queueing pays for them (`queueing.py`);
- idle windows: the workers the next wake wants, kept from the end of the last work or
  pre-warmed ahead of the next call (`idle.py`). The last one is never released where the
  scale-down window's keep-alive would have served the next call; the others are priced by the
  callers of the recent wakes they would serve. On the pre-warm plan, the levels' holds (below)
  pause from the end of the work until the pre-warm boots, for each level whose miss, at the
  chance of a pause shorter than any seen, costs less than the idle time paused.
Each part counts only the work that cannot wait `queue_wait_s` for a worker already ready
(`policy.waits_allowed`). Workers above those the work needs are held once no longer needed
(also needed: the workers present that the work in flight filled at an arrival between two
ticks, `DeploymentState.peak_demand`), each level for its own learned hold (`levels.py`:
priced by the queueing it spared over a boot from its need, `episode.py`, spanning the gaps
its past shows when that costs less; on a steady stream, whose swings the forecast part
prices, released once a swing's need has passed, `levels.kept_on_steady_stream`), then
released at most half at a time (Knative's max scale-down rate), and none while another boots
(a scale-down stops the idle ready ones first); the reconciler drains what it releases.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from typing import NamedTuple

from control_plane.domain.scaling.backlog import backlog_workers
from control_plane.domain.scaling.inflow import Inflow, observe
from control_plane.domain.scaling.levels import (
    NO_LEVELS,
    Levels,
    kept_for_next,
    kept_on_steady_stream,
    kept_through_pause,
    update_levels,
)
from control_plane.domain.scaling.models import MAX_MODEL_AGE_S, NONE, Models
from control_plane.domain.scaling.policy import (
    MAX_SCALE_DOWN_RATE,
    PANIC_THRESHOLD,
    STABLE_WINDOW_S,
    ScalingPolicy,
    counted_boot_s,
    under_quantile,
    wait_price,
    waits_allowed,
)
from control_plane.domain.scaling.policy import MAX_TICK_S as MAX_TICK_S  # (re-exported)
from control_plane.domain.scaling.queueing import (
    normal_z,
    poisson_quantile_of_max,
    workers_for_stream,
)
from control_plane.domain.scaling.wake import keepalive_levels as keepalive_levels
from control_plane.domain.scaling.wake import (
    keepalive_window,
    prewarm_levels,
    wake_workers,
)
from control_plane.domain.scaling.wake import wake_callers as wake_callers


class Memory(NamedTuple):
    """What one decision hands to the next (the caller stores it per deployment). (A named
    tuple, as the levels and the inflow it carries are: every tick of every deployment builds
    all three, and a tuple builds in half the time of a frozen dataclass.)"""

    levels: Levels = NO_LEVELS  # when each count of workers was last needed; their holds
    panic_until: float = 0.0  # panic mode lasts a stable window after it was last triggered
    busy_at: float | None = None  # last time work was present (queued or running)
    inflow: Inflow | None = None  # the arrivals read off the work present (`inflow.py`)
    unqueued_at: float | None = None  # the last tick no job was queued at (None: none seen)


NO_MEMORY = Memory()

# Builds a named tuple from its fields without its generated constructor (a Python frame of
# its own): every tick of every deployment builds a Memory and a ScaleDecision.
_BUILD = tuple.__new__


@dataclass(frozen=True, slots=True)
class DeploymentState:
    policy: ScalingPolicy
    queued: int  # jobs waiting for a worker (queued + starting)
    running: int  # jobs a worker holds (reserved or executing)
    ready: int  # workers serving (idle or busy); draining ones excluded
    booting_since: tuple[float, ...]  # start time of each worker not yet ready
    stable_concurrency: float  # mean of queued + running over the stable window
    panic_concurrency: float  # ... over the panic window
    last_arrival_at: float | None  # None: never called
    boot_s: float  # start → ready seconds measured for this version (a prior when none)
    service_s: float  # mean seconds a job holds a worker slot (a prior when none)
    models: Models = NONE  # forecast and idle windows, refit off the hot path
    memory: Memory = NO_MEMORY
    start_allowed: bool = True  # the crash-loop gate: False while backing off
    give_up: bool = False  # the crash-loop gate: starting more workers will not help
    peak_demand: int = 0  # the most queued + running at an arrival since the last tick (0: none)


class ScaleDecision(NamedTuple):
    """What `decide` asks of the reconciler for one deployment this tick. (A named tuple, as
    `Memory` is, read by field name like a dataclass: every tick of every deployment builds
    one, in a quarter of the time a frozen dataclass takes.)"""

    desired: int  # workers the deployment should have, counting those still booting
    capacity: int  # workers that count now: ready + booting within max_boot_s
    needed: int  # what this tick's signals ask for, before holding and rate limits
    reason: str  # the part that set `desired` (see REASONS)
    next_prewarm_at: float | None  # when a worker will be booted ahead of traffic
    fail_waiting: bool  # crash loop: fail the jobs that wait instead of starting workers
    memory: Memory
    # how many more the backlog needs once a new one could be ready, and the levels kept from
    # one need to the next (the most the parts driven by the work present may add); None: the
    # bound does not apply (none booting, no forecast and no pre-warm plan; or no rate yet)
    backlog_workers: int | None = None

    @property
    def start(self) -> int:
        return max(self.desired - self.capacity, 0)


REASONS = (
    "scale_from_zero",  # work waits and no worker counts
    "demand",  # the work present now
    "panic",  # the panic window asks for ≥ 2× the ready workers
    "stable_window",  # the KPA stable window
    "forecast",  # arrivals forecast over the boot horizon
    "prewarm",  # the idle windows expect the next arrival within a boot
    "keepalive",  # the idle windows keep the worker
    "min_workers",
    "max_workers",
    "hold",  # a worker no longer needed is kept for its level's hold, or while another boots
    "scale_down",  # fewer workers needed; drained, at most half per tick
    "idle",  # nothing to run, nothing expected: zero workers
    "crash_backoff",  # more workers wanted, but the last ones failed: waiting before a retry
    "crash_loop",  # more workers wanted, but they keep failing: waiting jobs fail
)


def counts_as_capacity(booting_since: float, now: float, policy: ScalingPolicy) -> bool:
    """A booting worker counts until `max_boot_s`; past it a replacement is started (and the
    liveness check fails the overdue one)."""
    return now - booting_since <= policy.max_boot_s


def decide(state: DeploymentState, now: float) -> ScaleDecision:
    p = state.policy
    boot_s = counted_boot_s(p, state.boot_s)
    target = max(p.target_concurrency, 1)
    # (`counts_as_capacity`, spelled out: a burst's booting workers are each tested every tick)
    max_boot_s = p.max_boot_s
    since = state.booting_since
    counted = [s for s in since if now - s <= max_boot_s] if since else []  # (most have none)
    booting = len(counted)
    capacity = state.ready + booting
    mem = state.memory
    # The forecast extrapolates: trusted only while recent. The idle windows describe the gaps
    # seen so far: valid until the next arrival, or while recent (a refresher that died).
    models = state.models
    recent = now - models.fitted_at <= MAX_MODEL_AGE_S
    current = state.last_arrival_at is not None and models.fitted_at >= state.last_arrival_at
    fc = models.forecast if recent else None
    fc_now = fc.rate(now) if fc is not None else None  # (mean, sd) of the arrival rate now
    idle = models.idle if recent or current else NONE.idle

    # Each part below asks for workers for the work present or expected, less what may wait
    # for the ready workers (`queue_wait_s`): a short spike queues briefly instead of booting a
    # worker that would be held long after it.
    waits = waits_allowed(p, state.ready, boot_s, state.service_s)

    # A worker started now helps only with the jobs that the workers there (ready, or booting)
    # will not have started by the time it is ready (`backlog.py`): the parts driven by the
    # work present ask for no more while workers boot, and also, with none booting, where the
    # arrivals over a boot are known (a stream's forecast) or the workers there were booted for
    # this wake (the pre-warm plan, sized by the recent wakes at the same turnover): a swing
    # the ready workers absorb within a boot, or a batch on its pre-warmed workers, boots none.
    # (Booted for the queue, such a worker was ready only after the work it was started for:
    # 30-call batches every 5 minutes on their pre-warmed workers booted 66 workers in 25
    # batches instead of 58, and a KPA keeping one worker throughout cost less.)
    # Elsewhere the work present is all there is to go by, as it is for the levels above the
    # ready workers that the past keeps from one need to the next (`levels.kept_for_next`): a
    # worker booted for them now stays for the next need, even where this one is served before
    # it is ready. (Bounded by the backlog alone, the worker booted for one burst was no
    # longer started, and the burst 20 s later found one worker fewer: p99 +1.2 s.)
    more: int | None = None
    steady = False  # the forecast part sized the workers for a steady stream
    demand = state.queued + state.running
    inflow = observe(mem.inflow, now, demand, state.running, state.service_s)
    if booting or (demand > 0 and (fc is not None or idle.prewarms)):
        rate = fc_now[0] if fc_now is not None else models.recent_rate if recent else None
        if rate is not None:
            # a surge shows in the work present before it shows in the models' buckets
            rate = max(rate, inflow.rate)
            more = backlog_workers(
                p,
                now=now,
                boot_s=boot_s,
                service_s=state.service_s,
                ready=state.ready,
                running=state.running,
                queued=state.queued,
                ready_at=[s + boot_s for s in counted],
                rate=rate,
            )
            if not booting:
                more += kept_for_next(mem.levels, capacity + more, boot_s, p)

    limit = sys.maxsize if more is None else capacity + more  # (caps the parts driven by it)
    # The parts' largest so far and its reason, a running maximum (of equal parts, the first).
    # Running jobs hold their slots: only queued ones can wait, and they wait for a worker that
    # stays (a job queued on an idle worker, not claimed yet, keeps it). (The max of the three
    # spelled out in conditionals, as in the hottest lines here: every tick runs them.)
    at_once = demand - waits
    at_once = state.running if state.running > at_once else at_once
    one = 1 if demand > 1 else demand  # (at least one job, where any)
    at_once = one if one > at_once else at_once
    needed = min(math.ceil(at_once / target), limit)
    reason = "scale_from_zero" if capacity == 0 else "demand"

    panic_workers = math.ceil(max(state.panic_concurrency - waits, 0.0) / target)
    panic_until = mem.panic_until
    if panic_workers >= PANIC_THRESHOLD * max(state.ready, 1) and panic_workers > state.ready:
        panic_until = now + STABLE_WINDOW_S
    # The windows remember the work of the last minute; once none is present, the workers
    # they asked for are those the levels' holds (below) price and keep. (Asked for by the
    # windows, each level was needed until they forgot the burst, and its hold began only then:
    # up to a minute of idle workers per burst beyond its price, and the levels whose past says
    # release at once kept for that minute.)
    if demand > 0 and now < panic_until:
        part = min(max(panic_workers, capacity), limit)
        if part > needed:
            needed, reason = part, "panic"
    elif demand > 0:
        stable_workers = math.ceil(max(state.stable_concurrency - waits, 0.0) / target)
        if stable_workers >= 2:  # the last worker is the idle windows' (see module doc)
            part = min(stable_workers, limit)
            if part > needed:
                needed, reason = part, "stable_window"

    # Dense traffic only: at least one arrival expected per boot. Sparser streams are the idle
    # windows' (a Gaussian filter over mostly-empty buckets says little about the next one).
    if fc is not None and fc_now is not None and fc_now[0] * boot_s >= 1.0:
        quantile = under_quantile(p, boot_s)
        z = normal_z(quantile)
        # A linear trend peaks at one end of the horizon: now, or a boot from now.
        (mean_now, sd_now), (mean_then, sd_then) = fc_now, fc.rate(now + boot_s)
        high_now, high_then = mean_now + z * sd_now, mean_then + z * sd_then
        # Little's law at the higher end; the rate's own uncertainty is added at the same
        # quantile. Waiting absorbs the swings above the mean load, never the load itself: with
        # fewer slots than that the queue grows for as long as the load lasts (a ramp).
        concurrency = poisson_quantile_of_max(
            (high_now * state.service_s, high_then * state.service_s), quantile, z
        )
        load = max(mean_now, mean_then) * state.service_s
        worst = math.ceil(max(concurrency - waits, load) / target)
        # The swings of the stream at its sustained rate (the lower end of the horizon; a trend
        # is the part above's) get workers for as long as the queueing the next one would spare
        # costs more than it (`queueing.py`): they queue at the tail of the latency. (At the
        # higher end, a burst's rate, extrapolated past its end by the trend, kept the burst's
        # workers after it.)
        price = wait_price(p, boot_s)
        wait_s = min(p.queue_wait_s, boot_s)  # as `policy.waits_allowed`
        rate = max(min(high_now, high_then), 0.0)
        stream = workers_for_stream(rate, state.service_s, target, price, p.max_workers, wait_s)
        part = max(worst, stream)
        steady = fc.steady
        if part > needed:
            needed, reason = part, "forecast"

    # The parts above size the workers for the work present or forecast; each worker above the
    # last is held once no longer needed by them, for its level's hold (`levels.py`).
    work_needed = min(needed, p.max_workers)
    # A level is needed again whenever work fills it, also between ticks (as a keep-alive's
    # clock restarts at every call); only the workers present. (Renewed at the ticks alone, a
    # worker that short bursts kept busy between ticks was released while they still came.)
    peak = state.peak_demand if state.peak_demand > demand else demand
    level_need = work_needed
    if peak > work_needed * target:  # (in conditionals: most ticks' work fills no more)
        filled = min(-(-peak // target), capacity, p.max_workers)
        level_need = filled if filled > work_needed else work_needed
    held_levels, held = update_levels(
        mem.levels,
        level_need,
        now,
        boot_s,
        p,
        demand=demand,
        running=state.running,
        service_s=state.service_s,
        ready=state.ready,
        queued_s=0.0 if mem.unqueued_at is None else now - mem.unqueued_at,
    )

    # The idle windows' parts below keep or pre-warm the workers of the next wake, counted
    # from the last work: the levels' holds do not start again after them. (Counted as needed,
    # the workers a quiet deployment kept for its next wake were held again for their levels'
    # holds once the keep-alive ended: twice the window.)
    # A pre-warm counts from the last arrival (the gaps are between arrivals); a keep-alive
    # from the later of the last arrival and the end of the last work, so a long job does not
    # find its keep-alive spent when it finishes.
    busy_at = now if demand > 0 else mem.busy_at
    arrived = math.inf if state.last_arrival_at is None else now - state.last_arrival_at
    idle_for = arrived if busy_at is None or arrived <= now - busy_at else now - busy_at
    next_prewarm_at = None
    if idle.prewarms:
        assert idle.prewarm_s is not None
        boot_at = idle.prewarm_s - boot_s - MAX_TICK_S
        if arrived < boot_at:
            next_prewarm_at = now + boot_at - arrived
            if demand == 0 and busy_at is not None and state.last_arrival_at is not None:
                # The plan expects no call before its pre-warm is ready: a worker held through
                # the quiet time until it boots idles for nothing. The levels' holds pause
                # (they still run): the workers they would keep are booted again with the
                # pre-warm, ready at every call the plan expects, as warm as if kept. A level
                # whose cold start costs more, at the chance of a gap shorter than any seen,
                # than the pause spares (from the end of the work to the pre-warm's boot) is
                # kept through it. (Paused at any price, a burst of 50 callers that came at a
                # new shortest gap found its workers booting.)
                pause_s = boot_at - (busy_at - state.last_arrival_at)
                held = kept_through_pause(held_levels, now, boot_s, p, pause_s, idle.shorter_chance)
        if boot_at <= arrived and idle_for < idle.keepalive_s:
            part = len(prewarm_levels(idle, p, boot_s, state.service_s))
            if part > needed:
                needed, reason = part, "prewarm"
    else:
        window = keepalive_window(idle, p)
        if idle_for < window:
            # As many workers are kept as a wake wants, each for its own price, while work runs
            # too: a wake is when they are needed (asked for only once the deployment was quiet,
            # they were released by the first tick of the next wake, whose calls had not yet
            # queued, and booted again for its queue).
            kept = wake_workers(idle, p, boot_s, state.service_s, window, idle_for)
            if kept > needed:
                needed, reason = kept, "keepalive"
    if steady and held > work_needed:
        # The stream's swings are the forecast part's to price (`levels.kept_on_steady_stream`),
        # whichever way the levels' holds were counted above (a pause's too).
        held = kept_on_steady_stream(
            held_levels, held, work_needed, now, boot_s, p.scaledown_window_s
        )
    if p.min_workers > needed:
        needed, reason = p.min_workers, "min_workers"
    if needed > p.max_workers:
        needed, reason = p.max_workers, "max_workers"

    unqueued_at = now if state.queued == 0 else mem.unqueued_at
    memory = _BUILD(Memory, (held_levels, panic_until, busy_at, inflow, unqueued_at))
    desired = held if held > needed else needed
    desired = p.max_workers if p.max_workers < desired else desired
    if desired > needed:
        reason = "hold"
    if desired < capacity and booting and state.ready:
        # None is released while a worker boots: a scale-down stops the idle ready workers
        # first (`plans/scale.py`), so the next call would wait for the boot of the one kept.
        # The booting ones go once ready, if the parts and holds still say so. (Released with
        # a burst's holds while its workers booted, an 84 s boot lost the ready worker and the
        # next burst came cold.)
        desired, reason = capacity, "hold"
    elif desired < capacity:
        desired = max(desired, math.floor(capacity / MAX_SCALE_DOWN_RATE))
        reason = "scale_down"
    if desired == 0:
        reason = "idle"

    fields = (desired, capacity, needed, reason, next_prewarm_at, False, memory, more)
    decision = _BUILD(ScaleDecision, fields)
    return gate(
        decision, start_allowed=state.start_allowed, give_up=state.give_up, work_present=demand > 0
    )


def gate(
    d: ScaleDecision, *, start_allowed: bool, give_up: bool, work_present: bool
) -> ScaleDecision:
    """The crash-loop gate over a decision: while the last workers failed, no more start
    (`crash_backoff`); once starting more will not help, the work present fails instead
    (`crash_loop`). Applied after `decide`, so the reconciler reads a version's boot history
    only for the decisions that would start workers, and decides once."""
    if d.desired <= d.capacity or (start_allowed and not give_up):
        return d
    reason = "crash_loop" if give_up else "crash_backoff"
    return d._replace(desired=d.capacity, reason=reason, fail_waiting=give_up and work_present)
