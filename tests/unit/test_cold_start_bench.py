"""The cold-start bench's pure parts (bench/cold_start.py): the phase breakdown from billing
records and timestamps, the worker log line, the SSE parser, the summary line and the
lm_head rewrite that makes a random checkpoint's first token visible."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bench import cold_start as cs

T0 = 1_800_000_000.0  # a unix time; the ISO strings below are T0 + offsets


def iso(offset_s: float) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(T0 + offset_s, UTC).isoformat().replace("+00:00", "Z")


def record(phase: str, start: float, end: float) -> dict[str, Any]:
    return {"phase": phase, "start": iso(start), "end": iso(end), "seconds": f"{end - start:.3f}"}


JOB = {"created_at": iso(0.2)}
RECORDS = [
    record("boot", 0.5, 2.5),
    record("load", 2.5, 6.0),
    record("warm", 6.0, 6.4),
    record("idle", 6.4, 6.45),
    record("busy", 6.45, 7.5),
]


def test_phases_follow_the_records_and_add_up_to_the_total() -> None:
    t = cs.timeline(T0, JOB, RECORDS, T0 + 6.7)
    got = cs.phases(t)
    want = {"accept": 0.2, "queue": 0.3, "boot": 2.0, "load": 3.5, "warm": 0.4, "token": 0.3}
    assert got.keys() == {*cs.PHASES, "total"}
    for name, seconds in want.items():
        assert got[name] == pytest.approx(seconds, abs=1e-5), name
    assert got["total"] == pytest.approx(6.7, abs=1e-5)
    assert sum(got[p] for p in cs.PHASES) == pytest.approx(got["total"])


def test_records_in_any_order_and_later_segments_of_a_phase_are_ignored() -> None:
    shuffled = [*reversed(RECORDS), record("boot", 30.0, 31.0)]  # e.g. a second life
    assert cs.timeline(T0, JOB, shuffled, T0 + 6.7) == cs.timeline(T0, JOB, RECORDS, T0 + 6.7)


def test_a_worker_up_before_the_request_shows_no_boot() -> None:
    # A pool worker: booted, loaded and warm before the job was created.
    early = [record("boot", -9.0, -8.0), record("load", -8.0, -5.0), record("warm", -5.0, -4.8)]
    got = cs.phases(cs.timeline(T0, JOB, early, T0 + 0.5))
    assert got["queue"] == got["boot"] == got["load"] == got["warm"] == 0.0
    assert got["token"] == pytest.approx(0.3, abs=1e-5)
    assert got["total"] == pytest.approx(0.5)


def test_missing_records_are_named() -> None:
    with pytest.raises(ValueError, match="load, warm"):
        cs.timeline(T0, JOB, RECORDS[:1], T0 + 7)


LOG = """\
2026-11-23 06:47:39,701 INFO worker wrk_1 httpx: HTTP Request: POST http://x/state "200 OK"
2026-11-23 06:47:42,981 INFO worker wrk_1 worker.runtime.loading: loaded 63 tensors \
(1164005376 bytes, 1 objects) in 3.23s (files 0.16s, weights 3.06s at 0.38 GB/s [header 0.18s, \
fetch 2.88s, copy 0.00s], 0 retries, {hits}; build 0.01s)
"""


def test_load_log_line_parsed_with_its_tier() -> None:
    got = cs.parse_load_log(LOG.format(hits="0 cache hits {}"))
    assert got == cs.LoadLog(
        tensors=63, bytes_total=1164005376, objects=1, seconds=3.23, files_s=0.16,
        weights_s=3.06, gbps=0.38, header_s=0.18, fetch_s=2.88, build_s=0.01, cache_hits=0,
    )  # fmt: skip
    assert got.tier == "object storage"


@pytest.mark.parametrize(
    ("hits", "tier"),
    [
        ("1 cache hits {'disk': 1}", "disk cache"),
        ("1 cache hits {'host': 1}", "host memory"),
        ("1 cache hits", "disk cache"),  # the line before the host tier: hits were the disk's
        ("0 cache hits", "object storage"),
    ],
)
def test_tier_from_the_hits(hits: str, tier: str) -> None:
    got = cs.parse_load_log(LOG.format(hits=hits))
    assert got is not None and got.tier == tier


def test_load_log_tolerates_a_shorter_line_and_no_line() -> None:
    line = "x loaded 3 tensors (10 bytes, 2 objects) in 0.50s (1 cache hits {'host': 1})"
    got = cs.parse_load_log(line)
    assert got is not None
    assert (got.seconds, got.fetch_s, got.cache_hits) == (0.5, None, 1)
    assert got.tier == "host memory+object storage"  # one object of two from a tier
    assert cs.parse_load_log("no such line\n") is None


def test_sse_events() -> None:
    lines = [
        "event: queued", 'data: {"job_id": "j"}', "",
        ": keep-alive", "",
        "event: output", 'data: {"delta": ""}', "",
        "data: a", "data: b", "",
        "event: completed", "data: {}",
    ]  # fmt: skip
    assert list(cs.sse_events(lines)) == [
        ("queued", '{"job_id": "j"}'),
        ("output", '{"delta": ""}'),
        ("message", "a\nb"),
        ("completed", "{}"),
    ]


def make_round(scenario: str, model: str, total: float, **kw: Any) -> cs.Round:
    phases = dict.fromkeys(cs.PHASES, total / len(cs.PHASES)) | {"total": total}
    return cs.Round(scenario, model, phases, "object storage", None, "output", None, **kw)


def test_summary_line_shape_with_unbuilt_scenarios_null() -> None:
    rounds = [make_round("no_pool", "big", t) for t in (9.0, 7.0, 8.0)]
    rounds += [make_round("no_pool_disk", "big", 5.0), make_round("no_pool", "demo", 3.0)]
    out = cs.summarize(cs.SCENARIOS, rounds, [1.5, 1.2, 1.3], "big", {"rounds": 3})
    assert list(out)[:5] == ["bench", *cs.REQUIRED_KEYS]
    assert out["bench"] == "cold_start"
    assert out["first_token_s"] == 8.0
    assert out["first_token_s_warm_pool"] is None and out["first_token_s_host_tier"] is None
    assert out["weight_stream_s"] == 1.3
    assert out["first_token_s_disk_tier"] == 5.0
    assert out["phases_s"]["boot"] == pytest.approx(8.0 / len(cs.PHASES), abs=1e-3)
    assert out["demo"] == {
        "first_token_s": 3.0,
        "first_token_s_disk_tier": None,
        "first_token_s_host_tier_no_pool": None,
    }
    assert out["rounds"] == 3
    json.dumps(out)  # one JSON line


def test_table_rows_for_every_scenario_and_model() -> None:
    rounds = [make_round("no_pool", "big", 8.0)]
    na = {"warm_pool": "n/a (not built)", "host_tier": "n/a (not built)"}
    lines = cs.table(cs.SCENARIOS, ["big"], rounds, na)
    assert len(lines) == 2 + len(cs.SCENARIOS)
    assert lines[2].startswith("| (a) no pool | big | 8.00 |")
    assert "n/a (not run)" in lines[3] and "n/a (not run)" in lines[4]  # disk, host: not run
    assert "n/a (not built)" in lines[5] and "n/a (not built)" in lines[6]
    assert {line.count("|") for line in lines} == {11}


def test_head_rewrite_makes_greedy_pick_one_of_two_tokens(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    from safetensors.torch import load_file, save_file

    row = torch.randn(8, generator=torch.Generator().manual_seed(0))
    head = row.repeat(16, 1).bfloat16()  # every row the same, as bench/loader.py writes them
    path = tmp_path / "model.safetensors"
    save_file({"lm_head.weight": head, "other": torch.ones(3)}, str(path))
    cs.make_head_visible(path, [5, 9])
    got = load_file(str(path))
    assert torch.equal(got["other"], torch.ones(3))
    assert torch.equal(got["lm_head.weight"][5], head[0])
    assert torch.equal(got["lm_head.weight"][9], -head[0])
    rest = [i for i in range(16) if i not in (5, 9)]
    assert not got["lm_head.weight"][rest].any()
    for _ in range(5):  # whatever the hidden state, the argmax is one of the two
        h = torch.randn(8).bfloat16()
        assert int((got["lm_head.weight"].float() @ h.float()).argmax()) in (5, 9)


def test_tier_settings_and_emptying(tmp_path: Path) -> None:
    dirs = {"host": tmp_path / "shm", "disk": tmp_path / "disk"}
    env = cs.tier_env(dirs)
    assert env["PLATFORM_LOADER_CACHE_DIR"] == str(dirs["disk"])
    assert env["PLATFORM_LOADER_HOST_CACHE_DIR"] == str(dirs["host"])
    assert int(env["PLATFORM_LOADER_HOST_CACHE_BYTES"]) > 0
    assert cs.tier_env({}) == {}
    for d in dirs.values():
        d.mkdir()
        (d / "entry.safetensors").write_bytes(b"x")

    class FakePlatform:
        cache_dirs = dirs

    cs.emptied("host")(FakePlatform())  # type: ignore[arg-type]
    assert not dirs["host"].exists() and dirs["disk"].exists()
