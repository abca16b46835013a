"""The phase and ETA a job waiting on a booting worker is told (pure: no clock, no I/O)."""

from __future__ import annotations

from control_plane.domain.cold_start import (
    KEY_REWRITE_S,
    BootingWorker,
    ColdStart,
    PhaseTimes,
    aged,
    estimate,
    key_due,
    soonest,
    worth_publishing,
)

MEASURED = PhaseTimes(boot_s=2.0, load_s=6.0, warm_s=0.5)


def test_a_booting_worker_has_what_is_left_of_its_boot_then_load_and_warm() -> None:
    start = estimate(BootingWorker("booting", in_state_s=0.5), MEASURED)
    assert (start.phase, start.reason, start.eta_s) == ("booting", "no_capacity", 8.0)
    assert start.bytes_done is None and start.bytes_total is None
    # a boot past its median counts as about to end: never a negative part
    assert estimate(BootingWorker("booting", in_state_s=9.0), MEASURED).eta_s == 6.5


def test_without_measurements_a_boot_has_no_eta() -> None:
    assert estimate(BootingWorker("booting", in_state_s=1.0), PhaseTimes()).eta_s is None
    assert estimate(BootingWorker("warming", in_state_s=1.0), PhaseTimes()).eta_s is None


def test_a_load_is_timed_by_its_own_rate_once_bytes_land() -> None:
    # 250 of 1000 bytes in 1 s: 3 s left, then the measured warm-up
    w = BootingWorker("loading", in_state_s=1.0, bytes_done=250, bytes_total=1000)
    start = estimate(w, MEASURED)
    assert (start.phase, start.reason, start.eta_s) == ("loading_weights", "loading_weights", 3.5)
    assert (start.bytes_done, start.bytes_total) == (250, 1000)
    # with nothing measured yet the rate alone answers (the warm-up counts as 0)
    assert estimate(w, PhaseTimes()).eta_s == 3.0
    # every byte landed (the model is being built): only the warm-up is left
    done = BootingWorker("loading", in_state_s=4.0, bytes_done=1000, bytes_total=1000)
    assert estimate(done, MEASURED).eta_s == 0.5


def test_a_load_before_its_first_bytes_uses_the_measured_load() -> None:
    w = BootingWorker("loading", in_state_s=1.0, bytes_done=0, bytes_total=1000)
    assert estimate(w, MEASURED).eta_s == 5.5
    assert estimate(w, PhaseTimes(boot_s=2.0)).eta_s is None


def test_a_warming_worker_has_what_is_left_of_its_warm_up() -> None:
    start = estimate(BootingWorker("warming", in_state_s=0.2), MEASURED)
    assert (start.phase, start.reason, start.eta_s) == ("warming", "warming", 0.3)


def test_jobs_hear_of_the_worker_expected_ready_first() -> None:
    workers = [
        BootingWorker("booting", in_state_s=0.0),
        BootingWorker("loading", in_state_s=1.0, bytes_done=900, bytes_total=1000),
        BootingWorker("loading", in_state_s=1.0, bytes_done=100, bytes_total=1000),
    ]
    start = soonest(workers, MEASURED)
    assert start is not None and start.bytes_done == 900
    # unknown ETAs come last; among them the most advanced phase
    unknown = [BootingWorker("booting", 0.0), BootingWorker("warming", 0.0)]
    first = soonest(unknown, PhaseTimes())
    assert first is not None and first.phase == "warming"
    assert soonest([], MEASURED) is None


def test_jobs_are_told_of_a_new_phase_and_of_real_progress_only() -> None:
    loading = ColdStart("loading_weights", 10.0, 100, 10_000)
    assert worth_publishing(None, loading)
    assert worth_publishing(ColdStart("booting", 12.0), loading)
    # a few bytes more and an ETA within a second: nothing new to say
    assert not worth_publishing(loading, ColdStart("loading_weights", 9.5, 150, 10_000))
    assert worth_publishing(loading, ColdStart("loading_weights", 9.5, 400, 10_000))
    assert worth_publishing(loading, ColdStart("loading_weights", 8.9, 150, 10_000))
    assert worth_publishing(loading, ColdStart("loading_weights", None, 150, 10_000))
    # the last byte is always told
    last_bytes = ColdStart("loading_weights", 9.9, 9_990, 10_000)
    assert worth_publishing(last_bytes, ColdStart("loading_weights", 9.9, 10_000, 10_000))


def test_the_public_form_carries_phase_eta_and_bytes() -> None:
    start = ColdStart("loading_weights", 3.5, 250, 1000)
    assert start.public() == {
        "phase": "loading_weights",
        "eta_s": 3.5,
        "bytes_done": 250,
        "bytes_total": 1000,
    }


def test_a_stored_cold_start_counts_its_eta_down_when_read() -> None:
    start = ColdStart("booting", 9.0)
    assert aged(start, 2.5) == ColdStart("booting", 6.5)
    assert aged(start, 30.0).eta_s == 0.0  # overdue: about to end, never negative
    assert aged(start, -1.0) == start  # a reader whose clock is behind the writer's
    assert aged(ColdStart("booting", None), 5.0).eta_s is None


def test_a_key_is_written_on_news_or_before_it_expires_not_every_tick() -> None:
    booting = ColdStart("booting", 9.0)
    assert key_due(None, booting, 100.0)
    stored = (booting, 100.0)
    # a tick later the ETA has counted down as the reader counts it: nothing to write
    assert not key_due(stored, ColdStart("booting", 8.5), 100.5)
    # the estimate itself moved (a slower boot than measured): written
    assert key_due(stored, ColdStart("booting", 9.0), 101.5)
    assert key_due(stored, ColdStart("loading_weights", 7.0, 0, 1000), 101.0)
    # the key expires COLD_START_TTL_S after its write: written again well before
    assert key_due(stored, ColdStart("booting", 9.0 - KEY_REWRITE_S), 100.0 + KEY_REWRITE_S)


def test_a_worker_held_up_before_it_starts_waits_for_a_node_without_an_eta() -> None:
    times = PhaseTimes(boot_s=2.0, load_s=3.0, warm_s=1.0)
    held = BootingWorker("booting", in_state_s=30.0, held="unschedulable: 0/1 nodes")
    start = estimate(held, times)
    assert start == ColdStart("waiting_for_node", None, detail="unschedulable: 0/1 nodes")
    assert start.reason == "no_capacity" and start.public()["detail"] == start.detail
    # another worker on its way is the one its callers are told about
    on_its_way = BootingWorker("booting", in_state_s=1.0)
    assert soonest([held, on_its_way], times) == estimate(on_its_way, times)
    assert soonest([held], times) == start
    # a new message is news; the same one is not
    assert worth_publishing(start, ColdStart("waiting_for_node", None, detail="0/2 nodes"))
    assert not worth_publishing(start, start)
