"""Where a webhook may be sent: an http(s) URL whose host resolves only to public addresses,
unless private targets are allowed by configuration (SSRF: a tenant must not reach the
platform's own network through the platform). Checked when a URL is accepted and again before
every delivery, since DNS answers can change.
"""

from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass
from urllib.parse import urlparse

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
    parsed = urlparse(url)
    if parsed.scheme not in {"http", "https"} or not parsed.hostname:
        return TargetProblem("webhook must be an http(s) URL with a host", permanent=True)
    if allow_private:
        return None
    try:
        infos = socket.getaddrinfo(parsed.hostname, parsed.port or 443, proto=socket.IPPROTO_TCP)
    except (socket.gaierror, UnicodeError):
        return TargetProblem(f"webhook host {parsed.hostname!r} does not resolve", permanent=False)
    for info in infos:
        addr = ipaddress.ip_address(info[4][0])
        if not addr.is_global:
            return TargetProblem(
                f"webhook host {parsed.hostname!r} resolves to a non-public address ({addr}); "
                "private, loopback and link-local targets are refused by this platform",
                permanent=True,
            )
    return None


def check_target(url: str, allow_private: bool, field: str = "webhook") -> None:
    """Raise InvalidRequest (naming `field`) when `url` is not an acceptable webhook target."""
    problem = target_problem(url, allow_private)
    if problem is not None:
        raise InvalidRequest(problem.reason, errors=[{"field": field, "message": problem.reason}])
