"""The SDK against the live embedded platform (real processes, a real worker on the demo
model): run plain and streamed, submit + wait, readiness, keys, and batches and usage where
the platform serves them.

Shares the session platform and one deployment, `demo` (min_workers 1: its worker stays
warm for this file, tests/e2e/test_cli_e2e.py and tests/e2e/test_docs.py).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from sdk import AsyncClient, AuthenticationError, Client, NotFoundError
from sdk import _flows as flows
from sdk._base import Call, is_missing_route

pytestmark = pytest.mark.e2e

PROMPT = {"prompt": "The weather", "max_tokens": 8}


def ensure_demo(client: Client, demo_model: Path) -> None:
    """The `demo` deployment of the e2e files that share it, created by whichever runs first."""
    try:
        client.deployments.get("demo")
    except NotFoundError:
        client.deployments.create(
            name="demo", model=str(demo_model), min_workers=1, max_workers=1, scaledown_window_s=600
        )


def skip_unless_served(client: Client, path: str) -> None:
    """Skip when the platform lacks the endpoint (an API older than the SDK)."""
    try:
        client._execute(flows.request_json(client._rt, Call("GET", path)))
    except NotFoundError as e:
        if is_missing_route(e):
            pytest.skip(f"this platform does not serve {path} yet")


@pytest.fixture(scope="module")
def client(platform: dict[str, Any], demo_model: Path) -> Client:
    c = Client(base_url=platform["url"], api_key=platform["api_key"], timeout=120)
    ensure_demo(c, demo_model)
    return c


def test_run_plain_stream_and_submit_wait_agree(client: Client) -> None:
    text = client.run("demo", PROMPT)
    assert isinstance(text, str) and text

    with client.run("demo", PROMPT, stream=True) as stream:
        deltas = list(stream)
    assert stream.job_id and stream.job is not None and stream.job.status == "succeeded"
    assert "".join(deltas) == text, "greedy: the streamed text is the plain run's"

    states: list[str] = []
    job = client.submit("demo", PROMPT)
    job.wait(timeout=120, on_update=lambda j: states.append(j.status))
    assert job.text == text and states[-1] == "succeeded"
    assert job.usage is not None and job.usage["generated_tokens"] >= 1
    assert client.jobs.get(job.id).text == text


def test_async_client_runs_and_streams(client: Client, platform: dict[str, Any]) -> None:
    async def main() -> tuple[str, str]:
        async with AsyncClient(platform["url"], platform["api_key"], timeout=120) as ac:
            plain = await ac.run("demo", PROMPT)
            stream = await ac.run("demo", PROMPT, stream=True)
            streamed = "".join([delta async for delta in stream])
            return plain, streamed

    plain, streamed = asyncio.run(main())
    assert plain == streamed == client.run("demo", PROMPT)


def test_wait_ready_and_keys(client: Client, platform: dict[str, Any]) -> None:
    worker = client.deployments.wait_ready("demo", timeout=120)
    assert worker["state"] in ("idle", "busy")

    key = client.keys.create(name="e2e", scopes=["run", "read"])
    assert key.key is not None
    with Client(platform["url"], key.key) as scoped:
        assert scoped.run("demo", PROMPT)
        client.keys.revoke(key.id)
        with pytest.raises(AuthenticationError):
            scoped.jobs.list(limit=1)


def test_batch_runs_every_line(client: Client, tmp_path: Path) -> None:
    skip_unless_served(client, "/v1/batches")
    source = tmp_path / "in.jsonl"
    source.write_text('{"prompt": "The weather", "max_tokens": 8}\n{"prompt": "Soup"}\n')
    batch = client.batches.create(source, deployment="demo", max_in_flight=2)
    batch.wait(timeout=120)
    assert batch.status == "completed" and batch.counts["succeeded"] == 2
    with batch.results() as results:
        lines = list(results)
    assert [line["index"] for line in lines] == [0, 1]
    assert lines[0]["output"]["text"] == client.run("demo", PROMPT)


def test_usage_summary(client: Client) -> None:
    skip_unless_served(client, "/v1/usage/summary")
    rows = client.usage.summary(group_by="deployment")
    assert "demo" in [row["key"] for row in rows]
