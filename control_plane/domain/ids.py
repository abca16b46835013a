"""Time-ordered, prefixed ids (`job_…`, `wrk_…`), so ids sort by creation for cursor paging."""

from __future__ import annotations

import os
import threading
from datetime import datetime

# The random part comes from the OS's generator, read this many bytes at a time. One read per
# id released the GIL for a syscall on every request (a request id, a job id, ...), and in a
# busy API process the thread then waited for the GIL again: py-spy found 1-3 % of an API
# process's samples there at 250 admissions/s. A buffer makes it one read per ~800 ids.
POOL_BYTES = 4096
RANDOM_BYTES = 5  # 10 hex digits

_lock = threading.Lock()
_pool = b""
_pos = 0


def new_id(prefix: str, now: datetime) -> str:
    """`prefix_` + 12 hex digits of milliseconds since the epoch + 10 random hex digits."""
    millis = int(now.timestamp() * 1000)
    return f"{prefix}_{millis:012x}{random_hex(RANDOM_BYTES)}"


def random_hex(n: int) -> str:
    """`n` bytes from the OS's cryptographic generator, as hex."""
    global _pool, _pos
    with _lock:
        if _pos + n > len(_pool):
            _pool, _pos = os.urandom(max(POOL_BYTES, n)), 0
        chunk = _pool[_pos : _pos + n]
        _pos += n
    return chunk.hex()


def _forget_pool() -> None:
    """A forked child (Celery's pool) must not hand out its parent's bytes again."""
    global _pool, _pos, _lock
    _pool, _pos, _lock = b"", 0, threading.Lock()


os.register_at_fork(after_in_child=_forget_pool)
