"""Time at the edges: the clock the API and the reconcilers are given, and the one wire format.

Decisions take `now` as an argument; processes read it from a `Clock`, which tests replace.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime

# A source of the current time (timezone-aware UTC).
Clock = Callable[[], datetime]


def utc_now() -> datetime:
    return datetime.now(UTC)


def iso(dt: datetime | None) -> str | None:
    """RFC 3339 in UTC with a `Z` (the only time format of the API); None stays None."""
    return None if dt is None else dt.isoformat().replace("+00:00", "Z")
