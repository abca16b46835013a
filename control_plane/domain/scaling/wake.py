"""The workers a deployment keeps for its next wake, or boots ahead of it, once no work is left.

`decide` asks for them through its idle windows' parts ("keepalive", "prewarm"): how long the
last worker is kept (`keepalive_window`), how many more a wake wants and how long each is
kept (`wake_levels`, `prewarm_levels`), priced by the callers of the recent wakes each would
serve (`wake_callers`). The API shows the same holds (`keepalive_levels`).
"""

from __future__ import annotations

from control_plane.domain.scaling.idle import IdleWindows
from control_plane.domain.scaling.policy import MAX_TICK_S, ScalingPolicy, hold_s


def keepalive_window(idle: IdleWindows, policy: ScalingPolicy) -> float:
    """How long the last worker is kept after its work: the idle windows' keep-alive, or the
    scale-down window while they are not representative. Keeping a worker for the window is the
    ski-rental rule for a cold start priced at the window (the owner keeps an unneeded worker
    that long for the chance of a call): within 2× of the best choice made in hindsight at that
    price, whatever comes next; the idle windows only ever shorten it where the deployment's
    own gaps show the shorter keep-alive makes no call colder (`idle.fit_idle_windows`)."""
    if idle.representative:
        return idle.keepalive_s
    return policy.scaledown_window_s


def wake_levels(
    idle: IdleWindows, policy: ScalingPolicy, boot_s: float, service_s: float, window_s: float
) -> list[float]:
    """How long each worker is kept after the deployment went quiet, for the next wake: [0] is
    the last worker's `window_s`; one more per worker a wake needs (`wake_callers`), each kept
    for the ski-rental time of the callers it would serve while a replacement boots (never
    longer than the last one). A sparse deployment's wakes bring one caller: one level."""
    callers = wake_callers(idle, policy, boot_s, service_s)
    return [window_s] + [min(hold_s(policy, boot_s, c), window_s) for c in callers]


def wake_workers(
    idle: IdleWindows,
    policy: ScalingPolicy,
    boot_s: float,
    service_s: float,
    window_s: float,
    idle_for: float,
) -> int:
    """How many of the `wake_levels` are still kept `idle_for` seconds after the deployment
    went quiet. Within a boot of it (and while work runs) every one is: each level is kept for
    at least a boot or the window (`policy.hold_s`), so none needs its price then. (Priced on
    every tick of a busy deployment, the wakes of hundreds of calls took a sixth of its
    decide().)"""
    shortest = min(boot_s, policy.scaledown_window_s, window_s)
    if idle_for < shortest and policy.cold_penalty_s >= 0.0:
        per_worker = _callers_per_worker(policy, boot_s, service_s)
        return _workers_reached(max(idle.wakes or (idle.wake_requests,)), per_worker, policy)
    return sum(1 for w in wake_levels(idle, policy, boot_s, service_s, window_s) if idle_for < w)


def prewarm_levels(
    idle: IdleWindows, policy: ScalingPolicy, boot_s: float, service_s: float
) -> list[float]:
    """On the pre-warm plan, the workers booted ahead of the next wake, each kept until the
    plan's `keepalive_s`: [0] the plan's own worker; then one per further worker the wake needs
    (`wake_callers`) whose callers' wait through a boot, priced, costs more than the time a
    worker pre-warmed for them may sit idle: from the pre-warm to the keep-alive, and the tick
    it starts early (its boot is paid either way, ahead of the wake or at it). A cron job that
    fires a few calls at a time gets one worker, as before; one that fires a batch gets the
    workers its batch wants, ready when it comes."""
    assert idle.prewarm_s is not None
    idles_s = idle.keepalive_s - idle.prewarm_s + MAX_TICK_S  # besides the boot, paid either way
    callers = wake_callers(idle, policy, boot_s, service_s)
    return [idle.keepalive_s] * (1 + sum(1 for c in callers if policy.cold_penalty_s * c > idles_s))


def wake_callers(
    idle: IdleWindows, policy: ScalingPolicy, boot_s: float, service_s: float
) -> list[float]:
    """The callers of a wake each worker after the first would serve, on average over the
    recent wakes (`idle.wakes`; their mean `idle.wake_requests` before any was seen): a worker
    ready when a wake comes starts its slots at once, then each again every service time, so
    `target × (1 + boot / service)` callers over a boot; those beyond that many per worker wait
    for the next one (a replacement would take a boot). The j-th worker after the first serves
    a wake of A callers min(max(A − j × that, 0), that) of them; averaged over the wakes seen,
    not taken at their mean, so that a worker the larger wakes need is priced by them."""
    per_worker = _callers_per_worker(policy, boot_s, service_s)
    wakes = idle.wakes or (idle.wake_requests,)
    largest = max(wakes)
    callers: list[float] = []
    # On every quiet tick of every deployment: plain loops, no generator (a fifth of a quiet
    # decide() went here), and none past the largest wake's last worker (it serves nothing).
    for j in range(1, _workers_reached(largest, per_worker, policy)):
        below = j * per_worker
        served = 0.0
        for a in wakes:
            if a > below:
                served += min(a - below, per_worker)
        callers.append(served / len(wakes))
    return callers


def _callers_per_worker(policy: ScalingPolicy, boot_s: float, service_s: float) -> float:
    """The callers a worker ready at a wake serves over a boot (`wake_callers`)."""
    return max(policy.target_concurrency, 1) * (1.0 + boot_s / max(service_s, 1e-3))


def _workers_reached(largest: float, per_worker: float, policy: ScalingPolicy) -> int:
    """The workers a wake of `largest` callers reaches: the first, and each j-th after it
    (up to `max_workers`) with callers left past the j × `per_worker` the ones below serve."""
    reached = 1
    while reached < policy.max_workers and largest > reached * per_worker:
        reached += 1
    return reached


def keepalive_levels(
    idle: IdleWindows, policy: ScalingPolicy, boot_s: float, service_s: float
) -> list[float]:
    """How long each worker is kept once no work is left, the last one first: on the pre-warm
    plan, the pre-warmed workers' window (`prewarm_levels`); on the keep-alive plan,
    `wake_levels`."""
    if idle.prewarms:
        return prewarm_levels(idle, policy, boot_s, service_s)
    return wake_levels(idle, policy, boot_s, service_s, keepalive_window(idle, policy))
