"""What a new user meets first: an empty id, an unreachable platform, a batch's many bad
lines, sizes and money, a table on an 80-column terminal, `up` run twice."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from control_plane.embedded.lifecycle import failure_text
from sdk.cli import _common, local
from sdk.cli._common import CliState
from sdk.cli._format import bytes_progress, human_bytes, money, problem_lines, short_time
from sdk.cli.main import app
from tests.unit.cli.mock_api import Routes, invoke


@pytest.mark.parametrize(
    "args",
    [
        ["jobs", "get", ""],
        ["jobs", "cancel", " "],
        ["jobs", "watch", ""],
        ["deployments", "get", ""],
        ["deployments", "delete", ""],
        ["batch", "status", ""],
        ["batch", "cancel", ""],
        ["keys", "revoke", ""],
        ["run", "", "-i", "prompt=hi"],
    ],
)
def test_an_empty_id_is_one_line_and_exit_1(args: list[str]) -> None:
    routes = Routes({})
    result = invoke(args, routes)
    assert result.exit_code == 1
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "must not be empty" in result.stderr and "Traceback" not in result.stderr
    assert routes.requests == []  # refused before anything is sent


def test_a_bug_keeps_its_traceback(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*_args: object, **_kw: object) -> None:
        raise ValueError("not the user's")

    monkeypatch.setattr(_common, "print_fields", broken)
    job = {"id": "job_1", "deployment": "demo", "status": "queued"}
    result = invoke(
        ["jobs", "get", "job_1"], Routes({"GET /v1/jobs/job_1": httpx.Response(200, json=job)})
    )
    assert isinstance(result.exception, ValueError)


def test_every_batch_error_keeps_its_line_number() -> None:
    errors = [
        {"line": 2, "field": "prompt", "message": "Field required"},
        {"line": 5, "field": "input.jsonl", "message": "not valid JSON"},
        {"line": 9, "field": "max_tokens", "message": "must be >= 1"},
    ]
    detail = "3 invalid input field(s); first: line 2: prompt: Field required"
    lines = problem_lines(422, "Invalid Request", detail, errors)
    assert lines == [
        "422 Invalid Request: 3 invalid input field(s)",
        "  line 2: prompt: Field required",
        "  line 5: input.jsonl: not valid JSON",
        "  line 9: max_tokens: must be >= 1",
    ]


def test_a_422_says_each_problem_once() -> None:
    problem = {
        "title": "Invalid Request",
        "status": 422,
        "detail": "name: Field required; max_workers: must be >= 1",
        "errors": [
            {"field": "name", "message": "Field required"},
            {"field": "max_workers", "message": "must be >= 1"},
        ],
    }
    routes = Routes({"GET /v1/deployments/demo": httpx.Response(422, json=problem)})
    result = invoke(["deployments", "get", "demo"], routes)
    assert result.exit_code == 1
    assert result.stderr.count("Field required") == 1 and result.stderr.count("must be >= 1") == 1
    # a detail that says more than its fields keeps that
    assert problem_lines(413, "Too Large", "more than 10 lines; the limit is 10", [
        {"field": "input", "message": "at most 10 lines"}
    ])[0] == "413 Too Large: more than 10 lines; the limit is 10"  # fmt: skip


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


def test_an_unreachable_platform_says_so_at_once_and_suggests_platform_up() -> None:
    url = f"http://127.0.0.1:{closed_port()}"
    said: list[str] = []
    # the real transport, wrapped as the CLI wraps it; no outage budget to wait out
    notice = _common.RetryNotice(httpx.HTTPTransport(), url, 8)
    options = {"sleep": lambda _s: said.append("slept"), "max_unavailable_s": 0,
               "transport": notice}  # fmt: skip
    result = CliRunner().invoke(
        app, ["jobs", "get", "job_1"], obj=CliState(url=url, client_options=options)
    )
    assert result.exit_code == 2
    lines = result.stderr.splitlines()
    assert lines[0].startswith(f"cannot reach the platform at {url} (")
    assert lines[0].endswith("); retrying for up to 8 s...")
    assert result.stderr.count("retrying for up to") == 1
    assert "platform up" in result.stderr and "PLATFORM_URL" in result.stderr
    assert url in result.stderr


def test_the_cli_client_wraps_the_default_transport(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "ALL_PROXY",
        "http_proxy",
        "https_proxy",
        "all_proxy",
    ):
        monkeypatch.delenv(name, raising=False)
    _common.set_state(CliState(url="http://127.0.0.1:1"))
    with _common.client() as made:
        assert isinstance(made._http._transport, _common.RetryNotice)
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy:3128")
    with _common.client() as made:  # the proxy variables keep working
        assert not isinstance(made._http._transport, _common.RetryNotice)


def test_sizes_pick_their_unit() -> None:
    assert [human_bytes(n) for n in (0, 999, 1000, 612_345, 12_300_000, 1_160_000_000)] == [
        "0 B", "999 B", "1.00 KB", "612 KB", "12.3 MB", "1.16 GB",
    ]  # fmt: skip
    assert bytes_progress(0, 612_000) == "0/612 KB"
    assert bytes_progress(580_000_000, 1_160_000_000) == "0.58/1.16 GB"
    assert bytes_progress(300, 600) == "300/600 B"


def test_money_carries_its_currency_and_times_read_short() -> None:
    assert money("0.000700000") == "0.000700000 USD" and money(None) == "-"
    assert short_time("2024-05-01T12:00:00.123456+00:00") == "2024-05-01 12:00:00"
    assert short_time("2024-05-01T12:00:00Z") == "2024-05-01 12:00:00"
    assert short_time("wrk_1") == "wrk_1"


def render(
    columns: tuple[str, ...],
    rows: list[tuple[object, ...]],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> list[str]:
    monkeypatch.setenv("COLUMNS", "80")
    monkeypatch.setattr(_common, "is_tty", lambda: True)
    _common.print_table(columns, rows)
    return capsys.readouterr().out.splitlines()


def test_tables_fit_80_columns_and_keep_ids_whole(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    model = "store://models/a/rather/long/prefix/that/goes/on/and/on/"
    lines = render(("name", "model", "accelerator", "workers", "version"),
                   [("demo", model, "cpu", "idle=1 busy=2", 3)], monkeypatch, capsys)  # fmt: skip
    assert all(len(line) <= 80 for line in lines), lines
    assert len(lines) >= 3 and "".join(line[6:43].strip() for line in lines[1:]) == model
    job = "job_01HXYZABCDEFGHJKMNPQRSTVWX"
    lines = render(
        ("id", "deployment", "status", "reason", "attempt", "created"),
        [(job, "demo", "failed", "no_capacity", 1, "2024-05-01T12:00:00.123456+00:00")],
        monkeypatch, capsys,
    )  # fmt: skip
    assert all(len(line) <= 80 for line in lines), lines
    assert any(job in line for line in lines) and any(
        "2024-05-01 12:00:00" in line for line in lines
    )


def test_up_quiets_alembic_unless_told(tmp_path: Path) -> None:
    assert local.quiet_migrations("") == "alembic=WARNING"
    assert local.quiet_migrations("api=DEBUG") == "api=DEBUG,alembic=WARNING"
    assert local.quiet_migrations("alembic.runtime=INFO") == "alembic.runtime=INFO"


def test_up_on_a_running_platform_reprints_where_it_is(tmp_path: Path) -> None:
    state = {"pid": os.getpid(), "url": "http://127.0.0.1:8123", "api_key": "pk_secret"}
    (tmp_path / "platform.json").write_text(json.dumps(state))
    result = CliRunner().invoke(app, ["up", "--state-dir", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert "already runs" in result.stdout and "http://127.0.0.1:8123" in result.stdout
    assert str(tmp_path / "platform.json") in result.stdout and "pk_secret" not in result.stdout
    # a state file left by a platform that died is no running platform
    (tmp_path / "platform.json").write_text(json.dumps({**state, "pid": 2**22 + 1}))
    assert local.running_platform(tmp_path) is None


def test_up_failures_end_with_the_actionable_line() -> None:
    error = RuntimeError("celery exited at start; log /s/celery.log:\nINFO a\nINFO b")
    assert failure_text(error).splitlines()[-1] == (
        "platform up failed: celery exited at start; log /s/celery.log:"
    )
    assert (
        failure_text(RuntimeError("port 8000 is in use"))
        == "platform up failed: port 8000 is in use"
    )
