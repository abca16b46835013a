"""Uploads into a tenant's namespace over real HTTP (uvicorn in a thread), into the real S3
server (rclone), with both SDK clients: the SDK streams a file from disk with its length
declared; the API sends S3 parts concurrently while the body arrives and reassembles them
byte-exact; a retry sends the file again; a failed part or a cut connection leaves nothing.
"""

from __future__ import annotations

import random
import socket
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from botocore.exceptions import ClientError

from control_plane.api.app import create_app
from control_plane.services.storage import files, object_store
from control_plane.settings import Settings
from sdk._base import CHUNK_BYTES
from tests.conftest import S3Server
from tests.integration.api_helpers import h, on_s3, served
from tests.unit.sdk.twin import Twin, twin

__all__ = ["twin"]  # a fixture, used by name

STORE = "store-uploads"
PART = 5 * 1024 * 1024  # the smallest part S3 takes: many parts from a small file
PATH = "models/m/model.safetensors"


@pytest.fixture
def settings(settings: Settings, s3_env: S3Server) -> Settings:
    return on_s3(settings, s3_env, store_bucket=STORE, results_bucket="results-uploads")


@pytest.fixture
def server_url(settings: Settings, redis_client: Any) -> Iterator[str]:
    """The API served by uvicorn on a free port, in a thread of this process."""
    with served(create_app(settings)) as address:
        yield f"http://{address}"


@pytest.fixture
def tenant(tenants: dict[str, dict[str, str]]) -> dict[str, str]:
    """An ordinary tenant with an admin key: {id, key}."""
    return tenants["a"]


class Parts:
    """Spies on `Upload` (monkeypatched in): what each upload declared, the size of each part
    sent, the most parts in flight at once, the aborts; `fail` makes chosen parts fail."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.declared: list[int | None] = []
        self.sizes: dict[int, int] = {}
        self.peak_in_flight = 0
        self.aborted = threading.Event()
        self.before_send: Callable[[int], None] = lambda number: None
        self._in_flight = 0
        self._lock = threading.Lock()
        send_part, post_init, abort = (
            files.Upload._send_part,
            files.Upload.__post_init__,
            files.Upload.abort,
        )

        def spy_post_init(upload: files.Upload) -> None:
            self.declared.append(upload.declared_bytes)
            post_init(upload)

        def spy_send_part(
            upload: files.Upload, s3: Any, upload_id: str, n: int, data: bytes
        ) -> str:
            with self._lock:
                self._in_flight += 1
                self.peak_in_flight = max(self.peak_in_flight, self._in_flight)
            try:
                self.before_send(n)
                self.sizes[n] = len(data)
                return send_part(upload, s3, upload_id, n, data)
            finally:
                with self._lock:
                    self._in_flight -= 1

        def spy_abort(upload: files.Upload) -> None:
            abort(upload)
            self.aborted.set()

        monkeypatch.setattr(files, "PART_BYTES", PART)
        monkeypatch.setattr(files.Upload, "__post_init__", spy_post_init)
        monkeypatch.setattr(files.Upload, "_send_part", spy_send_part)
        monkeypatch.setattr(files.Upload, "abort", spy_abort)


class Recording(httpx.BaseTransport, httpx.AsyncBaseTransport):
    """The real transport of either client, keeping each request and the size of each piece
    of its body as it goes out on the socket."""

    def __init__(self) -> None:
        self.requests: list[httpx.Request] = []
        self.pieces: list[list[int]] = []  # per request
        self._sync = httpx.HTTPTransport()
        self._async = httpx.AsyncHTTPTransport()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        assert isinstance(request.stream, httpx.SyncByteStream)
        request.stream = NotedStream(request.stream, self._note(request))
        return self._sync.handle_request(request)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        assert isinstance(request.stream, httpx.AsyncByteStream)
        request.stream = AsyncNotedStream(request.stream, self._note(request))
        return await self._async.handle_async_request(request)

    def _note(self, request: httpx.Request) -> list[int]:
        self.requests.append(request)
        self.pieces.append([])
        return self.pieces[-1]

    def close(self) -> None:
        self._sync.close()

    async def aclose(self) -> None:
        await self._async.aclose()


class NotedStream(httpx.SyncByteStream):
    """`inner`, appending the size of each piece to `pieces` as it is sent."""

    def __init__(self, inner: httpx.SyncByteStream, pieces: list[int]) -> None:
        self.inner, self.pieces = inner, pieces

    def __iter__(self) -> Iterator[bytes]:
        for piece in self.inner:
            self.pieces.append(len(piece))
            yield piece


class AsyncNotedStream(httpx.AsyncByteStream):
    def __init__(self, inner: httpx.AsyncByteStream, pieces: list[int]) -> None:
        self.inner, self.pieces = inner, pieces

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for piece in self.inner:
            self.pieces.append(len(piece))
            yield piece


def stored(settings: Settings, tenant: dict[str, str], path: str) -> bytes | None:
    """The tenant's file at `path` as the store holds it; None when there is none."""
    s3 = object_store.client(settings)
    key = f"tenants/{tenant['id']}/{path}"
    try:
        data: bytes = s3.get_object(Bucket=STORE, Key=key)["Body"].read()
    except ClientError as exc:
        assert object_store.error_code(exc) in object_store.MISSING
        return None
    return data


def multipart_left(settings: Settings, tenant: dict[str, str]) -> list[str]:
    """Keys of the tenant's multipart uploads still open in the store."""
    s3 = object_store.client(settings)
    listed = s3.list_multipart_uploads(Bucket=STORE, Prefix=f"tenants/{tenant['id']}/")
    return [u["Key"] for u in listed.get("Uploads", [])]


def model_file(tmp_path: Path, size: int) -> tuple[Path, bytes]:
    data = random.Random(size).randbytes(size)
    path = tmp_path / "model.safetensors"
    path.write_bytes(data)
    return path, data


def test_sdk_streams_a_file_whose_parts_go_concurrently_and_reassemble_exactly(
    server_url: str, tenant: dict[str, str], settings: Settings, twin: Twin,
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    parts = Parts(monkeypatch)
    # Parts 1 and 2 each wait for the other: they pass only if both are on their way at once,
    # which they can be only while the body keeps streaming.
    both = threading.Barrier(2, timeout=20)

    def meet(number: int) -> None:
        if number <= 2:
            both.wait()

    parts.before_send = meet
    size = 4 * PART + 12_345  # four whole parts and a short last one
    path, data = model_file(tmp_path, size)
    sent = Recording()

    heard: list[int] = []
    with twin.client(server_url, tenant["key"], transport=sent) as client:
        uploaded = client.files.upload(PATH, path, progress=heard.append)

    assert (uploaded.path, uploaded.uri, uploaded.bytes) == (PATH, "store://" + PATH, size)
    assert stored(settings, tenant, PATH) == data
    assert parts.sizes == {1: PART, 2: PART, 3: PART, 4: PART, 5: 12_345}
    assert 2 <= parts.peak_in_flight <= files.MAX_PARTS_IN_FLIGHT
    # The SDK streamed the file: its length declared (so the API knew it), never sent whole.
    [request] = sent.requests
    assert request.headers["content-length"] == str(size)
    # the bytes sent so far, as they went (a progress bar moves within the file)
    assert heard == sorted(heard) and heard[-1] == size and len(heard) > 1
    assert "transfer-encoding" not in request.headers
    assert parts.declared == [size]
    assert sum(sent.pieces[0]) == size and max(sent.pieces[0]) <= CHUNK_BYTES


def test_a_retried_upload_sends_the_file_again_from_its_start(
    server_url: str, tenant: dict[str, str], settings: Settings, twin: Twin,
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    parts = Parts(monkeypatch)
    failures = [2]  # the first attempt's second part fails: 503, which the SDK retries

    def fail_once(number: int) -> None:
        if number in failures:
            failures.remove(number)
            raise ClientError({"Error": {"Code": "InternalError"}}, "UploadPart")

    parts.before_send = fail_once
    path, data = model_file(tmp_path, 2 * PART + 777)
    sent = Recording()

    with twin.client(server_url, tenant["key"], transport=sent, sleep=lambda _s: None) as client:
        assert client.files.upload(PATH, path).bytes == len(data)

    assert parts.aborted.is_set()
    assert [sum(p) for p in sent.pieces] == [len(data), len(data)]
    assert stored(settings, tenant, PATH) == data
    assert multipart_left(settings, tenant) == []


def test_a_part_the_store_refuses_fails_the_upload_and_leaves_nothing(
    server_url: str, tenant: dict[str, str], settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    parts = Parts(monkeypatch)

    def refuse(number: int) -> None:
        if number == 2:
            raise ClientError({"Error": {"Code": "InternalError"}}, "UploadPart")

    parts.before_send = refuse
    data = random.Random(3).randbytes(2 * PART + 10)
    r = httpx.put(f"{server_url}/v1/files/{PATH}", content=data, headers=h(tenant["key"]))

    assert r.status_code == 503, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    assert "InternalError" in r.json()["detail"]
    assert parts.aborted.wait(10)
    assert stored(settings, tenant, PATH) is None
    assert multipart_left(settings, tenant) == []


def test_an_upload_cut_midway_leaves_nothing(
    server_url: str, tenant: dict[str, str], settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    parts = Parts(monkeypatch)
    started = threading.Semaphore(0)
    parts.before_send = lambda _n: started.release()
    host, port = server_url.removeprefix("http://").split(":")
    head = (
        f"PUT /v1/files/{PATH} HTTP/1.1\r\nHost: test\r\n"
        f"Authorization: Bearer {tenant['key']}\r\nContent-Length: {8 * PART}\r\n\r\n"
    )
    with socket.create_connection((host, int(port)), timeout=20) as sock:
        sock.sendall(head.encode())
        sock.sendall(random.Random(5).randbytes(3 * PART + 1000))
        for _ in range(2):  # parts on their way when the connection drops
            assert started.acquire(timeout=20)
    # the client is gone after 3 of 8 parts' worth: the API aborts the upload

    assert parts.aborted.wait(20)
    assert stored(settings, tenant, PATH) is None
    assert multipart_left(settings, tenant) == []
