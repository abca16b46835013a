"""Signatures: events signed with their endpoint's secret (and with both secrets while a rotation
overlaps), unregistered URLs signed with the tenant's default secret, and the default secret's
rotation and the end of its overlap."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import select

from control_plane.db.models import Job, Tenant
from control_plane.db.session import make_engine, make_sessionmaker
from tests.integration.api_helpers import h
from tests.integration.webhooks.helpers import (
    Env,
    claim,
    complete,
    deliveries,
    deploy,
    job,
    submit,
    unique,
    verify,
)


def test_events_are_signed_with_the_endpoint_secret_and_rotation_keeps_both(
    env: Env, keys: dict[str, str]
) -> None:
    deploy(env, keys["a"])
    path = unique("/ok")
    url = env.receiver.url(path)
    ep = env.client.post("/v1/webhooks/endpoints", json={"url": url}, headers=h(keys["a"])).json()
    jid = submit(env, keys["a"], url, ["started", "completed"])
    complete(env, jid, claim(env, jid))
    got = env.wait(
        "job.started and job.completed", lambda: env.receiver.at(path)[1:] and env.receiver.at(path)
    )
    by_type = {verify(ep["secret"], r)["type"]: r for r in got}
    assert set(by_type) == {"job.started", "job.completed"}
    done = verify(ep["secret"], by_type["job.completed"])
    assert done["data"]["id"] == jid and done["data"]["output"]["text"] == "the answer"
    assert len(got[0].headers["webhook-signature"].split(" ")) == 1
    env.wait("delivered", lambda: job(env, keys["a"], jid)["webhook_status"] == "delivered")
    # Another tenant's secret does not verify.
    other = env.client.get("/v1/webhooks/secret", headers=h(keys["a"])).json()["secret"]
    with pytest.raises(Exception, match=r"(?i)signature"):
        verify(other, by_type["job.completed"])

    new = env.client.post(f"/v1/webhooks/endpoints/{ep['id']}/rotate", headers=h(keys["a"])).json()
    r = env.client.post(f"/v1/jobs/{jid}/webhook/redeliver", headers=h(keys["a"]))
    assert r.status_code == 202, r.text
    again = env.wait("redelivery", lambda: env.receiver.at(path)[2:])[0]
    assert again.headers["webhook-id"] == r.json()["msg_id"]
    assert again.headers["webhook-id"] != by_type["job.completed"].headers["webhook-id"]
    assert len(again.headers["webhook-signature"].split(" ")) == 2
    assert verify(new["secret"], again)["type"] == "job.completed"
    assert verify(ep["secret"], again)["data"]["id"] == jid  # the old one, within 24 h

    log = env.wait(
        "the delivery log",
        lambda: deliveries(env, keys["a"], jid)[2:] and deliveries(env, keys["a"], jid),
    )
    assert sorted(
        (d["event_type"], d["attempt"], d["status_code"], d["delivered"]) for d in log
    ) == [
        ("job.completed", 1, 200, True),
        ("job.completed", 1, 200, True),
        ("job.started", 1, 200, True),
    ]
    assert all("body" not in d and d["url"] == url for d in log)


def test_unregistered_urls_use_the_tenant_default_secret(env: Env, keys: dict[str, str]) -> None:
    deploy(env, keys["a"])
    path = unique("/ok")
    jid = submit(env, keys["a"], env.receiver.url(path))
    complete(env, jid, claim(env, jid))
    [got] = env.wait("job.completed", lambda: env.receiver.at(path))
    secret = env.client.get("/v1/webhooks/secret", headers=h(keys["a"])).json()["secret"]
    assert verify(secret, got)["data"]["status"] == "succeeded"


def test_rotating_the_default_secret_keeps_the_old_one_signing_for_the_overlap(
    env: Env, keys: dict[str, str]
) -> None:
    deploy(env, keys["a"])
    before = env.client.get("/v1/webhooks/secret", headers=h(keys["a"])).json()
    ro = env.client.post("/v1/webhooks/secret/rotate", headers=h(keys["ro"]))
    assert ro.status_code == 403
    assert env.client.get("/v1/webhooks/secret", headers=h(keys["a"])).json() == before

    rotated = env.client.post("/v1/webhooks/secret/rotate", headers=h(keys["a"])).json()
    assert rotated["secret"] != before["secret"] and rotated["secret"].startswith("whsec_")
    overlap = datetime.fromisoformat(rotated["previous_secret_expires_at"]) - datetime.now(UTC)
    assert 23.9 * 3600 < overlap.total_seconds() <= 24 * 3600
    assert env.client.get("/v1/webhooks/secret", headers=h(keys["a"])).json() == rotated

    path = unique("/ok")
    jid = submit(env, keys["a"], env.receiver.url(path))
    complete(env, jid, claim(env, jid))
    [got] = env.wait("job.completed", lambda: env.receiver.at(path))
    assert len(got.headers["webhook-signature"].split(" ")) == 2
    assert verify(rotated["secret"], got)["data"]["id"] == jid
    assert verify(before["secret"], got)["data"]["id"] == jid  # receivers not yet updated

    # Once the overlap is over, only the new secret signs.
    engine = make_engine(env.settings.database_url)
    with make_sessionmaker(engine)() as s:
        tenant_id = s.scalars(select(Job.tenant_id).where(Job.id == jid)).one()
        tenant = s.get(Tenant, tenant_id)
        assert tenant is not None
        tenant.previous_webhook_secret_expires_at = datetime.now(UTC) - timedelta(seconds=1)
        s.commit()
    engine.dispose()
    assert env.client.get("/v1/webhooks/secret", headers=h(keys["a"])).json() == {
        "secret": rotated["secret"],
        "previous_secret_expires_at": None,
    }
    r = env.client.post(f"/v1/jobs/{jid}/webhook/redeliver", headers=h(keys["a"]))
    assert r.status_code == 202, r.text
    again = env.wait("redelivery", lambda: env.receiver.at(path)[1:])[0]
    assert len(again.headers["webhook-signature"].split(" ")) == 1
    assert verify(rotated["secret"], again)["data"]["id"] == jid
    with pytest.raises(Exception, match=r"(?i)signature"):
        verify(before["secret"], again)
