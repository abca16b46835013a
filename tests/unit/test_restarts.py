from control_plane.embedded.restarts import (
    DEATH_WINDOW_S,
    MAX_BACKOFF_S,
    MAX_DEATHS,
    STABLE_S,
    after_death,
)


def test_first_death_restarts_nearly_at_once() -> None:
    v = after_death([(0.0, 100.0)], 100.0)
    assert not v.give_up and v.restart_at == 100.5


def test_deaths_in_a_row_back_off_doubling_up_to_the_cap() -> None:
    deaths = [(float(i), float(i) + 1) for i in range(0, 10, 2)]  # five quick crashes
    v = after_death(deaths, 10.0)
    assert v.restart_at == 10.0 + 0.5 * 2**4
    many = [(float(i), float(i) + 1) for i in range(MAX_DEATHS - 1)]
    assert after_death(many, 10.0).restart_at <= 10.0 + MAX_BACKOFF_S


def test_a_child_that_ran_long_starts_a_new_streak() -> None:
    deaths = [(0.0, 1.0), (2.0, 3.0), (4.0, 4.0 + STABLE_S)]
    v = after_death(deaths, 4.0 + STABLE_S)
    assert v.restart_at == 4.0 + STABLE_S + 0.5


def test_too_many_deaths_in_the_window_give_up() -> None:
    deaths = [(float(i), float(i) + 0.1) for i in range(MAX_DEATHS)]
    assert after_death(deaths, MAX_DEATHS).give_up
    # the same number spread beyond the window does not
    spread = [(i * DEATH_WINDOW_S, i * DEATH_WINDOW_S + 0.1) for i in range(MAX_DEATHS)]
    assert not after_death(spread, spread[-1][1]).give_up


def test_a_child_killed_after_it_ran_a_while_is_never_given_up_on() -> None:
    # killed every 15 s, MAX_DEATHS times and more within the window: each had started fine
    killed = [(i * 15.0, i * 15.0 + STABLE_S + 1) for i in range(MAX_DEATHS * 2)]
    v = after_death(killed, killed[-1][1])
    assert not v.give_up
    assert v.restart_at == killed[-1][1] + 0.5  # each had started fine: restarted at once
    # while the same deaths right after each start are a crash loop
    crashing = [(i * 15.0, i * 15.0 + 1.0) for i in range(MAX_DEATHS)]
    assert after_death(crashing, crashing[-1][1]).give_up


def test_a_store_that_answered_at_its_start_is_no_crash_loop_however_soon_it_dies() -> None:
    # killed a few seconds after each start, but each start had answered on its port
    killed = [(i * 4.0, i * 4.0 + 3.0, True) for i in range(MAX_DEATHS * 2)]
    v = after_death(killed, killed[-1][1])
    assert not v.give_up and v.restart_at == killed[-1][1] + 0.5
    # the same deaths with no readiness seen: a crash loop
    assert after_death([(a, b, False) for a, b, _ in killed][:MAX_DEATHS], 23.0).give_up
