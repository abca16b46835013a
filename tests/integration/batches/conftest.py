"""Batches against the real API in process, real Redis (broker), SQL and S3 (rclone): the
settings put results and the file store on the S3 server, with small limits; `db` reads the
database and pumps the batch loop directly, as the reconciler does every tick."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from control_plane.settings import Settings
from tests.conftest import S3Server
from tests.integration.api_helpers import on_s3
from tests.integration.batches.helpers import RESULTS_BUCKET, Db


@pytest.fixture
def settings(settings: Settings, s3_env: S3Server) -> Settings:
    return on_s3(
        settings,
        s3_env,
        results_bucket=RESULTS_BUCKET,
        batch_max_lines=50,
        batch_max_in_flight=8,
        store_bucket="store-batches",
    )


@pytest.fixture
def db(settings: Settings) -> Iterator[Db]:
    d = Db(settings)
    yield d
    d.engine.dispose()
