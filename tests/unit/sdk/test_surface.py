"""The async client used natively (`async with`, `async for`, awaits, no Blocking view), and the
names `sdk` exports."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

import sdk
from sdk import APIConnectionError, AsyncClient, ModelError
from tests.unit.sdk.mock_platform import BASE, KEY, FakeTime, Server, answer, job, sse

AB = job(output={"text": "ab", "finish_reason": "stop"})  # the deltas add up to its output


def test_async_client_natively(fake_time: FakeTime) -> None:
    """`async with`, `async for` and awaits, without the Blocking view the other tests use."""
    failed = job(status="failed", error={"type": "invalid_input", "message": "prompt too long"})
    server = Server(
        sse(("output", {"delta": "a"}), ("output", {"delta": "b"}), ("completed", AB)),
        answer(202, job(status="queued")),
        answer(200, failed),
    )

    async def fake_sleep(seconds: float) -> None:
        fake_time.sleep(seconds)

    async def main() -> list[str]:
        transport = httpx.MockTransport(server)
        async with AsyncClient(BASE, KEY, transport=transport, sleep=fake_sleep) as client:
            async with await client.run("demo", "Hi", stream=True) as stream:
                deltas = [delta async for delta in stream]
            assert stream.job is not None and stream.job.status == "succeeded"
            submitted = await client.submit("demo", "Hi")
            with pytest.raises(ModelError) as caught:
                await submitted.wait()
            assert caught.value.job_id == "job_1"
            return deltas

    assert asyncio.run(main()) == ["a", "b"]


def test_connection_error_is_a_deprecated_alias_that_never_shadows_the_builtin() -> None:
    with pytest.warns(DeprecationWarning, match="APIConnectionError"):
        alias = sdk.ConnectionError
    assert alias is APIConnectionError
    assert not issubclass(APIConnectionError, ConnectionError)
    names: dict[str, Any] = {}
    exec("from sdk import *", names)
    assert "ConnectionError" not in names and names["APIConnectionError"] is APIConnectionError
    with pytest.raises(AttributeError):
        _ = sdk.NoSuchName  # type: ignore[attr-defined]
