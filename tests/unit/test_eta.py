from control_plane.domain.eta import estimate_wait_s


def test_waves_of_capacity() -> None:
    assert estimate_wait_s(0, 2.0, 2, None) == 0.0
    assert estimate_wait_s(3, 2.0, 2, None) == 2.0  # second wave
    assert estimate_wait_s(4, 2.0, 2, None) == 4.0


def test_no_capacity_adds_the_boot() -> None:
    assert estimate_wait_s(0, 1.0, 0, 5.0) == 5.0
    assert estimate_wait_s(0, None, 0, None) is None
