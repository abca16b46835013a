"""Byte sources behind one protocol: local files and S3-compatible object storage.

`open_source(uri)` picks the implementation by scheme. S3 settings come from the standard AWS
variables (`AWS_ENDPOINT_URL`, `AWS_ACCESS_KEY_ID`, ...) unless `S3Options` overrides them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import urlparse

from loader.errors import AccessDenied, FetchError, LoaderError, ObjectNotFound

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client


class Source(Protocol):
    """Read access to one object (a file or an S3 key)."""

    uri: str

    def size(self) -> int: ...

    def read_range(self, start: int, length: int) -> bytes: ...

    def read_range_into(self, start: int, out: memoryview) -> None: ...


@dataclass(frozen=True, slots=True)
class S3Options:
    endpoint_url: str | None = None  # None: AWS_ENDPOINT_URL or AWS itself
    region: str | None = None  # None: AWS_DEFAULT_REGION or us-east-1


def join_uri(base: str, name: str) -> str:
    """`s3://b/models/demo/` + `config.json` → `s3://b/models/demo/config.json`."""
    return base.rstrip("/") + "/" + name


class LocalSource:
    def __init__(self, uri: str) -> None:
        self.uri = uri
        self.path = Path(uri[len("file://") :] if uri.startswith("file://") else uri)
        if not self.path.is_file():
            raise ObjectNotFound(uri, "no such file")

    def size(self) -> int:
        return self.path.stat().st_size

    def read_range(self, start: int, length: int) -> bytes:
        with self.path.open("rb") as f:
            f.seek(start)
            return f.read(length)

    def read_range_into(self, start: int, out: memoryview) -> None:
        with self.path.open("rb") as f:
            f.seek(start)
            got = f.readinto(out)
        if got != len(out):
            raise FetchError(self.uri, f"short read: {got} of {len(out)} bytes at offset {start}")


def s3_client(options: S3Options | None = None) -> S3Client:
    import boto3
    from botocore.config import Config

    options = options or S3Options()
    # A fresh session per client: credentials come from the environment at call time
    # (boto3's default session would cache the first ones it saw).
    return boto3.session.Session().client(
        "s3",
        endpoint_url=options.endpoint_url or os.environ.get("AWS_ENDPOINT_URL") or None,
        region_name=options.region or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1",
        config=Config(
            s3={"addressing_style": "path"},
            retries={"max_attempts": 5, "mode": "standard"},
            # Whole-object checksums do not apply to ranged GETs.
            request_checksum_calculation="when_required",
            response_checksum_validation="when_required",
        ),
    )


def _raise_for_client_error(uri: str, exc: Any) -> None:
    code = str(exc.response.get("Error", {}).get("Code", ""))
    if code in {"NoSuchKey", "NoSuchBucket", "404", "NotFound"}:
        raise ObjectNotFound(uri, "object does not exist") from exc
    if code in {"AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "403"}:
        raise AccessDenied(uri, f"access denied ({code}); check the storage credentials") from exc
    raise FetchError(uri, f"storage error {code}: {exc}") from exc


class S3Source:
    def __init__(self, uri: str, options: S3Options | None = None) -> None:
        from botocore.exceptions import ClientError

        parsed = urlparse(uri)
        self.uri = uri
        self.bucket = parsed.netloc
        self.key = parsed.path.lstrip("/")
        if not self.bucket or not self.key:
            raise LoaderError(uri, "expected s3://bucket/key")
        self._client = s3_client(options)
        try:
            head = self._client.head_object(Bucket=self.bucket, Key=self.key)
        except ClientError as exc:
            _raise_for_client_error(uri, exc)
        self._size = int(head["ContentLength"])
        # Pin the version: every ranged GET must read the same object.
        self.etag = str(head.get("ETag", ""))

    def size(self) -> int:
        return self._size

    def _get(self, start: int, length: int) -> Any:
        from botocore.exceptions import ClientError

        try:
            return self._client.get_object(
                Bucket=self.bucket,
                Key=self.key,
                Range=f"bytes={start}-{start + length - 1}",
                IfMatch=self.etag,
            )
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") == "PreconditionFailed":
                raise FetchError(self.uri, "object changed while loading; retry") from exc
            _raise_for_client_error(self.uri, exc)
            raise  # unreachable

    def read_range(self, start: int, length: int) -> bytes:
        if length == 0:
            return b""
        data: bytes = self._get(start, length)["Body"].read()
        if len(data) != length:
            raise FetchError(self.uri, f"expected {length} bytes at {start}, got {len(data)}")
        return data

    def read_range_into(self, start: int, out: memoryview) -> None:
        if len(out) == 0:
            return
        body = self._get(start, len(out))["Body"]
        got = 0
        # Receive straight into the destination; no intermediate bytes objects.
        raw = body._raw_stream
        while got < len(out):
            n = raw.readinto(out[got:])
            if not n:
                break
            got += n
        body.close()
        if got != len(out):
            raise FetchError(self.uri, f"short read: {got} of {len(out)} bytes at offset {start}")


def open_source(uri: str, s3: S3Options | None = None) -> Source:
    if uri.startswith("s3://"):
        return S3Source(uri, s3)
    if uri.startswith("file://") or uri.startswith("/") or not urlparse(uri).scheme:
        return LocalSource(uri)
    raise LoaderError(uri, "unsupported URI scheme (use s3://, file:// or a local path)")


def read_bytes(uri: str, s3: S3Options | None = None) -> bytes:
    """Whole content of a small object (config and tokenizer files)."""
    src = open_source(uri, s3)
    return src.read_range(0, src.size())


def exists(uri: str, s3: S3Options | None = None) -> bool:
    try:
        open_source(uri, s3)
    except ObjectNotFound:
        return False
    return True
