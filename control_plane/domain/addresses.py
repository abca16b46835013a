"""Which IP addresses the platform may connect to on a tenant's behalf (SSRF), judged on the
address alone: pure, no DNS (the caller resolves; `services/webhooks/targets.py`).

An address may be used only if it is public and so is every IPv4 address carried inside it.
An IPv6 address can carry an IPv4 one, and a packet sent to it can end there: a NAT64
translator forwards 64:ff9b::/96 to the address in its last 32 bits, a 6to4 relay forwards
2002::/16 to bits 16-47, a host with an automatic tunnel forwards IPv4-compatible addresses.
Python's `is_global` judges only the IPv6 prefix (in 3.11 it calls 64:ff9b::a9fe:a9fe, which
a NAT64 gateway turns into the metadata service 169.254.169.254, global), so each carried
IPv4 is judged on its own.

>>> non_public(IPv6Address("64:ff9b::a9fe:a9fe"))
'64:ff9b::a9fe:a9fe, which carries 169.254.169.254 (NAT64)'
>>> non_public(IPv6Address("2606:4700::1111")) is None
True
"""

from __future__ import annotations

from dataclasses import dataclass
from ipaddress import IPv4Address, IPv6Address, IPv6Network

_LOW_32 = 0xFFFFFFFF

# Prefixes that only spell an IPv4 address: such an address is exactly as public as the IPv4
# one it carries (Python's verdict on the prefix itself varies between versions).
_MAPPED = IPv6Network("::ffff:0:0/96")  # IPv4-mapped (RFC 4291 §2.5.5.2)
_TRANSLATED = IPv6Network("::ffff:0:0:0/96")  # IPv4-translated (SIIT, RFC 2765)
_COMPATIBLE = IPv6Network("::/96")  # IPv4-compatible (deprecated, RFC 4291 §2.5.5.1)
_NAT64 = IPv6Network("64:ff9b::/96")  # the well-known NAT64 prefix (RFC 6052)
_SPELLINGS = (
    (_MAPPED, "IPv4-mapped"),
    (_TRANSLATED, "IPv4-translated"),
    (_COMPATIBLE, "IPv4-compatible"),
    (_NAT64, "NAT64"),
)

# Local-use NAT64 (RFC 8215). Its operator picks where the IPv4 sits (RFC 6052 allows several
# prefix lengths); the /96 form is read for the message, and the whole /48 is refused anyway.
_NAT64_LOCAL = IPv6Network("64:ff9b:1::/48")

# IANA's special-purpose registry marks these not globally reachable; Python 3.11's
# `is_global` does not know them yet.
_NOT_GLOBAL = (
    _NAT64_LOCAL,
    IPv6Network("2001::/32"),  # Teredo, inside 2001::/23 (stated here, whatever Python says)
    IPv6Network("3fff::/20"),  # documentation (RFC 9637)
    IPv6Network("5f00::/16"),  # SRv6 SIDs (RFC 9602)
)


@dataclass(frozen=True, slots=True)
class Embedded:
    ipv4: IPv4Address  # the IPv4 address carried inside an IPv6 one
    how: str  # the mechanism that can deliver to it: "NAT64", "6to4", "Teredo client", ...


def embedded_ipv4(addr: IPv6Address) -> list[Embedded]:
    """Every IPv4 address `addr` carries, with how it would be reached ([] for none)."""
    low = IPv4Address(int(addr) & _LOW_32)
    for network, how in _SPELLINGS:
        if addr in network:
            return [Embedded(low, how)]
    if addr in _NAT64_LOCAL:
        return [Embedded(low, "local-use NAT64")]
    if addr.sixtofour is not None:
        return [Embedded(addr.sixtofour, "6to4")]
    if addr.teredo is not None:
        # Teredo stores the client's address XOR 0xffffffff; `teredo` undoes that.
        server, client = addr.teredo
        return [Embedded(server, "Teredo server"), Embedded(client, "Teredo client")]
    return []


def _public(addr: IPv4Address | IPv6Address) -> bool:
    # Multicast is refused too: Python 3.11 calls ff02::1 and 224.0.0.1 global, and no
    # webhook receiver is a group.
    return addr.is_global and not addr.is_multicast


def non_public(addr: IPv4Address | IPv6Address) -> str | None:
    """Why the platform must not connect to `addr`, as the words that name it in a refusal
    ("10.0.0.1"; "::a9fe:a9fe, which carries 169.254.169.254 (IPv4-compatible)"); None when
    it may: `addr` is public and so is every IPv4 address it carries."""
    if isinstance(addr, IPv4Address):
        return None if _public(addr) else str(addr)
    embedded = embedded_ipv4(addr)
    for e in embedded:
        if not _public(e.ipv4):
            return f"{addr}, which carries {e.ipv4} ({e.how})"
    if embedded and any(addr in network for network, _ in _SPELLINGS):
        return None  # only a spelling of a public IPv4 address
    if not _public(addr) or any(addr in network for network in _NOT_GLOBAL):
        return str(addr)
    return None
