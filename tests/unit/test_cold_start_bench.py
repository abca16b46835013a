"""The cold-start bench's pure parts (bench/coldstart/): the phase breakdown from billing
records and timestamps (a booted worker's and a warm-pool worker's), the worker log line, the
SSE parser, the scenarios' platform settings, the table, the targets and the summary line,
and the lm_head rewrite that makes a random checkpoint's first token visible. No timings."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bench.coldstart import models, phases, report, scenarios, sse, worker_log
from bench.coldstart.driver import Uploaded
from bench.coldstart.report import Round
from bench.coldstart.scenarios import SCENARIOS, Scenario

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
# A warm-pool worker assigned at 0.9: the tenant's records start with `load`, no `boot`.
POOLED = [
    record("load", 0.9, 3.4),
    record("warm", 3.4, 3.7),
    record("idle", 3.7, 3.75),
    record("busy", 3.75, 4.5),
]


def assert_phases(got: dict[str, float], want: dict[str, float]) -> None:
    assert got.keys() == {*phases.PHASES, "total"}
    for name, seconds in want.items():
        assert got[name] == pytest.approx(seconds, abs=1e-5), name
    assert sum(got[p] for p in phases.PHASES) == pytest.approx(got["total"])


def test_phases_follow_the_records_and_add_up_to_the_total() -> None:
    got = phases.phases(phases.timeline(T0, JOB, RECORDS, T0 + 6.7))
    want = {"accept": 0.2, "queue": 0.3, "boot": 2.0, "load": 3.5, "warm": 0.4, "token": 0.3}
    assert_phases(got, want | {"total": 6.7})


def test_a_pool_worker_queues_until_its_assignment_and_shows_no_boot() -> None:
    got = phases.phases(phases.timeline(T0, JOB, POOLED, T0 + 4.0))
    want = {"accept": 0.2, "queue": 0.7, "boot": 0.0, "load": 2.5, "warm": 0.3, "token": 0.3}
    assert_phases(got, want | {"total": 4.0})
    # the platform's `pool` record (an operator's view lists it too) changes nothing
    seen_by_operator = [record("pool", -20.0, 0.9), *POOLED]
    assert phases.timeline(T0, JOB, seen_by_operator, T0 + 4.0) == phases.timeline(
        T0, JOB, POOLED, T0 + 4.0
    )


def test_records_in_any_order_and_later_segments_of_a_phase_are_ignored() -> None:
    shuffled = [*reversed(RECORDS), record("boot", 30.0, 31.0)]  # e.g. a second life
    got = phases.timeline(T0, JOB, shuffled, T0 + 6.7)
    assert got == phases.timeline(T0, JOB, RECORDS, T0 + 6.7)


def test_a_worker_up_before_the_request_shows_no_boot() -> None:
    # booted, loaded and warm before the job was created
    early = [record("boot", -9.0, -8.0), record("load", -8.0, -5.0), record("warm", -5.0, -4.8)]
    got = phases.phases(phases.timeline(T0, JOB, early, T0 + 0.5))
    assert got["queue"] == got["boot"] == got["load"] == got["warm"] == 0.0
    assert got["token"] == pytest.approx(0.3, abs=1e-5)
    assert got["total"] == pytest.approx(0.5)


def test_a_worker_that_jobs_waited_for_has_no_warm_up() -> None:
    skipped = [record("load", 0.9, 3.4), record("idle", 3.4, 3.45), record("busy", 3.45, 4.5)]
    got = phases.phases(phases.timeline(T0, JOB, skipped, T0 + 4.0))
    want = {"accept": 0.2, "queue": 0.7, "boot": 0.0, "load": 2.5, "warm": 0.0, "token": 0.6}
    assert_phases(got, want | {"total": 4.0})


@pytest.mark.parametrize("records", [RECORDS[:1], []])
def test_a_missing_load_record_is_named(records: list[dict[str, Any]]) -> None:
    with pytest.raises(ValueError, match="no load billing record"):
        phases.timeline(T0, JOB, records, T0 + 7)


LOG = """\
2026-11-23 06:47:39,701 INFO worker wrk_1 httpx: HTTP Request: POST http://x/state "200 OK"
2026-11-23 06:47:42,981 INFO worker wrk_1 worker.runtime.loading: loaded 63 tensors \
(1164005376 bytes, 1 objects) in 3.23s (files 0.16s, weights 3.06s at 0.38 GB/s [header 0.18s, \
fetch 2.88s, copy 0.00s], 0 retries, {hits}; build 0.01s)
"""


def test_load_log_line_parsed_with_its_tier() -> None:
    got = worker_log.parse_load_log(LOG.format(hits="0 cache hits {}"))
    assert got == worker_log.LoadLog(
        tensors=63, bytes_total=1164005376, objects=1, seconds=3.23, files_s=0.16,
        weights_s=3.06, gbps=0.38, header_s=0.18, fetch_s=2.88, build_s=0.01, cache_hits=0,
    )  # fmt: skip
    assert got.tier == "object storage"


@pytest.mark.parametrize(
    ("hits", "tier", "source"),
    [
        ("1 cache hits {'disk': 1}", "disk cache", "disk"),
        ("1 cache hits {'host': 1}", "host memory", "host"),
        ("1 cache hits", "disk cache", "disk"),  # the line before the host tier: the disk's
        ("0 cache hits", "object storage", "origin"),
        ("0 cache hits {}", "object storage", "origin"),
    ],
)
def test_tier_from_the_hits(hits: str, tier: str, source: str) -> None:
    got = worker_log.parse_load_log(LOG.format(hits=hits))
    assert got is not None and (got.tier, got.source) == (tier, source)


def test_load_log_tolerates_a_shorter_line_and_no_line() -> None:
    line = "x loaded 3 tensors (10 bytes, 2 objects) in 0.50s (1 cache hits {'host': 1})"
    got = worker_log.parse_load_log(line)
    assert got is not None
    assert (got.seconds, got.fetch_s, got.cache_hits) == (0.5, None, 1)
    assert got.tier == "host memory+object storage"  # one object of two from a tier
    assert got.source == "origin"
    assert worker_log.parse_load_log("no such line\n") is None


def test_sse_events() -> None:
    lines = [
        "event: queued", 'data: {"job_id": "j"}', "",
        ": keep-alive", "",
        "event: output", 'data: {"delta": ""}', "",
        "data: a", "data: b", "",
        "event: completed", "data: {}",
    ]  # fmt: skip
    assert list(sse.sse_events(lines)) == [
        ("queued", '{"job_id": "j"}'),
        ("output", '{"delta": ""}'),
        ("message", "a\nb"),
        ("completed", "{}"),
    ]


def by_key(key: str) -> Scenario:
    return next(s for s in SCENARIOS if s.key == key)


def test_scenarios_without_a_pool_turn_it_off_and_each_platform_runs_one_group() -> None:
    for s in SCENARIOS:
        assert s.platform_env == {"PLATFORM_WARM_POOL_MAX": "1" if s.pool else "0"}
    groups = scenarios.by_platform(list(SCENARIOS))
    assert [[s.key for s in g] for g in groups] == [
        ["no_pool", "no_pool_disk", "no_pool_host"],
        ["warm_pool", "host_tier"],
    ]
    for group in groups:
        # a tier hit reads what an earlier round of the same platform filled
        assert group[0].needs_tier is None and set(group[0].empty) == {"host", "disk"}
    for s in SCENARIOS:
        assert s.needs_tier not in s.empty
    assert by_key("warm_pool").target and by_key("host_tier").target
    assert by_key("no_pool").target is None


def test_targets_are_the_issues_bounds() -> None:
    warm, host = by_key("warm_pool").target, by_key("host_tier").target
    assert warm is not None and host is not None
    assert warm.bound_s(2.0) == pytest.approx(2.5)  # <= weight_stream_s + 0.5 s
    assert host.bound_s(2.0) == pytest.approx(1.0)  # <= 0.5 x weight_stream_s


def test_tier_settings_turn_on_exactly_the_tiers_asked_for(tmp_path: Path) -> None:
    dirs = {"host": tmp_path / "shm", "disk": tmp_path / "disk"}
    env = scenarios.tier_env(dirs)
    assert env["PLATFORM_LOADER_CACHE_DIR"] == str(dirs["disk"])
    assert env["PLATFORM_LOADER_HOST_CACHE_DIR"] == str(dirs["host"])
    assert int(env["PLATFORM_LOADER_HOST_CACHE_BYTES"]) > 0
    # `platform up` turns a host tier on by default: off means saying so
    assert scenarios.tier_env({}) == {"PLATFORM_LOADER_HOST_CACHE_BYTES": "0"}
    assert "PLATFORM_LOADER_HOST_CACHE_DIR" not in scenarios.tier_env({"disk": dirs["disk"]})


def test_uploaded_weights_are_found_by_their_key() -> None:
    up = Uploaded("store://bench/x/big/", "tenants/ten_1/bench/x/big/model.safetensors")
    assert up.weights_uri == "s3://platform-store/tenants/ten_1/bench/x/big/model.safetensors"
    assert up.among(["s3://other-bucket/tenants/ten_1/bench/x/big/model.safetensors"])
    assert not up.among(["s3://platform-store/tenants/ten_1/bench/x/demo/model.safetensors"])
    assert not up.among([])


def make_round(scenario: str, model: str, total: float, **kw: Any) -> Round:
    spread = dict.fromkeys(phases.PHASES, total / len(phases.PHASES)) | {"total": total}
    if kw.pop("pooled", False):  # a pool worker: no boot
        spread["boot"] = 0.0
    return Round(scenario, model, spread, "object storage", None, "output", None, **kw)


# The big model: (a) 8.0, (b) 3.0 (pool), (c) 1.2 (pool, host hit); weight_stream_s 2.0.
ROUNDS = [
    *(make_round("no_pool", "big", t, placement="boot") for t in (9.0, 7.0, 8.0)),
    make_round("no_pool_disk", "big", 5.0, placement="boot"),
    *(make_round("warm_pool", "big", t, placement="pool", pooled=True) for t in (3.0, 2.0, 4.0)),
    make_round("host_tier", "big", 1.2, placement="pool_host_tier", pooled=True),
    make_round("no_pool", "demo", 3.0, placement="boot"),
]
STREAMS = [2.5, 1.5, 2.0]


def test_summary_line_shape() -> None:
    out = report.summarize(SCENARIOS, ROUNDS, STREAMS, "big", {"rounds": 3})
    assert list(out)[:5] == ["bench", *report.REQUIRED_KEYS]
    assert out["bench"] == "cold_start" and out["model"] == "big"
    assert out["first_token_s"] == 8.0
    assert out["first_token_s_warm_pool"] == 3.0
    assert out["first_token_s_host_tier"] == 1.2
    assert out["weight_stream_s"] == 2.0
    assert out["first_token_s_disk_tier"] == 5.0
    assert out["first_token_s_host_tier_no_pool"] is None  # not run
    assert out["phases_s"]["boot"] == pytest.approx(8.0 / len(phases.PHASES), abs=1e-3)
    assert out["phases_s_warm_pool"]["boot"] == out["phases_s_host_tier"]["boot"] == 0.0
    assert out["placement"] == {
        "first_token_s": "boot",
        "first_token_s_disk_tier": "boot",
        "first_token_s_warm_pool": "pool",
        "first_token_s_host_tier": "pool_host_tier",
    }
    assert out["targets"] == {
        "first_token_s_warm_pool": {"bound_s": 2.5, "met": False},
        "first_token_s_host_tier": {"bound_s": 1.0, "met": False},
        "pool_saves_s": 5.0,
        "boot_s": round(8.0 / len(phases.PHASES), 3),
    }
    assert out["demo"]["first_token_s"] == 3.0 and out["demo"]["first_token_s_warm_pool"] is None
    assert out["rounds"] == 3
    json.dumps(out)  # one JSON line


def test_summary_line_with_nothing_but_a_no_pool_round() -> None:
    out = report.summarize(SCENARIOS, [make_round("no_pool", "demo", 3.0)], [], "demo", {})
    assert list(out)[:5] == ["bench", *report.REQUIRED_KEYS]
    assert out["first_token_s"] == 3.0
    assert out["first_token_s_warm_pool"] is out["weight_stream_s"] is None
    assert out["targets"]["first_token_s_warm_pool"] == {"bound_s": None, "met": None}
    assert out["targets"]["pool_saves_s"] is None


def test_table_rows_targets_and_placements() -> None:
    na = {"no_pool_host": "n/a (host tier off)"}
    lines = report.table(SCENARIOS, ["big", "demo"], ROUNDS, na, weight_stream_s=2.0)
    assert len(lines) == 2 + 2 * len(SCENARIOS)
    assert {line.count("|") for line in lines} == {13}
    big = {s.key: lines[2 + i] for i, s in enumerate(SCENARIOS)}
    assert big["no_pool"].startswith("| (a) no pool | big | 8.00 |  | ")
    assert big["no_pool"].endswith("| boot |")
    assert "| n/a (host tier off) |" in big["no_pool_host"]
    assert "| 3.00 | ≤ 2.50 missed | " in big["warm_pool"]
    assert big["warm_pool"].endswith("| pool |")
    assert "| 1.20 | ≤ 1.00 missed | " in big["host_tier"]
    demo = lines[2 + len(SCENARIOS) :]
    assert all("≤" not in line for line in demo), "the bounds are the big model's"
    assert "n/a (not run)" in demo[3]


def test_a_target_met() -> None:
    fast = [make_round("warm_pool", "big", 2.2, placement="pool", pooled=True)]
    (v,) = [x for x in report.verdicts(SCENARIOS, fast, 2.0, "big").values() if x.first_token_s]
    assert v.met is True and v.cell() == "≤ 2.50 met"
    assert report.verdicts(SCENARIOS, fast, None, "big")["warm_pool"].cell() == "-"


def test_target_lines() -> None:
    lines = report.target_lines(SCENARIOS, ROUNDS, 2.0, "big")
    assert lines[0] == "targets (big model, weight_stream_s 2.00 s):"
    assert lines[1] == (
        "- (b) warm pool, object storage: first token 3.00 s, target ≤ weight_stream_s + 0.5 s "
        "= 2.50 s: missed by 0.50 s"
    )
    assert lines[2].endswith("target ≤ 0.5 × weight_stream_s = 1.00 s: missed by 0.20 s")
    assert lines[3] == "- (a) − (b) = 5.00 s: the boot the pool removes ((a)'s boot phase: 1.33 s)"
    met = report.target_lines(SCENARIOS, [make_round("host_tier", "big", 0.7)], 2.0, "big")
    assert met[1].endswith(": not measured")  # (b) not run
    assert met[2].endswith("= 1.00 s: met (0.30 s to spare)")
    assert met[3].startswith("- (a) − (b) = - s")


def test_load_table_splits_load_by_the_log() -> None:
    log = worker_log.parse_load_log(LOG.format(hits="1 cache hits {'host': 1}"))
    spread = dict.fromkeys(phases.PHASES, 0.5) | {"load": 3.5, "total": 6.0}
    r = Round("host_tier", "big", spread, "host memory", log, "output", None)
    lines = report.load_table([by_key("host_tier")], ["big"], [r], 2.27)
    # engine: the load record beyond the logged load (3.5 - 3.23)
    assert lines[2] == (
        "| big | (c) warm pool, host-memory hit | 3.50 | 0.16 | 0.18 | 2.88 | 0.38 | 0.01 "
        "| 0.27 | 2.27 |"
    )


def test_head_rewrite_makes_greedy_pick_one_of_two_tokens(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    from safetensors.torch import load_file, save_file

    row = torch.randn(8, generator=torch.Generator().manual_seed(0))
    head = row.repeat(16, 1).bfloat16()  # every row the same, as bench/loader.py writes them
    path = tmp_path / "model.safetensors"
    save_file({"lm_head.weight": head, "other": torch.ones(3)}, str(path))
    models.make_head_visible(path, [5, 9])
    got = load_file(str(path))
    assert torch.equal(got["other"], torch.ones(3))
    assert torch.equal(got["lm_head.weight"][5], head[0])
    assert torch.equal(got["lm_head.weight"][9], -head[0])
    rest = [i for i in range(16) if i not in (5, 9)]
    assert not got["lm_head.weight"][rest].any()
    for _ in range(5):  # whatever the hidden state, the argmax is one of the two
        h = torch.randn(8).bfloat16()
        assert int((got["lm_head.weight"].float() @ h.float()).argmax()) in (5, 9)
