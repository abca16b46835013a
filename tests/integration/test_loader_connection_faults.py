"""The loader's requests around the data (HEAD, whole small objects such as config.json,
listings) against a store whose connections are cut: the fault suite's TCP proxy in front of
`rclone serve s3` resets every connection and refuses new ones for a moment, as a restarting
store or a cut path does. They ride it out like the part fetches do (loader/fetch.py); a
store that stays away raises FetchError naming the URI, in bounded time. Before, one refused
connection failed a cold start's load, and the worker with it."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import pytest

import loader
from loader import S3Options
from loader.s3 import s3_client
from tests.faults.tcp_proxy import FaultProxy

PREFIX = "connection-faults"
CONFIG = f"s3://test/{PREFIX}/config.json"


@pytest.fixture
def proxy(s3_env: Any) -> Iterator[FaultProxy]:
    s3_client().put_object(Bucket="test", Key=f"{PREFIX}/config.json", Body=b'{"a": 1}')
    parts = urlsplit(s3_env.url)
    with FaultProxy((parts.hostname or "", parts.port or 80)) as p:
        yield p


def through(proxy: FaultProxy) -> S3Options:
    return S3Options(endpoint_url=f"http://127.0.0.1:{proxy.port}")


def test_reads_ride_out_a_refusing_store(proxy: FaultProxy) -> None:
    store = loader.ObjectStore(through(proxy))
    assert store.read_bytes(CONFIG) == b'{"a": 1}'  # a kept-alive connection now exists
    for read in (
        lambda: store.read_bytes(CONFIG),
        lambda: store.exists(CONFIG),
        lambda: store.open(CONFIG).list_names(),
    ):
        proxy.reset(refuse_s=1.0)
        assert read() in (b'{"a": 1}', True, ["config.json"])


def test_a_store_that_stays_away_raises_fetch_error_in_time(proxy: FaultProxy) -> None:
    proxy.reset(refuse_s=60)
    started = time.monotonic()
    with pytest.raises(loader.FetchError, match=re.escape(CONFIG) + ".*failed 7 times"):
        loader.ObjectStore(through(proxy)).read_bytes(CONFIG)
    assert time.monotonic() - started < 15
