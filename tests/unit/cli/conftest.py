"""The CLI's unit tests run with a config of their own: no PLATFORM_* variables, and a config
file under the test's tmp_path (so `platform login` writes there)."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def _isolated_config(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in ("PLATFORM_URL", "PLATFORM_API_KEY", "PLATFORM_STATE_DIR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PLATFORM_CONFIG", str(tmp_path / "config.json"))
