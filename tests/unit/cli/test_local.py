"""The commands that act on this machine: login (a private config file), up and down (exec the
embedded platform)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from sdk.cli import local
from tests.unit.cli.mock_api import invoke


def test_login_writes_a_private_config_file(tmp_path: Path) -> None:
    result = invoke(["login", "--url", "http://example.test:8000/", "--api-key", "sk_live_1"])
    assert result.exit_code == 0, result.output
    config = tmp_path / "config.json"
    assert json.loads(config.read_text()) == {
        "url": "http://example.test:8000",
        "api_key": "sk_live_1",
    }
    assert config.stat().st_mode & 0o777 == 0o600
    assert "sk_live_1" not in result.output
    assert invoke(["login", "--url", "example.test", "--api-key", "k"]).exit_code == 1


def test_up_execs_the_embedded_platform(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    calls: list[list[str]] = []
    monkeypatch.setattr(local.importlib.util, "find_spec", lambda name: object())
    monkeypatch.setattr(os, "execv", lambda path, argv: calls.append([path, *argv]))
    result = invoke(["up", "--port", "9000", "--state-dir", str(tmp_path), "--detach"])
    assert result.exit_code == 0, result.output
    embedded = [sys.executable, "-m", "control_plane.embedded"]
    up_args = ["up", "--port", "9000", "--state-dir", str(tmp_path), "--detach"]
    assert calls == [[sys.executable, *embedded, *up_args]]

    monkeypatch.setenv("PLATFORM_STATE_DIR", str(tmp_path / "state"))
    invoke(["down"])
    assert calls[-1][-3:] == ["down", "--state-dir", str(tmp_path / "state")]


def test_up_without_the_server_extra_exits_1(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(local.importlib.util, "find_spec", lambda name: None)
    monkeypatch.setattr(os, "execv", lambda *a: pytest.fail("must not exec"))
    result = invoke(["up"])
    assert result.exit_code == 1
    assert "pip install 'platform-serverless[server,worker]'" in result.stderr
