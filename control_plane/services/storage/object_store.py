"""Object storage adapter (S3 or any S3-compatible store): what tenants name (batch inputs,
model metadata) read through a `storage.Access`, and the platform's own results.

The platform's endpoint comes from settings (`PLATFORM_S3_ENDPOINT_URL`), its credentials from
the standard AWS variables. Errors become control-plane errors here, so callers never see
botocore.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import urlparse

from control_plane.errors import InvalidRequest, NotFound, Unavailable
from control_plane.services.storage import storage_access
from control_plane.services.storage.storage_access import Access
from control_plane.settings import Settings

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

T = TypeVar("T")

CHUNK_BYTES = 256 * 1024
MISSING = {"NoSuchKey", "NoSuchBucket", "404", "NotFound"}
_DENIED = {"AccessDenied", "403", "Forbidden", "InvalidAccessKeyId", "SignatureDoesNotMatch"}


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
    """The platform's own client (its results, its store), credentials from the environment."""
    return storage_access.s3_client(storage_access.platform_access(settings))


def error_code(exc: Any) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


def read(access: Access, max_bytes: int, field: str = "input_uri") -> bytes:
    """The whole object a tenant named, read as `access` says; InvalidRequest when it is
    missing, not readable with those credentials, or over `max_bytes`.

    Missing and forbidden give the same answer: telling them apart would let a tenant probe
    for objects it may not read.
    """
    if access.location.kind == "host":
        return _read_host(access, max_bytes, field, _unreadable(access, field))

    def whole(s3: S3Client, bucket: str, key: str) -> bytes:
        size = int(s3.head_object(Bucket=bucket, Key=key)["ContentLength"])
        if size > max_bytes:
            raise _too_large(access.location.uri, size, max_bytes, field)
        data: bytes = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
        return data

    return _with_s3(access, field, whole)


def read_range(access: Access, offset: int, length: int, field: str = "model") -> tuple[bytes, int]:
    """At most `length` bytes from `offset` of the object a tenant named, and the object's size
    (a safetensors header without its data); the same errors as `read`, missing and forbidden
    alike. Bytes past the end of the object are simply not there.
    """
    if access.location.kind == "host":
        return _read_host_range(access, offset, length, _unreadable(access, field))

    def part(s3: S3Client, bucket: str, key: str) -> tuple[bytes, int]:
        size = int(s3.head_object(Bucket=bucket, Key=key)["ContentLength"])
        end = min(offset + length, size)  # exclusive
        if end <= offset:
            return b"", size
        body = s3.get_object(Bucket=bucket, Key=key, Range=f"bytes={offset}-{end - 1}")["Body"]
        data: bytes = body.read()
        return data, size

    return _with_s3(access, field, part)


def list_names(access: Access, suffix: str, limit: int, field: str = "model") -> list[str]:
    """Names (sorted) of the objects directly inside the prefix a tenant named that end with
    `suffix`, at most `limit`; [] when there are none or listing is not allowed to it."""
    if access.location.kind == "host":
        try:
            found = [p.name for p in Path(access.location.key).iterdir() if p.is_file()]
        except OSError:
            return []
        return sorted(n for n in found if n.endswith(suffix))[:limit]

    def names(s3: S3Client, bucket: str, key: str) -> list[str]:
        prefix = key.rstrip("/") + "/"
        out: list[str] = []
        pages = s3.get_paginator("list_objects_v2").paginate(
            Bucket=bucket, Prefix=prefix, Delimiter="/"
        )
        for page in pages:
            for obj in page.get("Contents", []):
                name = obj["Key"][len(prefix) :]
                if name.endswith(suffix):
                    out.append(name)
            if len(out) >= limit:
                break
        return sorted(out)[:limit]

    try:
        return _with_s3(access, field, names)
    except InvalidRequest:
        return []  # missing or not listable: the same as nothing there


def _with_s3(access: Access, field: str, fn: Callable[[S3Client, str, str], T]) -> T:
    """`fn(client, bucket, key)` for a store or s3 location, its errors turned into ours:
    missing and denied → the one unreadable answer; anything else → 503."""
    from botocore.exceptions import BotoCoreError, ClientError

    if access.location.kind not in ("store", "s3"):
        raise InvalidRequest(
            f"{access.location.uri}: {field} must be store://path or s3://bucket/key",
            errors=[{"field": field, "message": "expected store://path or s3://bucket/key"}],
        )
    bucket, key = split_uri(access.uri, field)
    try:
        return fn(storage_access.s3_client(access), bucket, key)
    except ClientError as exc:
        if error_code(exc) in MISSING or error_code(exc) in _DENIED:
            raise _unreadable(access, field) from None
        raise Unavailable(f"object storage answered {error_code(exc)} reading {field}") from None
    except BotoCoreError as exc:
        raise Unavailable(f"object storage is unavailable: {type(exc).__name__}") from None


def _unreadable(access: Access, field: str) -> InvalidRequest:
    return InvalidRequest(
        f"{access.location.uri} does not exist or is not readable",
        errors=[{"field": field, "message": "not found or not readable"}],
    )


def _read_host_range(
    access: Access, offset: int, length: int, unreadable: Exception
) -> tuple[bytes, int]:
    try:
        with Path(access.location.key).open("rb") as f:
            size = os.fstat(f.fileno()).st_size
            f.seek(offset)
            return f.read(max(0, min(length, size - offset))), size
    except OSError:
        raise unreadable from None


def _read_host(access: Access, max_bytes: int, field: str, unreadable: Exception) -> bytes:
    path = Path(access.location.key)
    try:
        with path.open("rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size > max_bytes:
                raise _too_large(access.location.uri, size, max_bytes, field)
            return f.read()
    except OSError:
        raise unreadable from None


def _too_large(shown: str, size: int, max_bytes: int, field: str) -> InvalidRequest:
    return InvalidRequest(
        f"{shown} is {size} bytes; the limit is {max_bytes}",
        errors=[{"field": field, "message": f"object over {max_bytes} bytes"}],
        limit_bytes=max_bytes,
    )


def write(settings: Settings, uri: str, data: bytes, content_type: str) -> None:
    """Put one object of the platform's, creating its bucket first if it does not exist."""
    bucket, key = split_uri(uri, "uri")
    s3 = client(settings)
    ensure_bucket(s3, bucket)
    s3.put_object(Bucket=bucket, Key=key, Body=data, ContentType=content_type)


def ensure_bucket(s3: S3Client, bucket: str) -> None:
    """Create `bucket` if it does not exist (another process may create it concurrently)."""
    from botocore.exceptions import ClientError

    try:
        s3.head_bucket(Bucket=bucket)
    except ClientError as exc:
        if error_code(exc) not in MISSING:
            raise
        try:
            s3.create_bucket(Bucket=bucket)
        except ClientError as create_exc:
            if error_code(create_exc) not in {"BucketAlreadyOwnedByYou", "BucketAlreadyExists"}:
                raise


def open_chunks(settings: Settings, uri: str) -> Iterator[bytes]:
    """Open an object (NotFound when it is gone, raised here) and iterate over its chunks."""
    from botocore.exceptions import ClientError

    bucket, key = split_uri(uri, "uri")
    try:
        body = client(settings).get_object(Bucket=bucket, Key=key)["Body"]
    except ClientError as exc:
        if error_code(exc) in MISSING:
            raise NotFound(f"{uri} does not exist") from None
        raise

    def chunks() -> Iterator[bytes]:
        try:
            yield from body.iter_chunks(CHUNK_BYTES)
        finally:
            body.close()

    return chunks()
