"""Test hosts on one machine: each a network namespace (`ip netns`) with one veth on a bridge,
so each has an address of its own and a loopback nobody else reaches; the test process stays
in the root namespace, on the bridge's address (the "gateway" host).

    with Network.create(["store", "cp1", "cp2", "worker"]) as net:
        store = net.hosts["store"]
        proc = spawn("redis", cmd, log, before_exec=store.enter)   # runs inside `store`
        redis.Redis(host=store.ip)                                 # from the test process

A process is put in a host by `Host.enter` in its child before exec (setns(2)), so it keeps
its pid, its parent-death signal and the fixtures' way of stopping it. Names carry a random
suffix: concurrent runs do not meet. `Network.close()` deletes the namespaces and the bridge
(stop the processes in them first: deleting a namespace kills nothing in it).
"""

from __future__ import annotations

import ctypes
import ipaddress
import os
import secrets
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field

CLONE_NEWNET = 0x40000000  # <sched.h>
_libc = ctypes.CDLL(None, use_errno=True)


class NoNamespaces(RuntimeError):
    """Network namespaces cannot be made here (not root, no `ip`, a sandbox without them)."""


@dataclass(frozen=True, slots=True)
class Host:
    name: str  # "store", "cp1", …
    namespace: str  # its netns (ip netns list)
    ip: str  # its address on the bridge

    def enter(self) -> None:
        """Move the calling process into this host's network (a child, before exec)."""
        fd = os.open(f"/run/netns/{self.namespace}", os.O_RDONLY)
        try:
            if _libc.setns(fd, CLONE_NEWNET) != 0:
                err = ctypes.get_errno()
                raise OSError(err, f"setns {self.namespace}: {os.strerror(err)}")
        finally:
            os.close(fd)


@dataclass
class Network:
    bridge: str
    gateway: str  # the bridge's address: the test process, as the other hosts see it
    hosts: dict[str, Host] = field(default_factory=dict)
    _links: list[str] = field(default_factory=list)  # host-side veths

    @classmethod
    def create(cls, names: Sequence[str]) -> Network:
        tag = secrets.token_hex(2)
        subnet = _free_subnet()
        gateway, *addresses = [str(a) for a in list(subnet.hosts())[: len(names) + 1]]
        net = cls(bridge=f"plbr{tag}", gateway=gateway)
        try:
            _ip("link", "add", net.bridge, "type", "bridge")
            _ip("addr", "add", f"{gateway}/{subnet.prefixlen}", "dev", net.bridge)
            _ip("link", "set", net.bridge, "up")
            for i, (name, address) in enumerate(zip(names, addresses, strict=True)):
                host = Host(name, f"pl{tag}-{name}", address)
                outside = f"pl{tag}v{i}"  # interface names: at most 15 characters
                _ip("netns", "add", host.namespace)
                net.hosts[name] = host
                _ip("link", "add", outside, "type", "veth", "peer", "name", "eth0",
                    "netns", host.namespace)  # fmt: skip
                net._links.append(outside)
                _ip("link", "set", outside, "master", net.bridge, "up")
                _ip("-n", host.namespace, "addr", "add", f"{address}/{subnet.prefixlen}",
                    "dev", "eth0")  # fmt: skip
                _ip("-n", host.namespace, "link", "set", "eth0", "up")
                _ip("-n", host.namespace, "link", "set", "lo", "up")
        except BaseException:
            net.close()
            raise
        return net

    def __enter__(self) -> Network:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for host in self.hosts.values():
            _ip("netns", "del", host.namespace, check=False)
        for link in self._links:  # gone with its peer's namespace already, unless that failed
            _ip("link", "del", link, check=False)
        _ip("link", "del", self.bridge, check=False)
        self.hosts.clear()


def check_available() -> None:
    """Raise NoNamespaces (with why) unless this process can make network namespaces."""
    if os.geteuid() != 0:
        raise NoNamespaces("network namespaces need root")
    probe = f"plprobe{secrets.token_hex(3)}"
    try:
        _ip("netns", "add", probe)
    except (OSError, subprocess.CalledProcessError) as e:
        raise NoNamespaces(f"`ip netns add` failed: {_why(e)}") from e
    _ip("netns", "del", probe, check=False)


def skip_unless_available() -> None:
    """Skip the calling test, with the reason, where test hosts cannot be made."""
    import pytest

    try:
        check_available()
    except NoNamespaces as e:
        pytest.skip(f"no test hosts: {e}")


def _ip(*args: str, check: bool = True) -> None:
    subprocess.run(["ip", *args], check=check, capture_output=True, text=True)


def _why(e: BaseException) -> str:
    if isinstance(e, subprocess.CalledProcessError):
        return (e.stderr or "").strip() or f"exit {e.returncode}"
    return str(e)


def _free_subnet() -> ipaddress.IPv4Network:
    """A random /24 in 10.200.0.0/13 that no route of this machine covers."""
    routes = subprocess.run(
        ["ip", "-4", "-o", "route", "show", "table", "all"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    taken = []
    for line in routes.splitlines():
        first = line.split()[0] if line.split() else ""
        if first in ("local", "broadcast", "unreachable", "prohibit", "blackhole"):
            first = line.split()[1]
        if first[:1].isdigit():
            taken.append(ipaddress.ip_network(first, strict=False))
    for _ in range(100):
        second, third = 200 + secrets.randbelow(8), secrets.randbelow(256)
        candidate = ipaddress.ip_network(f"10.{second}.{third}.0/24")
        if not any(candidate.overlaps(t) for t in taken):
            return candidate
    raise NoNamespaces("no free /24 in 10.200.0.0/13 for the test hosts")
