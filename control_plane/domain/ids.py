"""Time-ordered, prefixed ids (`job_…`, `wrk_…`), so ids sort by creation for cursor paging."""

from __future__ import annotations

import secrets
from datetime import datetime


def new_id(prefix: str, now: datetime) -> str:
    """`prefix_` + 12 hex digits of milliseconds since the epoch + 10 random hex digits."""
    millis = int(now.timestamp() * 1000)
    return f"{prefix}_{millis:012x}{secrets.token_hex(5)}"
