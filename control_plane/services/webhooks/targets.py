"""Where a webhook may be sent: an http(s) URL whose host resolves only to public addresses,
unless private targets are allowed by configuration (SSRF: a tenant must not reach the
platform's own network through the platform). An address is judged with every IPv4 address it
carries (NAT64, IPv4-mapped, 6to4, Teredo, ...: `domain/addresses.py`). Checked when a URL is
accepted and again before every delivery, since DNS answers can change.
"""

from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass
from urllib.parse import urlparse

from control_plane.domain.addresses import non_public
from control_plane.errors import InvalidRequest


@dataclass(frozen=True, slots=True)
class TargetProblem:
    reason: str  # what is wrong with the target, for the API error or the delivery log
    permanent: bool  # True: never send there; False: may change (DNS did not answer)


def target_problem(url: str, allow_private: bool) -> TargetProblem | None:
    """Why a webhook may not be sent to `url` now (None: it may).

    Refuses non-HTTP URLs and, unless allowed, hosts resolving to non-public addresses. Called
    when a URL is accepted and again before every delivery, since DNS answers can change.
    """
    try:
        parsed = urlparse(url)
        port = parsed.port  # parsed on first read: "[::1", ":99999" and ":abc" raise here
    except ValueError as exc:
        return TargetProblem(f"webhook is not a valid URL: {exc}", permanent=True)
    if parsed.scheme not in {"http", "https"} or not parsed.hostname:
        return TargetProblem("webhook must be an http(s) URL with a host", permanent=True)
    if allow_private:
        return None
    try:
        infos = socket.getaddrinfo(parsed.hostname, port or 443, proto=socket.IPPROTO_TCP)
    except (socket.gaierror, UnicodeError):
        return TargetProblem(f"webhook host {parsed.hostname!r} does not resolve", permanent=False)
    for info in infos:
        # NOTE: every address must pass, not one: the sender may connect to any of them.
        refused = non_public(ipaddress.ip_address(info[4][0]))
        if refused is not None:
            return TargetProblem(
                f"webhook host {parsed.hostname!r} resolves to a non-public address ({refused}); "
                "private, loopback and link-local targets are refused by this platform",
                permanent=True,
            )
    return None


def check_target(url: str, allow_private: bool, field: str = "webhook") -> None:
    """Raise InvalidRequest (naming `field`) when `url` is not an acceptable webhook target."""
    problem = target_problem(url, allow_private)
    if problem is not None:
        raise InvalidRequest(problem.reason, errors=[{"field": field, "message": problem.reason}])
