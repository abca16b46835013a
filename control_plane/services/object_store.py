"""Object storage adapter (S3 or any S3-compatible store) for batch inputs and results.

The endpoint comes from settings (`PLATFORM_S3_ENDPOINT_URL`), credentials from the standard
AWS variables. Errors become control-plane errors here, so callers never see botocore.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

from control_plane.errors import InvalidRequest, NotFound, Unavailable
from control_plane.settings import Settings

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

CHUNK_BYTES = 256 * 1024
_MISSING = {"NoSuchKey", "NoSuchBucket", "404", "NotFound"}


def split_uri(uri: str, field: str = "input_uri") -> tuple[str, str]:
    """`s3://bucket/key` → (bucket, key); InvalidRequest naming `field` otherwise."""
    parsed = urlparse(uri)
    key = parsed.path.lstrip("/")
    if parsed.scheme != "s3" or not parsed.netloc or not key:
        raise InvalidRequest(
            f"{field} must be s3://bucket/key, got {uri!r}",
            errors=[{"field": field, "message": "expected s3://bucket/key"}],
        )
    return parsed.netloc, key


def client(settings: Settings) -> S3Client:
    import boto3
    from botocore.config import Config

    # A fresh session per client: credentials come from the environment at call time.
    return boto3.session.Session().client(
        "s3",
        endpoint_url=settings.s3_endpoint_url or os.environ.get("AWS_ENDPOINT_URL") or None,
        region_name=settings.s3_region,
        config=Config(
            s3={"addressing_style": "path"},
            retries={"max_attempts": 5, "mode": "standard"},
            connect_timeout=10,
            read_timeout=60,
        ),
    )


def _code(exc: Any) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


def read(settings: Settings, uri: str, max_bytes: int, field: str = "input_uri") -> bytes:
    """The whole object; InvalidRequest when it is missing, unreadable or over `max_bytes`."""
    from botocore.exceptions import BotoCoreError, ClientError

    bucket, key = split_uri(uri, field)
    s3 = client(settings)
    try:
        size = int(s3.head_object(Bucket=bucket, Key=key)["ContentLength"])
        if size > max_bytes:
            raise InvalidRequest(
                f"{uri} is {size} bytes; the limit is {max_bytes}",
                errors=[{"field": field, "message": f"object over {max_bytes} bytes"}],
                limit_bytes=max_bytes,
            )
        data: bytes = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
        return data
    except ClientError as exc:
        code = _code(exc)
        reason = "does not exist" if code in _MISSING else f"cannot be read ({code})"
        raise InvalidRequest(
            f"{uri} {reason}", errors=[{"field": field, "message": reason}]
        ) from None
    except BotoCoreError as exc:
        raise Unavailable(f"object storage is unavailable: {type(exc).__name__}") from None


def write(settings: Settings, uri: str, data: bytes, content_type: str) -> None:
    """Put one object, creating its bucket first if it does not exist."""
    from botocore.exceptions import ClientError

    bucket, key = split_uri(uri, "uri")
    s3 = client(settings)
    try:
        s3.head_bucket(Bucket=bucket)
    except ClientError as exc:
        if _code(exc) not in _MISSING:
            raise
        try:
            s3.create_bucket(Bucket=bucket)
        except ClientError as create_exc:
            # Another process created it in between.
            if _code(create_exc) not in {"BucketAlreadyOwnedByYou", "BucketAlreadyExists"}:
                raise
    s3.put_object(Bucket=bucket, Key=key, Body=data, ContentType=content_type)


def open_chunks(settings: Settings, uri: str) -> Iterator[bytes]:
    """Open an object (NotFound when it is gone, raised here) and iterate over its chunks."""
    from botocore.exceptions import ClientError

    bucket, key = split_uri(uri, "uri")
    try:
        body = client(settings).get_object(Bucket=bucket, Key=key)["Body"]
    except ClientError as exc:
        if _code(exc) in _MISSING:
            raise NotFound(f"{uri} does not exist") from None
        raise

    def chunks() -> Iterator[bytes]:
        try:
            yield from body.iter_chunks(CHUNK_BYTES)
        finally:
            body.close()

    return chunks()
