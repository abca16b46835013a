"""A deployment's scaling policy and the prices the autoscaler weighs.

Every decision trades idle worker-seconds against cold starts. Both are priced in the same unit,
worker-seconds, so the rule holds whatever the hardware's rate:

- an idle worker costs one worker-second per second;
- a cold start costs the boot (start → ready, billed) plus `cold_penalty_s`, the price the
  deployment's owner puts on making one caller wait through a boot.
"""

from __future__ import annotations

from dataclasses import dataclass

# Knative KPA defaults (knative/serving `config-autoscaler`): 60 s stable window, 6 s panic
# window (10 % of it), panic when the panic window asks for ≥ 200 % of the ready workers.
STABLE_WINDOW_S = 60.0
PANIC_WINDOW_S = 6.0
PANIC_THRESHOLD = 2.0
# Knative `max-scale-down-rate` 2.0: one tick removes at most half the workers.
MAX_SCALE_DOWN_RATE = 2.0
# The reconciler calls decide() at least this often (`autoscaler_interval_s` is capped at it;
# the simulator ticks at it). A pre-warm falls due between two ticks, so it is started this much
# early: whatever the phase of the ticks, its worker is ready when the call is expected. (Started
# at the first tick after it was due, it was up to a tick late, and the calls that came at the
# shortest gap seen, where the fit puts the pre-warm, found it still booting.)
MAX_TICK_S = 2.0


@dataclass(frozen=True, slots=True)
class ScalingPolicy:
    min_workers: int = 0  # floor, kept even with no traffic (0 = scale to zero)
    max_workers: int = 1  # ceiling, never exceeded
    target_concurrency: int = 1  # jobs one worker holds at once
    scaledown_window_s: float = 60.0  # upper bound on how long an unneeded worker is kept
    max_boot_s: float = 600.0  # a worker not ready after this long is not counted as capacity
    # The price of one cold request in worker-seconds, on top of the boot itself: by default a
    # caller spared a boot is worth a minute of an idle worker. Higher prices buy fewer cold
    # starts with more idle time; `bench/autoscale_sim.py` sweeps it (the Pareto plot).
    cold_penalty_s: float = 60.0
    # How long a job may wait for a slot of a worker that is already ready before the autoscaler
    # asks for another worker for it. A new worker serves it no sooner than a boot (tens of
    # seconds) and is then held for its ski-rental time; a short wait on a worker that is there
    # costs neither. Every part sizes for the work the ready workers will not start within
    # this wait. The default is the tail latency the platform keeps against an always-warm
    # fleet: a caller's delay at the 99th percentile within a second of a keep-alive's (what
    # `bench/autoscale_family.py` checks on every member). 0: a worker for every job that
    # waits.
    queue_wait_s: float = 1.0


def counted_boot_s(policy: ScalingPolicy, boot_s: float) -> float:
    """The boot the autoscaler plans with: a boot past `max_boot_s` is not waited for."""
    return min(boot_s, policy.max_boot_s)


def cold_cost_s(policy: ScalingPolicy, boot_s: float, cold_requests: float = 1.0) -> float:
    """Worker-seconds one cold start costs: its boot plus the wait of each of the
    `cold_requests` callers it makes wait, priced."""
    return boot_s + policy.cold_penalty_s * cold_requests


def wait_price(policy: ScalingPolicy, boot_s: float) -> float:
    """Worker-seconds one second of a caller's wait costs: a wait through a whole boot costs
    `cold_penalty_s` (the cold start's price for its caller), a shorter one its share."""
    return policy.cold_penalty_s / max(boot_s, 1e-3)


def hold_s(policy: ScalingPolicy, boot_s: float, cold_requests: float = 1.0) -> float:
    """How long an unneeded worker is kept. Keeping it costs one worker-second per second;
    letting it go and needing it again costs a cold start. Keeping it exactly as long as a cold
    start costs is the ski-rental rule: never more than twice the cost of the best choice made
    in hindsight, whatever comes next. The scale-down window caps it."""
    return min(cold_cost_s(policy, boot_s, cold_requests), policy.scaledown_window_s)


def waits_allowed(policy: ScalingPolicy, ready: int, boot_s: float, service_s: float) -> float:
    """Jobs the `ready` workers start within `queue_wait_s`, at the rate their slots free up
    (target / service_s each): so many may wait for them instead of for a new worker. Never
    longer than a boot: past that, a worker started now would serve a job sooner."""
    # (conditionals for min and max: decide() runs this twice a tick)
    wait_s = policy.queue_wait_s
    wait_s = boot_s if boot_s < wait_s else wait_s
    target = policy.target_concurrency
    target = 1 if target < 1 else target
    # a measured mean of 0 (jobs that end at once) counts as 1 ms: finite, and still many jobs
    return wait_s * ready * target / (1e-3 if service_s < 1e-3 else service_s)


def under_quantile(policy: ScalingPolicy, boot_s: float) -> float:
    """The quantile of forecast demand to provision for (the newsvendor's critical ratio).

    One worker too few costs a cold start: the demand part boots the missing worker as soon as
    work waits, and a caller waits through it. One too many costs its idle time: it is held
    for `hold_s` after it was last needed (its boot is paid either way, early or late).
    Provision the demand quantile c_under / (c_under + c_over)."""
    c_under = cold_cost_s(policy, boot_s)
    c_over = max(hold_s(policy, boot_s), 1.0)
    return c_under / (c_under + c_over)


# Priors until a deployment version has measurements of its own. They matter only until the
# first worker is ready (its boot is measured then) and the first jobs end: a boot (process
# start, runtime import, weight streaming, warm-up) of a mid-size model takes tens of seconds,
# and a job holding a slot ten seconds is a chat completion of a few hundred tokens at tens of
# tokens per second. The simulator runs the same priors against boots of 5, 30 and 84 s.
DEFAULT_BOOT_S = 30.0
DEFAULT_SERVICE_S = 10.0
