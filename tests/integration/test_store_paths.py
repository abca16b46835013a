"""What the platform's store can hold, against the real S3 server (rclone over a directory): a
path it cannot store is 422 and a file where a prefix is (or the reverse) is 409, both before the
store is touched; an upload that loses a race to the conflicting one is 409 too; a key the store
itself refuses is 4xx, never 503. After every refusal the files already there are still listed
and can be deleted."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from control_plane.services.storage import files, store_paths
from control_plane.settings import Settings
from tests.conftest import S3Server
from tests.integration.api_helpers import h, on_s3

STORE = "store-paths"
MULTIPART = 6 * 1024 * 1024  # over one part of 5 MiB: an S3 multipart upload


@pytest.fixture
def database_url(sqlite_database_url: str) -> str:
    """SQLite only: what the store holds does not depend on the SQL database."""
    return sqlite_database_url


@pytest.fixture
def settings(settings: Settings, s3_env: S3Server) -> Settings:
    return on_s3(settings, s3_env, store_bucket=STORE, results_bucket="results-paths")


@pytest.fixture
def key(tenants: dict[str, dict[str, str]]) -> str:
    return tenants["a"]["key"]


@pytest.fixture(autouse=True)
def small_parts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(files, "PART_BYTES", 5 * 1024 * 1024)


def put(client: TestClient, key: str, path: str, data: bytes = b"x") -> httpx.Response:
    return client.put(f"/v1/files/{path}", content=data, headers=h(key))


def listed(client: TestClient, key: str) -> list[str]:
    r = client.get("/v1/files", headers=h(key))
    assert r.status_code == 200, r.text
    return [f["path"] for f in r.json()["data"]]


def still_there_and_deletable(client: TestClient, key: str, paths: list[str]) -> None:
    """`paths` are exactly the tenant's files, and each can be deleted."""
    assert listed(client, key) == sorted(paths)
    for p in paths:
        r = client.delete(f"/v1/files/{p}", headers=h(key))
        assert r.status_code == 204, (p, r.text)
    assert listed(client, key) == []


def problem(r: httpx.Response, status: int) -> dict[str, Any]:
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    body: dict[str, Any] = r.json()
    return body


# A path of MAX_PATH_BYTES: four segments (no segment may pass 255 bytes).
LONGEST = "/".join(["a" * 255, "b" * 255, "c" * 255, "d" * (store_paths.MAX_PATH_BYTES - 3 * 256)])


@pytest.mark.parametrize(
    ("path", "why", "size"),
    [
        ("m/" + "x" * 256, "255 bytes", 1),  # a leaf one byte over
        ("m/" + "x" * 256, "255 bytes", MULTIPART),
        ("m/" + "x" * 256 + "/f", "255 bytes", 1),  # an inner segment
        ("m/" + "é" * 128, "255 bytes", 1),  # 128 characters, 256 bytes of UTF-8
        (LONGEST + "e", f"{store_paths.MAX_PATH_BYTES} bytes", 1),  # the whole key
        ("m/.rclone_temp_put_1/f", ".rclone_temp_", 1),  # the embedded store's hidden names
    ],
)
def test_a_path_the_store_cannot_hold_is_422_and_touches_nothing(
    client: TestClient, key: str, path: str, why: str, size: int
) -> None:
    assert put(client, key, "m/keep").status_code == 201
    body = problem(put(client, key, path, b"z" * size), 422)
    assert why in body["detail"] and [e["field"] for e in body["errors"]] == ["path"]
    problem(client.delete(f"/v1/files/{path}", headers=h(key)), 422)
    still_there_and_deletable(client, key, ["m/keep"])


def test_the_longest_paths_are_stored_listed_and_deleted(client: TestClient, key: str) -> None:
    paths = sorted(["m/" + "x" * 255, "m/" + "é" * 127, LONGEST])
    for p in paths:
        r = put(client, key, p)
        assert r.status_code == 201, r.text
        assert r.json()["path"] == p
    still_there_and_deletable(client, key, paths)


@pytest.mark.parametrize("size", [1, MULTIPART])
@pytest.mark.parametrize(
    ("existing", "new"),
    [
        ("conf2/a/b", "conf2/a"),  # a file where a prefix is
        ("conf2/a", "conf2/a/b"),  # a prefix where a file is
        ("conf2/a", "conf2/a/b/c/d"),  # ... further down
    ],
)
def test_a_file_prefix_conflict_is_409_and_loses_nothing(
    client: TestClient, key: str, existing: str, new: str, size: int
) -> None:
    assert put(client, key, existing).status_code == 201
    body = problem(put(client, key, new, b"z" * size), 409)
    assert existing in body["detail"] and new in body["detail"]
    assert (body["path"], body["conflicts_with"]) == (new, existing)
    # Neighbours that only share characters are no conflict; replacing a file is none either.
    for fine in ("conf2/ab", "conf2/a-b/c", existing):
        assert put(client, key, fine).status_code == 201, fine
    still_there_and_deletable(client, key, sorted({existing, "conf2/ab", "conf2/a-b/c"}))


@pytest.mark.parametrize("size", [1, MULTIPART])
@pytest.mark.parametrize(("existing", "new"), [("race/a/b", "race/a"), ("race/a", "race/a/b")])
def test_an_upload_that_loses_the_race_is_409_and_loses_nothing(
    client: TestClient,
    key: str,
    monkeypatch: pytest.MonkeyPatch,
    existing: str,
    new: str,
    size: int,
) -> None:
    """The conflicting file lands between the check and the write (the check is made to miss
    it once): the store refuses the write, and the answer is still 409."""
    assert put(client, key, existing).status_code == 201
    check: Callable[..., Any] = store_paths.conflict
    missed: list[str] = []

    def late_check(*args: Any) -> Any:
        if not missed:
            missed.append("once")
            return None
        return check(*args)

    monkeypatch.setattr(store_paths, "conflict", late_check)
    body = problem(put(client, key, new, b"z" * size), 409)
    assert missed and (body["path"], body["conflicts_with"]) == (new, existing)
    still_there_and_deletable(client, key, [existing])


def test_a_key_the_store_refuses_is_422_not_503(
    client: TestClient, key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the platform's own limit lifted, the store's KeyTooLongError reaches the client as
    what it is: the client's path, refused."""
    monkeypatch.setattr(store_paths, "MAX_PATH_BYTES", 4096)
    assert put(client, key, "m/keep").status_code == 201
    too_long = "/".join(["k" * 200] * 6)  # 1,205 bytes: over S3's 1,024 for a key
    body = problem(put(client, key, too_long), 422)
    assert [e["field"] for e in body["errors"]] == ["path"]
    still_there_and_deletable(client, key, ["m/keep"])
