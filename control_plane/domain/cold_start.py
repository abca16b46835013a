"""What a job waiting on a booting worker is told: the cold start's phase and its ETA (pure).

A worker boots (`booting`: process start, runtime import), loads its weights (`loading`, with
the bytes landed so far from its heartbeat) and warms up (`warming`). The ETA of one worker is
what is left of its current phase plus the phases after it:

    booting   max(boot_s − in_state, 0) + load_s + warm_s       (measured medians)
    assigning_warm_worker (a warm-pool worker given this deployment, before its first bytes)
              max(load_s − in_state, 0) + warm_s                (no boot to wait for)
    loading   bytes left ÷ the rate of this very load so far + warm_s
              (before the first bytes: max(load_s − in_state, 0) + warm_s)
    warming   max(warm_s − in_state, 0)

A worker whose start is held up outside it (on Kubernetes, a pod no node can take yet) is in
phase `waiting_for_node`, with the scheduler's words in `detail` and no ETA: it may never start,
and its worker fails with that reason after the provider's grace.

A phase overrunning its median counts as about to end (never a negative ETA, and no guess about
by how much it will overrun). Without a measurement the ETA is unknown (None), except that an
unmeasured warm-up counts as 0 s once the weight bytes give a rate: it is short next to them.
A deployment's jobs are told about the worker expected ready first.

>>> w = BootingWorker("loading", in_state_s=2.0, bytes_done=500, bytes_total=1500)
>>> estimate(w, PhaseTimes(boot_s=1.7, load_s=None, warm_s=0.5))
ColdStart(phase='loading_weights', eta_s=4.5, bytes_done=500, bytes_total=1500)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

# worker state → the phase a waiting job sees, and the job's status_reason in that phase
PHASE_OF_STATE = {"booting": "booting", "loading": "loading_weights", "warming": "warming"}
REASON_OF_PHASE = {
    "waiting_for_node": "no_capacity",
    "booting": "no_capacity",
    "assigning_warm_worker": "assigning_warm_worker",
    "loading_weights": "loading_weights",
    "warming": "warming",
}
# Publish again within a phase once the ETA moved this much or this share of the bytes landed.
ETA_STEP_S = 1.0
BYTES_STEP = 0.02
# A deployment's stored cold start (what GET /v1/jobs/{id} shows) is written again at least this
# often while it lasts (its key expires 5 s after the last write: `services/jobs/cold_starts`).
KEY_REWRITE_S = 2.0


@dataclass(frozen=True, slots=True)
class PhaseTimes:
    """Median seconds of each phase over the deployment version's recent workers."""

    boot_s: float | None = None  # process start → loading
    load_s: float | None = None  # loading → warming (weights and engine build)
    warm_s: float | None = None  # warming → ready


@dataclass(frozen=True, slots=True)
class BootingWorker:
    state: str  # booting | loading | warming
    in_state_s: float  # seconds since it entered `state`
    bytes_done: int | None = None  # weight bytes landed (loading only, from its heartbeat)
    bytes_total: int | None = None  # weight bytes to land
    assigned: bool = False  # a warm-pool worker given this deployment (it did not boot for it)
    # why its start is held up outside it (providers' `waiting`); None: it is on its way
    held: str | None = None


@dataclass(frozen=True, slots=True)
class ColdStart:
    phase: str  # waiting_for_node | booting | assigning_warm_worker | loading_weights | warming
    eta_s: float | None  # seconds until the worker should be ready; None: unknown
    bytes_done: int | None = None
    bytes_total: int | None = None
    detail: str | None = None  # waiting_for_node: why (the scheduler's words)

    @property
    def reason(self) -> str:
        """The status_reason of the jobs waiting on it."""
        return REASON_OF_PHASE[self.phase]

    def public(self) -> dict[str, Any]:
        """The JSON a job's `starting` event, GET and webhook carry (`detail` when set)."""
        out: dict[str, Any] = {
            "phase": self.phase,
            "eta_s": self.eta_s,
            "bytes_done": self.bytes_done,
            "bytes_total": self.bytes_total,
        }
        if self.detail is not None:
            out["detail"] = self.detail
        return out


def _left(median_s: float | None, in_state_s: float) -> float | None:
    return None if median_s is None else max(median_s - in_state_s, 0.0)


def _sum(*parts: float | None) -> float | None:
    return None if any(p is None for p in parts) else sum(p for p in parts if p is not None)


def estimate(w: BootingWorker, times: PhaseTimes) -> ColdStart:
    if w.held is not None and w.state == "booting":
        return ColdStart("waiting_for_node", None, detail=w.held)
    phase = PHASE_OF_STATE[w.state]
    if w.assigned and w.state == "loading" and not w.bytes_done:
        phase = "assigning_warm_worker"
    eta: float | None
    if w.state == "booting":
        eta = _sum(_left(times.boot_s, w.in_state_s), times.load_s, times.warm_s)
    elif w.state == "loading":
        done, total = w.bytes_done or 0, w.bytes_total or 0
        if done > 0 and total > 0 and w.in_state_s > 0:
            rate = done / w.in_state_s
            eta = (total - min(done, total)) / rate + (times.warm_s or 0.0)
        else:
            eta = _sum(_left(times.load_s, w.in_state_s), times.warm_s)
    else:
        eta = _left(times.warm_s, w.in_state_s)
    loading = w.state == "loading"
    return ColdStart(
        phase=phase,
        eta_s=None if eta is None else round(eta, 1),
        bytes_done=w.bytes_done if loading else None,
        bytes_total=w.bytes_total if loading else None,
    )


_ORDER = {
    "warming": 0,
    "loading_weights": 1,
    "assigning_warm_worker": 2,
    "booting": 3,
    "waiting_for_node": 4,
}


def soonest(workers: Iterable[BootingWorker], times: PhaseTimes) -> ColdStart | None:
    """The cold start of the worker expected ready first (known ETAs first, then the most
    advanced phase); None without booting workers."""
    starts = [estimate(w, times) for w in workers]
    if not starts:
        return None
    return min(
        starts,
        key=lambda c: (c.eta_s is None, c.eta_s or 0.0, _ORDER[c.phase]),
    )


def aged(start: ColdStart, elapsed_s: float) -> ColdStart:
    """`start` read `elapsed_s` after it was made: its ETA counted down, never below 0."""
    if start.eta_s is None or elapsed_s <= 0:
        return start
    return dataclasses.replace(start, eta_s=round(max(start.eta_s - elapsed_s, 0.0), 1))


def key_due(stored: tuple[ColdStart, float] | None, new: ColdStart, now_s: float) -> bool:
    """Whether a deployment's key, `stored` (what it says, when written), must be written with
    `new`: read now, with its ETA counted down, it would say something `worth_publishing`
    differs; or its expiry is near. Counted down, a steady ETA needs no write each tick."""
    if stored is None:
        return True
    start, at = stored
    return now_s - at >= KEY_REWRITE_S or worth_publishing(aged(start, now_s - at), new)


def worth_publishing(last: ColdStart | None, new: ColdStart) -> bool:
    """Whether waiting jobs hear of `new`: a new phase, or within one, the ETA or the bytes
    moved enough (so a stream of 1000 jobs is not rewritten every tick for nothing)."""
    if last is None or last.phase != new.phase or last.detail != new.detail:
        return True
    if (last.eta_s is None) != (new.eta_s is None):
        return True
    if (
        last.eta_s is not None
        and new.eta_s is not None
        and abs(last.eta_s - new.eta_s) >= ETA_STEP_S
    ):
        return True
    total = new.bytes_total or 0
    moved = (new.bytes_done or 0) - (last.bytes_done or 0)
    return total > 0 and (moved >= BYTES_STEP * total or new.bytes_done == total != last.bytes_done)
