"""Which log lines a tenant reads for a job, a worker or a deployment; pure.

Lines come from two kinds of source (services/logs/): a worker's own log, which belongs to
the tenant whose deployment the worker serves, and the platform processes' logs (API,
Celery, reconciler), which every tenant's calls share. A shared line is shown only when it
carries the target's id (`job_id`, or `deployment_id`); from a worker's own log, a job's
lines are those with its `job_id`, and for the worker or its deployment every line, a text
line that is not JSON (a crash's traceback written before logging started) included, as
`{"message": …, "raw": true}` with the time of the line before it.

    sel = Selector(job_id="job_1", deployment_id=None, worker_id=None, since=None)
    keep(parse('{"timestamp": "…", "job_id": "job_1", …}'), sel, own=False)   # True

Times: the lines' `timestamp` is ISO 8601 in UTC with milliseconds and a `Z`
(common/logs.py), so comparing the strings compares the times.
"""

from __future__ import annotations

import heapq
import json
import re
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

DEFAULT_LIMIT = 1_000  # lines a read returns unless told
MAX_LIMIT = 10_000  # lines one read may ask for
MAX_SINCE_S = 366 * 24 * 3600  # `since` as seconds ago: at most a year
_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhd]?)")
_UNIT_S = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


@dataclass(frozen=True, slots=True)
class Selector:
    job_id: str | None  # a job's lines only (its id in `job_id`)
    deployment_id: str | None  # a deployment's lines (shared logs: its id in `deployment_id`)
    worker_id: str | None  # a worker's lines (shared logs: its id in `worker_id`)
    since: str | None  # lines at or after this time (`timestamp` string, see iso()); None: all


def parse_since(value: str, now: datetime) -> datetime:
    """`since` as a time: ISO 8601 with a zone ("2025-06-01T12:00:00Z"), or an age: seconds
    ("300") or with a unit ("90s", "15m", "2h", "1d"). ValueError saying what is accepted."""
    text = value.strip()
    m = _DURATION.fullmatch(text)
    if m is not None:
        seconds = float(m[1]) * _UNIT_S[m[2]]
        if seconds > MAX_SINCE_S:
            raise ValueError(f"since {value!r} is more than a year ago")
        return now - timedelta(seconds=seconds)
    try:
        at = datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise ValueError(
            f"since {value!r} is neither an ISO 8601 time (2025-06-01T12:00:00Z) nor an age "
            "(seconds, or 90s, 15m, 2h, 1d)"
        ) from None
    if at.tzinfo is None:
        raise ValueError(f"since {value!r} has no time zone: add Z (UTC) or an offset")
    return at.astimezone(UTC)


def iso(at: datetime) -> str:
    """A time as log lines write it ("2025-06-01T12:00:00.123Z"), for comparing with theirs."""
    return at.astimezone(UTC).isoformat(timespec="milliseconds")[:-6] + "Z"


def parse(text: str) -> dict[str, Any] | None:
    """A platform log line as a dict; None for a line that is not a JSON object with a time."""
    text = text.strip()
    if not text.startswith("{"):
        return None
    try:
        line = json.loads(text)
    except ValueError:
        return None
    if not isinstance(line, dict) or not isinstance(line.get("timestamp"), str):
        return None
    return line


def keep(line: dict[str, Any], sel: Selector, *, own: bool) -> bool:
    """Whether the tenant sees `line`: from a worker's own log (`own`) or a shared one."""
    if sel.since is not None and (line.get("timestamp") or "") < sel.since:
        return False
    if sel.job_id is not None:
        return line.get("job_id") == sel.job_id
    if own:
        return True
    if sel.worker_id is not None and line.get("worker_id") == sel.worker_id:
        return True
    return sel.deployment_id is not None and line.get("deployment_id") == sel.deployment_id


def select(
    texts: Iterable[str], sel: Selector, *, own: bool, worker_id: str | None = None
) -> Iterable[dict[str, Any]]:
    """The lines of one source the tenant sees, parsed, in order. Text lines of a worker's
    own log come as raw lines (module docstring) for its worker or deployment, never for a
    job (they carry no id). `worker_id` names the worker of an own log."""
    last_time: str | None = None
    for text in texts:
        # most lines of a shared log are another's: skipped without parsing them
        if sel.job_id is not None:
            if sel.job_id not in text:
                continue
        elif not own and not any(i in text for i in (sel.deployment_id, sel.worker_id) if i):
            continue
        line = parse(text)
        if line is None:
            if not own or sel.job_id is not None or not text.strip():
                continue
            line = {"timestamp": last_time, "message": text.rstrip(), "raw": True}
            if worker_id is not None:
                line["worker_id"] = worker_id
            if last_time is None and sel.since is not None:
                continue  # before the first timed line: its time is unknown
        else:
            last_time = line["timestamp"]
        if keep(line, sel, own=own):
            yield line


def tail(
    sources: Iterable[Iterable[dict[str, Any]]], limit: int
) -> tuple[list[dict[str, Any]], bool]:
    """The last `limit` lines of several sources, each in time order, merged by time (a raw
    line keeps its place after the line before it), and whether older lines were left out.
    Holds at most `limit` lines per source, whatever the logs' size."""
    lasts: list[deque[dict[str, Any]]] = []
    total = 0
    for source in sources:
        last: deque[dict[str, Any]] = deque(maxlen=limit)
        for line in source:
            last.append(line)
            total += 1
        lasts.append(last)
    merged = list(heapq.merge(*lasts, key=lambda line: line.get("timestamp") or ""))
    return merged[-limit:] if limit else [], total > limit


def key(line: dict[str, Any]) -> str:
    """A line's identity, to send a line once when two reads overlap (a tail, then a follow)."""
    return json.dumps(line, sort_keys=True)


__all__ = [
    "DEFAULT_LIMIT",
    "MAX_LIMIT",
    "Selector",
    "iso",
    "keep",
    "key",
    "parse",
    "parse_since",
    "select",
    "tail",
]
