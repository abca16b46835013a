from datetime import UTC, datetime, timedelta

from control_plane.domain.crash_loop import GIVE_UP_AFTER, BootHistory, backoff_s, may_start

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def test_first_start_is_free() -> None:
    v = may_start(BootHistory(0, None, None), NOW)
    assert v.start and not v.give_up


def test_backoff_grows_and_is_capped() -> None:
    assert [backoff_s(n) for n in range(5)] == [0.0, 1.0, 2.0, 4.0, 8.0]
    assert backoff_s(100) == 60.0


def test_waits_out_the_backoff_after_a_failure() -> None:
    hist = BootHistory(2, NOW - timedelta(seconds=1), "ObjectNotFound")
    assert not may_start(hist, NOW).start
    assert may_start(hist, NOW + timedelta(seconds=1.01)).start


def test_gives_up_after_repeated_failures() -> None:
    v = may_start(BootHistory(GIVE_UP_AFTER, NOW, "ObjectNotFound"), NOW + timedelta(hours=1))
    assert v.give_up and not v.start


def test_history_counts_the_newest_failures_before_serving() -> None:
    from control_plane.domain.crash_loop import PastWorker, history_of

    t = [NOW - timedelta(seconds=s) for s in (1, 2, 3)]
    failed = [PastWorker(True, False, t[0], "exit_1"), PastWorker(True, False, t[1], "exit_2")]
    assert history_of(failed) == BootHistory(2, t[0], "exit_1")
    served = [failed[0], PastWorker(True, True, t[1], "heartbeat_lost"), failed[1]]
    assert history_of(served).consecutive_failures == 1, "a worker that served breaks the run"
    alive = [PastWorker(False, False, None, None), *failed]
    assert history_of(alive) == BootHistory(0, None, None)
