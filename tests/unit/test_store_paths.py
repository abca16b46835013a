"""The rules a path of the platform's store must meet (pure): what S3-compatible stores hold."""

from __future__ import annotations

import pytest

from control_plane.db.models import Tenant
from control_plane.services.storage import store_paths
from control_plane.services.storage.store_paths import MAX_PATH_BYTES, path_problem


def test_every_tenant_gets_the_same_path_limit() -> None:
    # The longest tenant id the schema holds, under the 1,024 bytes of an S3 key.
    assert Tenant.__table__.c.id.type.length == store_paths.MAX_TENANT_ID_CHARS
    assert MAX_PATH_BYTES == 1024 - len("tenants/") - 40 - len("/") == 975


@pytest.mark.parametrize(
    "path",
    [
        "models/demo/model.safetensors",
        "m/" + "x" * 255,
        "m/" + "é" * 127,  # 254 bytes
        "m/" + "日" * 85,  # 255 bytes
        "/".join(["a" * 255, "b" * 255, "c" * 255, "d" * (MAX_PATH_BYTES - 768)]),
        "m/.rclone/x",  # only the store's working-file prefix is reserved
        "m/a.partial",
    ],
)
def test_paths_the_store_holds(path: str) -> None:
    assert path_problem(path) is None


@pytest.mark.parametrize(
    ("path", "why"),
    [
        ("m/" + "x" * 256, "segment of 256 bytes"),
        ("m/" + "é" * 128, "segment of 256 bytes"),
        ("m/" + "日" * 86, "segment of 258 bytes"),
        ("x" * 256 + "/m", "segment of 256 bytes"),
        ("/".join(["a" * 255, "b" * 255, "c" * 255, "d" * (MAX_PATH_BYTES - 767)]), "976 bytes"),
        ("m/.rclone_temp_put_1/x", "reserves"),
        ("m/.rclone_temp_multipart_2", "reserves"),
        ("m/a\ud800", "lone surrogate"),
    ],
)
def test_paths_the_store_cannot_hold(path: str, why: str) -> None:
    problem = path_problem(path)
    assert problem is not None and why in problem
