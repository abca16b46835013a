"""Where a deployment's next worker comes from (pure), by estimated time to ready.

    pool_host_tier  an idle warm-pool worker on a host whose memory tier holds the model:
                    the weights come at memory speed        ETA = bytes ÷ tier rate + warm
    pool            any idle warm-pool worker: no boot      ETA = load + warm
    boot            a new worker process                    ETA = boot + load + warm

Times are the deployment version's measured medians (`cold_start.PhaseTimes`); without them,
the priors below. A host-tier load is the model's bytes at the host tier's rate (without the
bytes, a share of a measured load). Like ServerlessLLM's scheduler, the choice with the
smallest ETA wins, and every option's ETA is kept with it (logs, the scaling decision).

>>> place([PoolCandidate("wrk_1", holds_model=True)], Estimates(2.0, 3.0, 0.5, 2_000_000_000))
Placement(choice='pool_host_tier', worker_id='wrk_1', eta_s=1.0, options=(...))
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

# Priors for a deployment version nothing was measured for yet (seconds).
PRIOR_BOOT_S, PRIOR_LOAD_S, PRIOR_WARM_S = 2.0, 5.0, 0.5
# Reading a checkpoint from the host's memory tier (a copy out of /dev/shm), bytes per second.
HOST_TIER_BPS = 4e9
# Without the model's size: a host-tier load takes this share of a measured load.
HOST_TIER_SHARE = 0.25

POOL_HOST_TIER, POOL, BOOT = "pool_host_tier", "pool", "boot"


@dataclass(frozen=True, slots=True)
class PoolCandidate:
    worker_id: str  # an idle warm-pool worker of the right accelerator type
    holds_model: bool = False  # its host's memory tier holds the model's weights


@dataclass(frozen=True, slots=True)
class Estimates:
    boot_s: float | None  # process start → runtime ready (measured median)
    load_s: float | None  # weights from object storage into the device, engine built
    warm_s: float | None  # warm-up
    model_bytes: int | None = None  # the checkpoint's weight bytes, when known


@dataclass(frozen=True, slots=True)
class Option:
    choice: str  # pool_host_tier | pool | boot
    eta_s: float  # estimated seconds to ready


@dataclass(frozen=True, slots=True)
class Placement:
    choice: str  # the option taken
    worker_id: str | None  # the pool worker taken (None: boot a new one)
    eta_s: float  # its estimated seconds to ready
    options: tuple[Option, ...]  # every option there was, fastest first

    @property
    def reason(self) -> str:
        others = ", ".join(f"{o.choice} {o.eta_s:.1f}s" for o in self.options[1:])
        return f"{self.choice}, ready in ~{self.eta_s:.1f}s" + (f" (vs {others})" if others else "")


def place(candidates: Sequence[PoolCandidate], est: Estimates) -> Placement:
    boot = PRIOR_BOOT_S if est.boot_s is None else est.boot_s
    load = PRIOR_LOAD_S if est.load_s is None else est.load_s
    warm = PRIOR_WARM_S if est.warm_s is None else est.warm_s
    tier_load = est.model_bytes / HOST_TIER_BPS if est.model_bytes else HOST_TIER_SHARE * load
    tier_load = min(tier_load, load)
    options: list[tuple[Option, str | None]] = [(Option(BOOT, boot + load + warm), None)]
    holding = [c for c in candidates if c.holds_model]
    # a plain pool choice leaves the workers on hosts that hold the model to those that can
    # use it
    pooled = [c for c in candidates if not c.holds_model] + holding
    if pooled:
        options.append((Option(POOL, load + warm), pooled[0].worker_id))
    if holding:
        options.append((Option(POOL_HOST_TIER, tier_load + warm), holding[0].worker_id))
    order = {POOL_HOST_TIER: 0, POOL: 1, BOOT: 2}
    options.sort(key=lambda o: (o[0].eta_s, order[o[0].choice]))
    best, worker_id = options[0]
    rounded = tuple(Option(o.choice, round(o.eta_s, 2)) for o, _ in options)
    return Placement(best.choice, worker_id, rounded[0].eta_s, rounded)
