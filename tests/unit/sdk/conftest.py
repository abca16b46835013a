"""Fixtures for the SDK's unit tests: `twin` (each test over `Client` and `AsyncClient`, see
twin.py), `make_client` (the twin against a scripted mock_platform.Server), `fake_time`, and a
config isolated from the developer's own (no PLATFORM_* variables, no config file)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from sdk import Client
from tests.unit.sdk.mock_platform import BASE, KEY, FakeTime, Server
from tests.unit.sdk.twin import MakeClient, Twin, twin

__all__ = ["twin"]  # a fixture, used by name


@pytest.fixture(autouse=True)
def _isolated_config(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("PLATFORM_URL", raising=False)
    monkeypatch.delenv("PLATFORM_API_KEY", raising=False)
    monkeypatch.setenv("PLATFORM_CONFIG", str(tmp_path / "absent.json"))


@pytest.fixture
def fake_time() -> FakeTime:
    return FakeTime()


@pytest.fixture
def make_client(twin: Twin) -> MakeClient:
    """`make_client(server, fake_time, **options)`: the twin against a scripted Server."""

    def make(server: Server, fake_time: FakeTime, **kwargs: Any) -> Client:
        return twin.client(
            BASE,
            KEY,
            transport=httpx.MockTransport(server),
            sleep=fake_time.sleep,
            clock=fake_time.clock,
            rand=lambda: 0.5,
            **kwargs,
        )

    return make
