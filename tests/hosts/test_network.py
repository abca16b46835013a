"""The test hosts are hosts: each reaches the others and the test process by address, and
nobody reaches another's loopback (so a 127.0.0.1 that leaks into a cross-host setting fails)."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator

import pytest

from tests.hosts.network import Host, Network, skip_unless_available

CONNECT = "import socket, sys; socket.create_connection((sys.argv[1], int(sys.argv[2])), 3)"


@pytest.fixture(scope="module")
def net() -> Iterator[Network]:
    skip_unless_available()
    with Network.create(["a", "b"]) as network:
        yield network


def reaches(host: Host, ip: str, port: int) -> bool:
    done = subprocess.run(
        [sys.executable, "-c", CONNECT, ip, str(port)],
        preexec_fn=host.enter, capture_output=True, timeout=30,
    )  # fmt: skip
    return done.returncode == 0


def listening(ip: str) -> socket.socket:
    s = socket.socket()
    s.bind((ip, 0))
    s.listen()
    return s


def test_hosts_reach_each_other_and_the_gateway_but_no_other_loopback(net: Network) -> None:
    a, b = net.hosts["a"], net.hosts["b"]
    assert a.ip != b.ip
    with listening(net.gateway) as gateway, listening("127.0.0.1") as loopback:
        assert reaches(a, net.gateway, gateway.getsockname()[1])
        assert reaches(b, net.gateway, gateway.getsockname()[1])
        assert not reaches(a, "127.0.0.1", loopback.getsockname()[1])
    # a server inside `a`, on its address: `b` reaches it
    server = subprocess.Popen(
        [sys.executable, "-m", "http.server", "--bind", a.ip, "8123"],
        preexec_fn=a.enter, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        for _ in range(100):
            if reaches(b, a.ip, 8123):
                break
        else:
            pytest.fail("b never reached a's server")
    finally:
        server.kill()
        server.wait()


def test_close_removes_the_namespaces_and_the_bridge() -> None:
    skip_unless_available()
    network = Network.create(["solo"])
    namespace, bridge = network.hosts["solo"].namespace, network.bridge
    network.close()
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    assert namespace not in names and bridge not in links
