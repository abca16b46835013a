"""Warm-pool sizing, placement and the `assigning_warm_worker` phase: pure, on a fake clock."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

import pytest

from common.protocol import WorkerState
from control_plane.domain.cold_start import BootingWorker, PhaseTimes, estimate, soonest
from control_plane.domain.crash_loop import BootHistory
from control_plane.domain.placement import (
    HOST_TIER_BPS,
    PRIOR_BOOT_S,
    Estimates,
    PoolCandidate,
    place,
)
from control_plane.domain.pool import (
    REFILL_SETTLE_S,
    Budget,
    Outlook,
    PoolPlan,
    cold_start_under_way,
    expected_cold_starts,
    plan,
    poisson_quantile,
    targets,
)

# a boot of the built-in engine takes 2 s here
H = {"builtin": 2.0}

T0 = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)
CLEAN = BootHistory(0, None, None)


def test_expected_cold_starts_count_only_deployments_at_zero() -> None:
    outlooks = [
        Outlook("cpu", capacity=0, arrival_rate_per_s=0.5),
        Outlook("cpu", capacity=2, arrival_rate_per_s=100.0),  # warm: a scale-up, not a cold start
    ]
    assert expected_cold_starts(outlooks, 2.0) == pytest.approx(1 - math.exp(-1.0))


def test_poisson_quantile() -> None:
    assert poisson_quantile(0.0) == 0
    # P(N <= 0) = e^-0.005 = 0.995 >= 0.99
    assert poisson_quantile(0.005) == 0
    # mean 1: P(N<=3) = 0.981, P(N<=4) = 0.996
    assert poisson_quantile(1.0) == 4
    assert poisson_quantile(1.0, coverage=0.9) == 2


def test_one_warm_worker_per_type_in_use_more_as_cold_starts_are_expected() -> None:
    budget = Budget(max_workers=10, free_accelerators={})
    quiet = [Outlook("cpu", 0, 0.0)]
    (t,) = targets(quiet, H, budget)
    assert (t.accelerator, t.size, t.reason) == ("cpu", 1, "floor")
    # ten deployments at zero, each called about every 4 s, boots of 2 s
    busy = [Outlook("h100", 0, 0.25) for _ in range(10)]
    (t,) = targets(busy, H, budget)
    mu = 10 * (1 - math.exp(-0.5))
    assert t.expected_cold_starts == pytest.approx(mu, abs=1e-4)
    assert (t.size, t.reason) == (poisson_quantile(mu), "covers_expected")
    assert t.size > 1
    assert targets([], H, budget) == []


def test_the_budget_caps_the_pool_by_accelerators_free_and_in_all() -> None:
    busy = [Outlook("h100", 0, 1.0) for _ in range(5)] + [Outlook("cpu", 0, 0.0)]
    # two H100s not held by deployments' workers
    out = {t.accelerator: t for t in targets(busy, H, Budget(10, {"h100": 2}))}
    assert (out["h100"].size, out["h100"].reason) == (2, "budget")
    assert out["cpu"].size == 1
    # three pool workers in all: the type expecting more cold starts is served first
    out = {t.accelerator: t for t in targets(busy, H, Budget(3, {}))}
    assert out["h100"].size == 3 and out["cpu"].size == 0
    assert out["cpu"].reason == "budget"
    # no pool at all
    assert all(t.size == 0 for t in targets(busy, H, Budget(0, {})))
    # every H100 held: none for the pool (never more workers than accelerators)
    out = {t.accelerator: t for t in targets(busy, H, Budget(10, {"h100": 0}))}
    assert out["h100"].size == 0


def test_each_engine_has_its_own_pool_sized_by_its_deployments_over_its_boot() -> None:
    """vLLM's deployments size a vLLM pool the way the built-in ones size theirs, each over
    its own horizon (a vLLM boot pays its imports): one engine's cold starts never grow the
    other's pool."""
    budget = Budget(max_workers=10, free_accelerators={})
    horizons = {"builtin": 2.0, "vllm": 12.0}
    outlooks = [Outlook("h100", 0, 0.05, engine="vllm") for _ in range(4)]
    outlooks.append(Outlook("h100", 0, 0.0))  # one built-in deployment, rarely called
    out = {(t.accelerator, t.engine): t for t in targets(outlooks, horizons, budget)}
    assert set(out) == {("h100", "builtin"), ("h100", "vllm")}
    mu_vllm = 4 * (1 - math.exp(-0.05 * 12.0))
    assert out[("h100", "vllm")].expected_cold_starts == pytest.approx(mu_vllm, abs=1e-4)
    assert out[("h100", "vllm")].size == poisson_quantile(mu_vllm) > 1
    assert out[("h100", "builtin")].expected_cold_starts == 0.0
    assert (out[("h100", "builtin")].size, out[("h100", "builtin")].reason) == (1, "floor")
    # the same arrivals over the built-in horizon would expect far fewer cold starts
    (short,) = targets(outlooks[:4], {"vllm": 2.0}, budget)
    assert short.expected_cold_starts < out[("h100", "vllm")].expected_cold_starts


def test_a_types_engines_share_its_free_accelerators_and_the_machines_budget() -> None:
    outlooks = [Outlook("h100", 0, 1.0, engine="vllm") for _ in range(3)]
    outlooks += [Outlook("h100", 0, 0.0), Outlook("cpu", 0, 0.0)]
    horizons = {"builtin": 2.0, "vllm": 2.0}
    # three H100s free: vLLM's pool (more cold starts expected) first, the built-in one gets
    # what is left, and the two never hold more than the three
    out = {
        (t.accelerator, t.engine): t for t in targets(outlooks, horizons, Budget(10, {"h100": 3}))
    }
    assert (out[("h100", "vllm")].size, out[("h100", "vllm")].reason) == (3, "budget")
    assert (out[("h100", "builtin")].size, out[("h100", "builtin")].reason) == (0, "budget")
    assert out[("cpu", "builtin")].size == 1
    # four pool workers in all: vLLM's pool first, then by expected cold starts
    out = {(t.accelerator, t.engine): t for t in targets(outlooks, horizons, Budget(4, {}))}
    assert out[("h100", "vllm")].size == 4
    assert out[("h100", "builtin")].size == out[("cpu", "builtin")].size == 0
    # room for every pool's wish: each gets it
    out = {(t.accelerator, t.engine): t for t in targets(outlooks, horizons, Budget(20, {}))}
    assert sum(t.size for t in out.values()) == poisson_quantile(3 * (1 - math.exp(-2))) + 2


def test_the_plan_refills_after_cold_starts_and_backs_off_after_failed_boots() -> None:
    assert plan(2, 0, False, lambda: CLEAN, T0) == PoolPlan(start=2, stop=0)
    assert plan(2, 3, False, lambda: CLEAN, T0) == PoolPlan(start=0, stop=1)
    # a cold start under way: its load has the host's cores; the refill waits
    assert plan(2, 1, True, lambda: CLEAN, T0) == PoolPlan(0, 0)
    # but a pool that is too big shrinks at once
    assert plan(0, 1, True, lambda: CLEAN, T0) == PoolPlan(0, 1)
    # two pool boots failed in a row, the last one second ago: backoff 2 s
    failed = BootHistory(2, T0 - timedelta(seconds=1), "exit_1")
    assert plan(2, 0, False, (lambda: failed), T0) == PoolPlan(0, 0)
    # after the backoff: one at a time
    assert plan(2, 0, False, (lambda: failed), T0 + timedelta(seconds=2)) == PoolPlan(1, 0)


def test_a_cold_start_is_under_way_until_its_worker_is_ready_and_has_settled() -> None:
    settled = T0 - timedelta(seconds=REFILL_SETTLE_S)
    assert not cold_start_under_way([], T0)
    assert not cold_start_under_way([(WorkerState.IDLE, settled), (WorkerState.BUSY, settled)], T0)
    # loading for a minute, or ready but placed a moment ago (its first job runs)
    assert cold_start_under_way([(WorkerState.LOADING, T0 - timedelta(minutes=1))], T0)
    assert cold_start_under_way([(WorkerState.BUSY, T0 - timedelta(seconds=0.5))], T0)
    assert cold_start_under_way([(WorkerState.IDLE, settled), (WorkerState.BOOTING, T0)], T0)


def test_placement_prefers_a_pool_worker_whose_host_holds_the_model() -> None:
    est = Estimates(boot_s=2.0, load_s=3.0, warm_s=0.5, model_bytes=2_000_000_000)
    p = place([PoolCandidate("wrk_a"), PoolCandidate("wrk_b", holds_model=True)], est)
    assert (p.choice, p.worker_id) == ("pool_host_tier", "wrk_b")
    assert p.eta_s == pytest.approx(2e9 / HOST_TIER_BPS + 0.5)
    assert [(o.choice, o.eta_s) for o in p.options] == [
        ("pool_host_tier", p.eta_s),
        ("pool", 3.5),
        ("boot", 5.5),
    ]
    assert p.reason.startswith("pool_host_tier, ready in ~1.0s (vs pool 3.5s, boot 5.5s)")


def test_placement_takes_any_pool_worker_before_a_boot_and_boots_without_one() -> None:
    est = Estimates(boot_s=2.0, load_s=3.0, warm_s=0.5)
    p = place([PoolCandidate("wrk_a")], est)
    assert (p.choice, p.worker_id, p.eta_s) == ("pool", "wrk_a", 3.5)
    # a host that holds the model is never slower than one that does not
    p = place([PoolCandidate("wrk_b", holds_model=True)], Estimates(2.0, 0.1, 0.5, 10**12))
    assert (p.choice, p.worker_id, p.eta_s) == ("pool_host_tier", "wrk_b", 0.6)
    p = place([], est)
    assert (p.choice, p.worker_id, p.eta_s) == ("boot", None, 5.5)
    # nothing measured yet: the priors rank the choices the same way
    p = place([], Estimates(None, None, None))
    assert p.choice == "boot" and p.eta_s > PRIOR_BOOT_S


def test_an_assigned_pool_worker_says_assigning_until_its_first_weight_bytes() -> None:
    times = PhaseTimes(boot_s=2.0, load_s=3.0, warm_s=0.5)
    w = BootingWorker("loading", in_state_s=1.0, assigned=True)
    c = estimate(w, times)
    assert (c.phase, c.reason, c.eta_s) == ("assigning_warm_worker", "assigning_warm_worker", 2.5)
    w = BootingWorker("loading", 1.0, bytes_done=100, bytes_total=400, assigned=True)
    c = estimate(w, times)
    assert (c.phase, c.eta_s) == ("loading_weights", 3.5)
    # a pool worker about to load beats a fresh boot
    boot = BootingWorker("booting", in_state_s=0.0)
    assigned = BootingWorker("loading", in_state_s=0.0, assigned=True)
    assert soonest([boot, assigned], times) == estimate(assigned, times)
