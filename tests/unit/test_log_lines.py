"""Which log lines a tenant reads (domain/log_lines.py), and local log files as a provider
reads them (providers/logs.py: FileLines, LocalLogs)."""

from __future__ import annotations

import json
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from control_plane.domain.log_lines import (
    Selector,
    iso,
    keep,
    key,
    parse,
    parse_since,
    select,
    tail,
)
from control_plane.providers.logs import FileLines, LocalLogs
from tests.helpers import wait_for

NOW = datetime(2025, 6, 1, 12, 0, 0, tzinfo=UTC)


def line(at: datetime, **fields: Any) -> str:
    return json.dumps({"timestamp": iso(at), "level": "INFO", "message": "m", **fields})


def test_since_is_an_iso_time_or_an_age() -> None:
    assert parse_since("2025-06-01T11:00:00Z", NOW) == NOW - timedelta(hours=1)
    assert parse_since("2025-06-01T13:00:00+02:00", NOW) == NOW - timedelta(hours=1)
    assert parse_since("300", NOW) == NOW - timedelta(seconds=300)
    assert parse_since("1.5", NOW) == NOW - timedelta(seconds=1.5)
    assert parse_since("90s", NOW) == NOW - timedelta(seconds=90)
    assert parse_since("15m", NOW) == NOW - timedelta(minutes=15)
    assert parse_since(" 2h ", NOW) == NOW - timedelta(hours=2)
    assert parse_since("1d", NOW) == NOW - timedelta(days=1)


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("yesterday", "neither an ISO 8601 time"),
        ("-5", "neither an ISO 8601 time"),
        ("5w", "neither an ISO 8601 time"),
        ("2025-06-01T11:00:00", "no time zone"),
        ("400d", "more than a year"),
    ],
)
def test_a_bad_since_is_refused_saying_what_is_accepted(value: str, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        parse_since(value, NOW)


def test_iso_matches_the_log_lines_own_times() -> None:
    assert iso(datetime(2025, 6, 1, 12, 0, 0, 123456, tzinfo=UTC)) == "2025-06-01T12:00:00.123Z"


def test_parse_takes_json_objects_with_a_time_only() -> None:
    assert parse(line(NOW, job_id="job_1"))["job_id"] == "job_1"  # type: ignore[index]
    assert parse("Traceback (most recent call last):") is None
    assert parse('{"no": "time"}') is None
    assert parse('["a", "list"]') is None
    assert parse("{broken") is None


def test_a_job_sees_only_lines_with_its_id_in_shared_and_own_logs() -> None:
    sel = Selector("job_1", None, None, None)
    texts = [
        line(NOW, job_id="job_1", deployment_id="dep_1"),
        line(NOW, job_id="job_2", deployment_id="dep_1"),
        line(NOW, deployment_id="dep_1"),
        "Traceback (most recent call last): job_1",  # no id field: not the job's line
    ]
    for own in (True, False):
        got = list(select(texts, sel, own=own, worker_id="wrk_1"))
        assert [g.get("job_id") for g in got] == ["job_1"]


def test_shared_logs_give_a_deployment_or_worker_only_the_lines_naming_it() -> None:
    texts = [
        line(NOW, deployment_id="dep_1"),
        line(NOW, deployment_id="dep_2", job_id="job_9"),
        line(NOW, worker_id="wrk_1"),
        line(NOW, worker_id="wrk_2"),
        "a text line of some process",
    ]
    by_dep = list(select(texts, Selector(None, "dep_1", None, None), own=False))
    assert [g.get("deployment_id") for g in by_dep] == ["dep_1"]
    by_worker = list(select(texts, Selector(None, None, "wrk_1", None), own=False))
    assert [g.get("worker_id") for g in by_worker] == ["wrk_1"]


def test_a_workers_own_log_is_whole_text_lines_included_with_the_time_before() -> None:
    texts = [
        "starting",  # before any timed line: no time
        line(NOW, message="boot"),
        "Traceback (most recent call last):",
        "",
        line(NOW + timedelta(seconds=1), message="failed"),
    ]
    got = list(select(texts, Selector(None, None, "wrk_1", None), own=True, worker_id="wrk_1"))
    assert [g["message"] for g in got] == [
        "starting",
        "boot",
        "Traceback (most recent call last):",
        "failed",
    ]
    assert got[0] == {"timestamp": None, "message": "starting", "raw": True, "worker_id": "wrk_1"}
    assert got[2]["timestamp"] == iso(NOW) and got[2]["raw"] is True


def test_since_drops_older_lines_and_untimed_text_before_them() -> None:
    texts = ["early text", line(NOW - timedelta(hours=1)), "late text", line(NOW, message="new")]
    sel = Selector(None, None, "wrk_1", iso(NOW - timedelta(minutes=5)))
    got = list(select(texts, sel, own=True))
    assert [g["message"] for g in got] == ["new"]
    assert keep({"timestamp": iso(NOW)}, sel, own=True)
    assert not keep({"timestamp": iso(NOW - timedelta(hours=1))}, sel, own=True)


def test_tail_merges_sources_by_time_and_keeps_the_last_lines() -> None:
    a = [{"timestamp": iso(NOW + timedelta(seconds=s)), "src": "a"} for s in (0, 2, 4)]
    b = [{"timestamp": iso(NOW + timedelta(seconds=s)), "src": "b"} for s in (1, 3)]
    merged, truncated = tail([a, b], 10)
    assert [m["src"] for m in merged] == ["a", "b", "a", "b", "a"] and not truncated
    last, truncated = tail([iter(a), iter(b)], 2)
    assert [m["timestamp"] for m in last] == [iso(NOW + timedelta(seconds=s)) for s in (3, 4)]
    assert truncated


def test_key_identifies_a_line_whatever_its_field_order() -> None:
    assert key({"a": 1, "b": 2}) == key({"b": 2, "a": 1}) != key({"a": 1, "b": 3})


# --- local files (providers/logs.py) ---


def test_file_lines_reads_a_file_and_its_last_line_without_a_newline(tmp_path: Path) -> None:
    path = tmp_path / "w.log"
    path.write_text("one\ntwo\nthree")
    assert list(FileLines(path, follow=False)) == ["one", "two", "three"]
    assert list(FileLines(tmp_path / "missing.log", follow=False)) == []


def test_following_a_file_waits_for_it_and_for_whole_lines_until_closed(tmp_path: Path) -> None:
    path = tmp_path / "later.log"
    stream = FileLines(path, follow=True, poll_s=0.01)
    seen: list[str] = []
    reader = threading.Thread(target=lambda: seen.extend(stream), daemon=True)
    reader.start()
    with path.open("a") as f:  # created after the follow began
        f.write("first\nhalf")
        f.flush()
        wait_for(lambda: seen == ["first"], timeout_s=5)
        f.write(" of a line\n")
        f.flush()
        wait_for(lambda: seen == ["first", "half of a line"], timeout_s=5)
    stream.close()
    reader.join(timeout=5)
    assert not reader.is_alive()


def test_local_logs_read_a_workers_file_and_never_a_path_out_of_the_directory(
    tmp_path: Path,
) -> None:
    (tmp_path / "workers").mkdir()
    (tmp_path / "workers" / "wrk_1.log").write_text("mine\n")
    (tmp_path / "secret.log").write_text("not a worker's\n")
    logs = LocalLogs(tmp_path / "workers")
    assert list(logs.logs("wrk_1", None, follow=False)) == ["mine"]
    assert list(logs.logs("../secret", None, follow=False)) == []
    assert list(logs.logs("wrk_none", None, follow=False)) == []
