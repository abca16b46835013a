"""Exit codes: 1 for the user's mistakes (4xx, a bad URL, a bad flag), 2 for the platform's
(5xx, unreachable)."""

from __future__ import annotations

import socket

import httpx
from typer.testing import CliRunner

from sdk.cli._common import CliState
from sdk.cli.main import app
from tests.unit.cli.mock_api import Routes, invoke, not_found


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port  # closed again: connecting is refused


def test_connection_refused_exits_2() -> None:
    # no outage budget: it is timed on the real clock, which the no-op sleep does not move
    options = {"sleep": lambda _s: None, "max_unavailable_s": 0}
    state = CliState(url=f"http://127.0.0.1:{closed_port()}", client_options=options)
    result = CliRunner().invoke(app, ["deployments", "list"], obj=state)
    assert result.exit_code == 2
    assert "cannot reach the platform" in result.stderr


def test_4xx_exits_1_and_5xx_exits_2() -> None:
    routes = Routes({"GET /v1/deployments/nope": not_found("deployment 'nope' does not exist")})
    result = invoke(["deployments", "get", "nope"], routes)
    assert result.exit_code == 1
    assert "404 Not Found: deployment 'nope' does not exist" in result.stderr

    broken = httpx.Response(500, json={"title": "Internal Server Error", "status": 500})
    result = invoke(["deployments", "list"], Routes({"GET /v1/deployments": broken}))
    assert result.exit_code == 2


def test_a_bad_url_exits_1() -> None:
    result = CliRunner().invoke(app, ["--url", "localhost:8000", "status"])
    assert result.exit_code == 1
    assert "invalid platform URL" in result.stderr


def test_usage_errors_exit_1() -> None:
    result = invoke(["deployments", "list", "--no-such-flag"])
    assert result.exit_code == 1
    assert "No such option" in result.output
