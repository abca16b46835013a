"""How long each worker above the last is kept once no part of the decision asks for it.

A worker released and needed again costs a cold start: its boot, and the wait of the callers
it would have served while its replacement boots. Kept, it costs one worker-second per second.
Without knowing when it will be needed again, keeping it for as long as a cold start costs
(`policy.hold_s`) is the ski-rental rule: never more than twice the best choice made in
hindsight, whatever comes next.

Each level (the k-th worker, k ≥ 2; the last one is the idle windows') learns both sides of
that rule from its own past:
- the price of its cold start: the waits of the callers it would serve while a replacement
  boots. Each time the level is needed again after more than a boot (an episode), the
  queueing it spares over the first boot from the need (`episode.py`: the caller-seconds the
  jobs would wait without it, less those they would wait with it, each followed as a fluid
  queue beside the observed demand, with the workers below it ready from before the need, as
  they would be had it been held: `_begun`), in units of a caller's wait through a whole boot
  (the wait `cold_penalty_s` prices; a caller waiting a tenth of a boot costs a tenth of it),
  is the episode's callers. A level that carries a backlog through a boot costs many; one that a
  stream touches for a moment, a fraction of one. (Counted only as the callers still waiting
  a boot after the need, a batch that the few workers kept for its wake served in 25 s of
  queueing cost nothing, and its workers were released between batches a minute apart.)
  The recent episodes' mean prices the level.
- the gaps between the times it was needed, those longer than a boot (a shorter one is held
  through whatever the hold, since a new boot alone costs more than it). A level released at
  the end of each swing of a stream and needed again at the next sees such gaps again and
  again; the first backlog's levels see that they were not needed again within the
  scale-down window.
A level is held for the longer of the ski-rental time at its price and the hold that would have
cost least over its gaps at that price (the ATC'20 histogram policy's idea, per level).

The learned hold only lengthens the ski-rental time, with one exception: a hold shorter than
the price of a cold start has no bound on its cost against hindsight (a need that comes just
after it costs a cold start where keeping would have cost next to nothing), one longer than it
at most 1 + hold / price times hindsight's. The exception is no hold at all, for a level whose
own past says it is not needed again within the window (every one of its gaps outlasted it),
weighed against the chance that the next need comes sooner than any seen (`best_hold_s`): a
burst's workers are released once the bursts have shown that the next one comes after the
window, instead of being held for it. A level needed again within the window even once keeps
its ski-rental time: where bursts come at gaps of both kinds, the next may need it soon.

On a steady stream (the forecast's `steady`), the levels that its swings alone needed are
the forecast part's to price: released once their need is a boot old
(`kept_on_steady_stream`).

Where the idle windows have found a pre-warm plan (the next call is not expected before the
pre-warm is ready), a held worker idles from the end of the work to the pre-warm's boot for
nothing the plan expects: the holds pause there (`kept_through_pause`) unless a call sooner, at
the chance of a pause shorter than any seen, would cost that level more than the pause spares.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from typing import NamedTuple

from control_plane.domain.scaling.backlog import fresh_slot_ends
from control_plane.domain.scaling.episode import Episode, advance_levels
from control_plane.domain.scaling.policy import ScalingPolicy, cold_cost_s, hold_s

# Episodes kept per level: the recent ones, so that a level's price follows a change of the
# stream within a few swings, and no one episode decides alone once a few are in (each weighs
# an eighth).
EPISODES_KEPT = 8
# Gaps kept per level. The hold that would have cost least over them counts each kind of gap as
# often as it came, and a kind the sample lacks is released before: a kind that comes one need
# in ten is missing from 8 gaps 43 % of the time (0.9^8), from 32 gaps 3 % (0.9^32). (Kept 8, a
# level that slow bursts needed every 30-70 s, and a few times only after 3-5 minutes, was
# released 144 s after its last need once those gaps had left its sample, and a fast 500-call
# burst 268 s later found one worker fewer than keep-alive's: p99 +4 s. Kept 32, it was held
# 292 s.) The price of a need (the episodes) still follows the last few.
GAPS_KEPT = 32
# The gap of a level not needed again within the scale-down window: no hold spans it.
NOT_AGAIN = math.inf
# The price of a level's cold start before any episode of it was measured: one caller, the
# fewest a level that is needed can hold.
PRIOR_CALLERS = 1.0


def _mean_callers(callers: tuple[float, ...]) -> float:
    return sum(callers) / len(callers) if callers else PRIOR_CALLERS


class LevelFit(NamedTuple):
    """One level's recent gaps between needs and its episodes' callers (oldest first), and the
    hold they ask for; built by `level_fit` (a refit: `_with`), which derive the last two
    fields. (A named tuple: a burst's levels end their episodes at the same tick, twenty refits
    at once, and a tuple builds in half the time of a frozen dataclass.)"""

    gaps: tuple[float, ...]
    hold_s: float  # the hold (≥ the ski-rental time) that would have cost least (0: none)
    callers: tuple[float, ...]  # callers of its recent episodes (see the module doc)
    # The callers a cold start of this level makes wait through a boot, on average over its
    # recent episodes (PRIOR_CALLERS before the first). Kept, not derived on each read: every
    # tick reads it for each level above the work (its hold).
    cold_callers: float
    # The gaps in increasing order: how many a hold spans is a search (`kept_for_next`).
    ordered: tuple[float, ...]


def level_fit(
    gaps: tuple[float, ...] = (), hold_s: float = 0.0, callers: tuple[float, ...] = ()
) -> LevelFit:
    """The fit of those gaps, hold and callers."""
    return LevelFit(gaps, hold_s, callers, _mean_callers(callers), tuple(sorted(gaps)))


NO_FIT = level_fit()


class Levels(NamedTuple):
    """What the levels carry from one tick to the next (`decide.Memory.levels`)."""

    needed_at: tuple[float | None, ...] = ()  # [k - 1]: when k workers were last needed
    fits: tuple[LevelFit, ...] = ()  # [k - 1]: level k's gaps (only changed when one ends)
    # [k - 1]: level k's episode, until its first boot has passed (else None)
    episodes: tuple[Episode | None, ...] = ()
    ticked_at: float | None = None  # the last update's time (None: none yet)


NO_LEVELS = Levels()

# Builds a named tuple from its fields without its generated constructor (a Python frame of
# its own): every tick of every deployment builds its Levels.
_BUILD = tuple.__new__


def update_levels(
    levels: Levels,
    needed: int,
    now: float,
    boot_s: float,
    policy: ScalingPolicy,
    *,
    demand: float = 0.0,
    running: float = 0.0,
    service_s: float = 1.0,
    ready: int = 0,
    queued_s: float = 0.0,
) -> tuple[Levels, int]:
    """The levels after a tick where `needed` workers are asked for with `demand` jobs present
    (queued + running; `running` of them in a slot, each for `service_s` on average), `ready`
    workers serving and jobs queued for the last `queued_s` seconds, and how many workers to
    keep: the `needed`, or more up to the highest level from 2 up whose hold has not run
    out."""
    cap = policy.scaledown_window_s
    target = max(policy.target_concurrency, 1)
    n = max(len(levels.needed_at), needed)
    needed_at, fits = list(levels.needed_at), list(levels.fits)
    episodes = list(levels.episodes)
    if len(needed_at) < n or len(fits) < n or len(episodes) < n:  # (a level needed first)
        needed_at += [None] * (n - len(needed_at))
        fits += [NO_FIT] * (n - len(fits))
        episodes += [None] * (n - len(episodes))
    # the time since the last update, which this tick's counts stand for (a stalled loop's
    # long pause counts as a boot at most: an episode never spans more; conditionals for max
    # and min)
    dt = 0.0 if levels.ticked_at is None else now - levels.ticked_at
    dt = 0.0 if dt < 0.0 else dt
    dt = boot_s if boot_s < dt else dt
    held = needed
    if n:  # the last worker is the idle windows' to keep: only its last need is kept
        needed_at[0] = now if needed else needed_at[0]
    # Each level's own, in three passes (every tick of every deployment runs them: a level
    # that has nothing to do costs a test or two).
    # The episodes under way follow the tick; one that has lasted a boot prices its level: its
    # callers are the queueing the level spared over the boot a replacement started at its
    # need takes, in callers waiting a whole boot.
    if episodes.count(None) < n:  # (most ticks of most deployments have none)
        episodes, lasted = advance_levels(
            episodes, dt, demand, running, service_s, target, now=now, boot_s=boot_s
        )
        for k, episode in lasted:
            callers = episode.spared_s / max(boot_s, 1e-3)
            fits[k] = _with(fits[k], policy, boot_s, callers=callers)
            episodes[k] = None
    # The levels needed now. One needed again after more than a boot begins an episode: the
    # jobs that made it needed came since the last update, and count for it, as every later
    # update's do (the episodes begun, a burst's twenty at once, follow it together).
    begun: list[Episode | None] | None = None
    for k in range(1, needed):
        last = needed_at[k]
        if (last is None or now - last > boot_s) and episodes[k] is None:
            if last is not None:
                fits[k] = _with(fits[k], policy, boot_s, gap=now - last)
            if begun is None:
                begun = [None] * n
            begun[k] = _begun(now, k, target, ready, demand - running, service_s, queued_s)
        needed_at[k] = now
    if begun is not None:
        begun = advance_levels(begun, dt, demand, running, service_s, target)[0]
        for k in range(1, needed):
            if begun[k] is not None:
                episodes[k] = begun[k]
    # The levels above them: one not needed again within the window has a gap no hold spans;
    # the highest level whose hold still runs keeps the levels below it too (searched from the
    # top down, a hold is computed only for the levels above it).
    for k in range(n - 1, max(needed, 1) - 1, -1):
        last = needed_at[k]
        if last is None:
            continue
        if now - last >= cap:
            fits[k] = _with(fits[k], policy, boot_s, gap=NOT_AGAIN)
            needed_at[k] = None
        elif held == needed and now - last < _hold_s(fits[k], policy, boot_s):
            held = k + 1
    return _BUILD(Levels, (tuple(needed_at), tuple(fits), tuple(episodes), now)), held


def kept_on_steady_stream(
    levels: Levels, held: int, needed: int, now: float, boot_s: float, window: float
) -> int:
    """Of the `held` workers, how many are kept on a steady stream (`forecast.Forecast.steady`):
    the levels above the `needed` workers that its swings alone needed go.

    The forecast part has weighed those swings already (`queueing.py`: a worker for them as
    long as the queueing it spares pays for it) and asked for no worker more: holding one
    after a swing spends the worker-seconds that part found not worth it. A level's hold is
    the rule for needs that no model foresees; on a stream that model describes, it is kept
    only where the level's own past says more than the model: needed again within the
    window (its gaps, as the held levels are priced, `best_hold_s`), or within a boot of its
    last need (a release then saves less than the boot that a need again costs). The levels
    themselves are left as they are: the next need of one released here counts its gap, and
    a level needed again and again within the window keeps its hold. (Forgotten on release,
    the second worker of a 1 call/s stream was needed at swing after swing and never held:
    its callers' p99 +2.5 s. Held for their price, the second worker that one swing of a 0.2
    calls/s stream needed was kept three minutes, and a keep-alive of one minute cost less at
    the same latency.)"""
    keep = held
    while keep > needed and keep > 1:
        last, fit = levels.needed_at[keep - 1], levels.fits[keep - 1]
        if last is not None and now - last < boot_s:
            break
        if fit.ordered and fit.ordered[0] < window:
            break
        keep -= 1
    return keep


def _begun(
    now: float, k: int, target: int, ready: int, queued: float, service_s: float, queued_s: float
) -> Episode:
    """The episode of the level with `k` levels below it, needed at `now` with `ready` workers
    serving and `queued` jobs waiting, queued for `queued_s` seconds.

    Its fluid queues compare the level held with it not held: with k workers, or k + 1, ready
    since before the need. Where fewer were ready, the queue observed grew for want of workers
    that neither queue lacks: over the `queued_s` the queue has been building, each slot
    missing from the observed ones would have ended a job every service time (less the lag of
    its first job). Those jobs are not in the queues compared (their x starts below 0).
    (Started from the queue observed, the levels that a stream woken from zero asked for while
    its first workers booted were priced by the backlog that the boot built, one that the
    workers below them, held, would never have let build. Each was then held for up to the
    window beside the few workers the stream needed: a 4 calls/s stream kept 18 workers for 7
    minutes where it needed 4.)"""
    if queued <= 0 or queued_s <= 0:
        return Episode(now)
    # a slot free when the queue began has ended half a job fewer than its time over a service
    # time: a burst that queued for a tick or two found the missing slots at their first jobs
    per_slot = fresh_slot_ends(queued_s, service_s)

    def served(levels: int) -> float:
        return min(max(levels - ready, 0) * target * per_slot, queued)

    return Episode(now, -served(k), -served(k + 1))


def kept_through_pause(
    levels: Levels, now: float, boot_s: float, policy: ScalingPolicy, pause_s: float, chance: float
) -> int:
    """While the idle windows' pre-warm plan expects no call for `pause_s` more seconds than a
    worker kept idles (`decide`), how many of the workers the levels hold are kept anyway: those
    whose hold runs and whose cold start, at the `chance` that the next call comes before the
    pre-warm is ready (a gap shorter than any seen), costs more than the pause spares, and the
    workers below them (as `update_levels` holds). The others are released and booted again
    with the pre-warm."""
    kept = 0
    for k in range(1, len(levels.needed_at)):
        last = levels.needed_at[k]
        fit = levels.fits[k]
        if last is None or now - last >= _hold_s(fit, policy, boot_s):
            continue
        if chance * cold_cost_s(policy, boot_s, fit.cold_callers) > pause_s:
            kept = k + 1
    return kept


def kept_for_next(levels: Levels, above: int, boot_s: float, policy: ScalingPolicy) -> int:
    """How many levels above the `above` workers there are, in a row from the next one up, are
    needed again within their hold more often than not (by their recent gaps between needs): a
    worker booted for such a level when it is needed is, more likely than not, still kept when it
    is needed next, whether or not it is ready in time for this need."""
    kept = 0
    for k in range(above, min(len(levels.fits), policy.max_workers)):
        fit = levels.fits[k]
        hold = _hold_s(fit, policy, boot_s)
        if 2 * bisect.bisect_right(fit.ordered, hold) <= len(fit.gaps):
            break
        kept += 1
    return kept


def hold_levels_s(levels: Levels, boot_s: float, policy: ScalingPolicy) -> list[float]:
    """How long each level from 2 up that has been needed is held once no longer needed:
    [0] the second worker's hold, [1] the third's, ..."""
    return [_hold_s(fit, policy, boot_s) for fit in levels.fits[1:]]


def _hold_s(fit: LevelFit, policy: ScalingPolicy, boot_s: float) -> float:
    # Fitted against the prices and window of its time: the boot measured since, or a policy
    # changed since, may have moved the ski-rental time or the window past it.
    if fit.hold_s == 0.0 and fit.gaps:  # released at once: its past says so (`best_hold_s`)
        return 0.0
    # No shorter than the ski-rental time at the level's price (`policy.hold_s`), no longer than
    # the window. Spelled out in conditionals: every tick reads it for the levels above the
    # work, a burst's twenty.
    hold = cold_cost_s(policy, boot_s, fit.cold_callers)
    hold = fit.hold_s if fit.hold_s > hold else hold
    window = policy.scaledown_window_s
    return hold if hold < window else window


def best_hold_s(gaps: Sequence[float], floor_s: float, cold_s: float, cap: float) -> float:
    """The hold that would have cost least over `gaps`: a gap within the hold costs its length
    in idle worker-seconds, a longer one the hold and then a cold start (`cold_s`). Tried: the
    floor (the ski-rental time) and each gap between it and `cap` (the cost bends only there),
    and no hold at all. Ties go to a hold, the shorter one.

    No hold at all is the one choice below the floor, the one without the ski-rental rule's
    bound against hindsight: it is tried only on a past where every gap outlasted the window
    (the level was never needed again within it), and weighed against one gap more than were
    seen, which it meets cold: the next need may come before any seen did (of n + 1
    exchangeable gaps, the next is the shortest one time in n + 1). So a level is released at
    once only when its own past pays for that risk: n gaps beyond the window against a cold
    start of price C when C < n × min(C, the window), i.e. a level that carried a burst's
    callers only after several bursts that did not need it again within the window; never
    without a past, nor with a gap the window spans. (Released at once wherever that cost
    least, a level of 200-call bursts priced at 0.41 callers, with gaps of 248 s and twice
    beyond the window, was gone when the next burst, 409 calls, needed it again within its
    ski-rental time: 234 of the burst's callers waited over 3 s, 122 with it held.)"""
    return _best_hold_s(sorted(gaps), floor_s, cold_s, cap)


def _best_hold_s(ordered: Sequence[float], floor_s: float, cold_s: float, cap: float) -> float:
    """`best_hold_s` of gaps already in increasing order."""
    n = len(ordered)
    # The holds tried in increasing order, each costed from the gaps it spans (their sum,
    # carried from the last) and the count of those it does not: one sweep of the sorted gaps,
    # not a pass per hold (a level refits at each of its needs, a burst's twenty in one tick).
    spanned = bisect.bisect_right(ordered, floor_s)
    spanned_s = sum(ordered[:spanned])
    cost = spanned_s + (n - spanned) * (floor_s + cold_s)
    # no hold at all: only where every gap outlasted the window (`best_hold_s`)
    never = (n + 1) * cold_s if n and ordered[0] > cap else math.inf
    best, best_cost = floor_s, cost
    if floor_s == 0.0:  # a floor of nothing (no price, no window): the same choice
        never, best_cost = cost, math.inf
    for k in range(spanned, bisect.bisect_right(ordered, cap)):
        hold = ordered[k]
        spanned_s += hold  # (of equal gaps, the last costs the hold: the others cost more)
        cost = spanned_s + (n - k - 1) * (hold + cold_s)
        if cost < best_cost:  # ties: the shorter hold
            best, best_cost = hold, cost
    # ties: a hold (the rule with a guarantee wins them)
    return 0.0 if never < best_cost else best


def _with(
    fit: LevelFit,
    policy: ScalingPolicy,
    boot_s: float,
    gap: float | None = None,
    callers: float | None = None,
) -> LevelFit:
    """The fit with one more gap or one more episode's callers, and its hold refit."""
    if gap is None:
        gaps, ordered = fit.gaps, fit.ordered
    else:
        gaps = (*fit.gaps, gap)[-GAPS_KEPT:]
        # the sorted gaps less the one that left (the oldest), with the new one in its place
        in_order = list(fit.ordered)
        if len(gaps) == len(fit.gaps):
            in_order.remove(fit.gaps[0])
        bisect.insort(in_order, gap)
        ordered = tuple(in_order)
    if callers is None:
        episodes, price = fit.callers, fit.cold_callers
    else:
        episodes = (*fit.callers, callers)[-EPISODES_KEPT:]
        price = _mean_callers(episodes)
    cold_s = cold_cost_s(policy, boot_s, price)
    floor = hold_s(policy, boot_s, price)
    hold = _best_hold_s(ordered, floor, cold_s, policy.scaledown_window_s)
    return LevelFit(gaps, hold, episodes, price, ordered)
