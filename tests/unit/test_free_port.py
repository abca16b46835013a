"""free_port: a port that a restarted server can always get back (see its doc)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from control_plane.embedded import processes
from control_plane.embedded.processes import free_port


def test_a_free_port_is_bindable_and_below_the_ephemeral_range() -> None:
    ephemeral_lo = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    for _ in range(20):
        port = free_port()
        assert 1024 <= port < ephemeral_lo
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))


def test_the_range_ends_below_a_lower_ephemeral_range(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "range").write_text("25000\t60999\n")
    monkeypatch.setattr(processes, "EPHEMERAL_RANGE_PATH", tmp_path / "range")
    assert processes._ports_outside_ephemeral() == (20000, 24999)
    assert all(20000 <= free_port() <= 24999 for _ in range(20))


def test_with_no_room_below_it_any_free_port_is_given(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "range").write_text("1024\t65535\n")
    monkeypatch.setattr(processes, "EPHEMERAL_RANGE_PATH", tmp_path / "range")
    port = free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
