"""Where a webhook may go when private targets are refused: every address a host resolves to,
and every IPv4 address carried inside an IPv6 one (NAT64, IPv4-mapped, -compatible and
-translated, 6to4, Teredo), must be public. Literal addresses only: `getaddrinfo` answers them
without DNS."""

from __future__ import annotations

from ipaddress import IPv4Address, IPv6Address, ip_address

import pytest

from control_plane.domain import addresses
from control_plane.domain.addresses import Embedded
from control_plane.services.webhooks import targets

REFUSED = {
    # NAT64 (RFC 6052): a translator sends 64:ff9b::/96 to the IPv4 in its last 32 bits.
    "http://[64:ff9b::a9fe:a9fe]/": "169.254.169.254",
    "http://[64:ff9b::7f00:1]:8080/x": "127.0.0.1",
    "http://[64:ff9b::a00:1]/": "10.0.0.1",
    # Local-use NAT64 (RFC 8215): not globally reachable at all, whatever it carries.
    "http://[64:ff9b:1::a9fe:a9fe]/": "169.254.169.254",
    "http://[64:ff9b:1::808:808]/": "64:ff9b:1::808:808",
    # IPv4-compatible (deprecated, RFC 4291 §2.5.5.1), IPv4-mapped, IPv4-translated (SIIT).
    "http://[::127.0.0.1]/": "127.0.0.1",
    "http://[::a9fe:a9fe]/": "169.254.169.254",
    "http://[::ffff:127.0.0.1]/": "127.0.0.1",
    "http://[::ffff:a9fe:a9fe]/": "169.254.169.254",
    "http://[::ffff:0:7f00:1]/": "127.0.0.1",
    # 6to4 (RFC 3056): the IPv4 relay in bits 16-47.
    "http://[2002:a9fe:a9fe::]/": "169.254.169.254",
    "http://[2002:7f00:1::1]/": "127.0.0.1",
    # Teredo (RFC 4380): client 127.0.0.1 (stored XOR 0xffffffff), server 65.54.227.120.
    "http://[2001:0:4136:e378:8000:63bf:80ff:fffe]/": "127.0.0.1",
    # Multicast, and ranges IANA marks not globally reachable that Python 3.11 calls global.
    "http://224.0.0.1/": "224.0.0.1",
    "http://[ff02::1]/": "ff02::1",
    "http://[3fff::1]/": "3fff::1",
    "http://[5f00::1]/": "5f00::1",
    # The plain spellings, as before.
    "http://127.0.0.1/": "127.0.0.1",
    "http://169.254.169.254/latest/meta-data": "169.254.169.254",
    "http://[::1]/": "::1",
    "http://[fe80::1]/": "fe80::1",
    "http://[fc00::1]/": "fc00::1",
    "http://2130706433/": "127.0.0.1",  # a decimal IPv4 that getaddrinfo accepts
}

ALLOWED = [
    "https://8.8.8.8/hook",
    "http://[2001:4860:4860::8888]/",
    "http://[2606:4700::1111]:8443/x",
    "http://[::ffff:8.8.8.8]/",  # mapped, carrying a public address
    "http://[64:ff9b::808:808]/",  # NAT64 of a public address
    "http://[2002:808:808::1]/",  # 6to4 through a public relay
]


@pytest.mark.parametrize("url", sorted(REFUSED))
def test_internal_addresses_are_refused_in_every_spelling(url: str) -> None:
    problem = targets.target_problem(url, allow_private=False)
    assert problem is not None, url
    assert problem.permanent and "non-public" in problem.reason
    assert REFUSED[url] in problem.reason  # the address that decided it is named
    assert targets.target_problem(url, allow_private=True) is None


@pytest.mark.parametrize("url", ALLOWED)
def test_public_addresses_are_allowed(url: str) -> None:
    assert targets.target_problem(url, allow_private=False) is None


@pytest.mark.parametrize(
    ("address", "embedded"),
    [
        ("64:ff9b::a9fe:a9fe", [Embedded(IPv4Address("169.254.169.254"), "NAT64")]),
        ("64:ff9b:1::a00:1", [Embedded(IPv4Address("10.0.0.1"), "local-use NAT64")]),
        ("::127.0.0.1", [Embedded(IPv4Address("127.0.0.1"), "IPv4-compatible")]),
        ("::ffff:127.0.0.1", [Embedded(IPv4Address("127.0.0.1"), "IPv4-mapped")]),
        ("::ffff:0:a00:1", [Embedded(IPv4Address("10.0.0.1"), "IPv4-translated")]),
        ("2002:a9fe:a9fe::1", [Embedded(IPv4Address("169.254.169.254"), "6to4")]),
        (
            "2001:0:4136:e378:8000:63bf:80ff:fffe",
            [
                Embedded(IPv4Address("65.54.227.120"), "Teredo server"),
                Embedded(IPv4Address("127.0.0.1"), "Teredo client"),
            ],
        ),
        ("2001:4860:4860::8888", []),
        ("2606:4700::1111", []),
        ("fe80::1", []),
    ],
)
def test_embedded_ipv4(address: str, embedded: list[Embedded]) -> None:
    assert addresses.embedded_ipv4(IPv6Address(address)) == embedded


def test_the_reason_says_how_the_address_is_reached() -> None:
    reason = addresses.non_public(ip_address("64:ff9b::a9fe:a9fe"))
    assert reason == "64:ff9b::a9fe:a9fe, which carries 169.254.169.254 (NAT64)"
    assert addresses.non_public(ip_address("10.1.2.3")) == "10.1.2.3"
    assert addresses.non_public(ip_address("::ffff:8.8.8.8")) is None
    assert addresses.non_public(ip_address("1.1.1.1")) is None


@pytest.mark.parametrize("url", ["http://[::1/", "http://h:99999/", "http://h:abc/"])
def test_a_malformed_url_is_a_permanent_problem_even_where_private_targets_are_allowed(
    url: str,
) -> None:
    for allow_private in (True, False):
        problem = targets.target_problem(url, allow_private)
        assert problem is not None and problem.permanent and "not a valid URL" in problem.reason
