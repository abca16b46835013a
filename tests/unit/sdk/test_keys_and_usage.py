"""API keys (create, list, revoke; a create is never resent) and usage (pages, UTC times, summaries,
a missing endpoint told apart from a missing thing)."""

from __future__ import annotations

from datetime import UTC, datetime

import httpx
import pytest

from sdk import ApiKey, NotFoundError, PlatformError
from sdk._base import is_missing_route
from tests.unit.sdk.mock_platform import FakeTime, Server, answer, problem
from tests.unit.sdk.twin import MakeClient

KEY_ROW = {
    "id": "key_1",
    "name": "ci",
    "prefix": "pk_ab12",
    "scopes": ["run", "read"],
    "created_at": "2024-05-01T12:00:00Z",
    "revoked_at": None,
}


def test_keys_create_list_revoke(fake_time: FakeTime, make_client: MakeClient) -> None:
    server = Server(
        answer(201, {**KEY_ROW, "key": "pk_ab12_secret"}),
        answer(200, {"data": [KEY_ROW]}),
        httpx.Response(204),
    )
    client = make_client(server, fake_time)
    key = client.keys.create(name="ci", scopes=["run", "read"])
    assert isinstance(key, ApiKey) and key.key == "pk_ab12_secret"
    assert "secret" not in repr(key)
    assert server.body(0) == {"name": "ci", "scopes": ["run", "read"]}
    [listed] = client.keys.list()
    assert listed.key is None and listed.scopes == ["run", "read"] and not listed.revoked
    assert client.keys.revoke("key_1") is None
    assert server.paths() == ["POST /v1/keys", "GET /v1/keys", "DELETE /v1/keys/key_1"]


def test_key_create_is_not_resent_after_a_dropped_connection(
    fake_time: FakeTime, make_client: MakeClient
) -> None:
    server = Server(httpx.ReadError("reset"))
    with pytest.raises(PlatformError):
        make_client(server, fake_time).keys.create(name="ci")
    assert len(server.requests) == 1, "a re-sent create could make a second key"


def test_usage_list_pages_and_sends_times_in_utc(
    fake_time: FakeTime, make_client: MakeClient
) -> None:
    row = {"job_id": "job_1", "deployment": "demo", "cost": "0.000100000"}
    server = Server(
        answer(200, {"data": [row], "next_cursor": "c2"}),
        answer(200, {"data": [row], "next_cursor": None}),
    )
    since = datetime(2024, 5, 1, 12, tzinfo=UTC)
    client = make_client(server, fake_time)
    assert client.usage.list(deployment="demo", since=since, until="2024-06-01") == [row, row]
    params = dict(server.requests[0].url.params)
    assert params["since"] == "2024-05-01T12:00:00Z" and params["until"] == "2024-06-01"
    assert params["deployment"] == "demo"
    assert server.requests[1].url.params["cursor"] == "c2"
    with pytest.raises(ValueError, match="time zone"):
        client.usage.list(since=datetime(2024, 5, 1))


def test_usage_summary_rows_carry_their_group_as_key(
    fake_time: FakeTime, make_client: MakeClient
) -> None:
    body = {
        "group_by": "phase",
        "data": [
            {"group": "busy", "seconds": "2.000", "amount": "0.000200000"},
            {"phase": "idle", "seconds": "1.000", "amount": "0.000100000"},
        ],
        "total_amount": "0.000300000",
    }
    server = Server(answer(200, body))
    rows = make_client(server, fake_time).usage.summary(group_by="phase", since="2024-05-01")
    assert [r["key"] for r in rows] == ["busy", "idle"]
    assert dict(server.requests[0].url.params) == {"group_by": "phase", "since": "2024-05-01"}
    assert server.paths() == ["GET /v1/usage/summary"]


def test_a_missing_usage_endpoint_is_told_apart_from_a_missing_thing(
    fake_time: FakeTime, make_client: MakeClient
) -> None:
    server = Server(
        problem(404, "Not Found", "Not Found"),
        problem(404, "Not Found", "deployment 'nope' does not exist"),
    )
    client = make_client(server, fake_time)
    with pytest.raises(NotFoundError) as route:
        client.usage.summary()
    with pytest.raises(NotFoundError) as thing:
        client.deployments.get("nope")
    assert is_missing_route(route.value) and not is_missing_route(thing.value)
