"""Webhook endpoints through the API: create, read, list (without secrets), rotate, delete, the
errors (bad URL, scope, another tenant), and private targets refused unless allowed."""

from __future__ import annotations

from datetime import UTC, datetime

from fastapi.testclient import TestClient

from control_plane.api.app import create_app
from control_plane.settings import Settings
from tests.integration.api_helpers import WORKER_TOKEN, h
from tests.integration.webhooks.helpers import Env, unique


def test_endpoint_management(env: Env, keys: dict[str, str]) -> None:
    c, a = env.client, h(keys["a"])
    url = env.receiver.url(unique("/ok"))
    r = c.post("/v1/webhooks/endpoints", json={"url": url}, headers=a)
    assert r.status_code == 201, r.text
    ep = r.json()
    assert ep["url"] == url and ep["secret"].startswith("whsec_") and ep["disabled_at"] is None
    assert c.post("/v1/webhooks/endpoints", json={"url": url}, headers=a).status_code == 409
    assert c.get(f"/v1/webhooks/endpoints/{ep['id']}", headers=a).json()["secret"] == ep["secret"]
    listed = c.get("/v1/webhooks/endpoints", headers=a).json()["data"]
    assert [e["id"] for e in listed] == [ep["id"]] and "secret" not in listed[0]

    rotated = c.post(f"/v1/webhooks/endpoints/{ep['id']}/rotate", headers=a).json()
    assert rotated["secret"] != ep["secret"] and rotated["secret"].startswith("whsec_")
    left_s = (
        datetime.fromisoformat(rotated["previous_secret_expires_at"]) - datetime.now(UTC)
    ).total_seconds()
    assert 23 * 3600 < left_s <= 24 * 3600

    # Errors: bad URL, scope, other tenant, unknown id.
    r = c.post("/v1/webhooks/endpoints", json={"url": "ftp://x/y"}, headers=a)
    assert r.status_code == 422 and r.json()["errors"][0]["field"] == "url"
    r = c.post("/v1/webhooks/endpoints", json={"url": url + "/2"}, headers=h(keys["ro"]))
    assert r.status_code == 403
    assert c.get("/v1/webhooks/endpoints", headers=h(keys["ro"])).status_code == 403
    b = h(keys["b"])
    for method, path in [
        ("GET", f"/v1/webhooks/endpoints/{ep['id']}"),
        ("POST", f"/v1/webhooks/endpoints/{ep['id']}/rotate"),
        ("DELETE", f"/v1/webhooks/endpoints/{ep['id']}"),
    ]:
        assert c.request(method, path, headers=b).status_code == 404, path
    assert c.get("/v1/webhooks/endpoints", headers=b).json()["data"] == []

    assert c.delete(f"/v1/webhooks/endpoints/{ep['id']}", headers=a).status_code == 204
    assert c.get(f"/v1/webhooks/endpoints/{ep['id']}", headers=a).status_code == 404


def test_private_endpoint_refused_without_allow_private(
    env: Env, keys: dict[str, str], redis_url: str
) -> None:
    strict = Settings(
        database_url=env.settings.database_url,
        redis_url=env.settings.redis_url,
        worker_token=WORKER_TOKEN,
        webhook_allow_private=False,
    )
    with TestClient(create_app(strict)) as c:
        for url in ("http://127.0.0.1:9/x", "http://169.254.169.254/latest", "http://10.0.0.1/"):
            r = c.post("/v1/webhooks/endpoints", json={"url": url}, headers=h(keys["a"]))
            assert r.status_code == 422 and "non-public" in r.json()["detail"], url
        assert c.get("/v1/webhooks/endpoints", headers=h(keys["a"])).json()["data"] == []
