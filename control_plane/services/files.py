"""A tenant's files in the platform's store (`store://path`): upload, list, delete.

The store is one bucket (`PLATFORM_STORE_BUCKET`); a tenant's files live under
`tenants/<tenant id>/`, and a tenant can only spell paths below its own prefix (see
`domain/uris.py`), so no request of one tenant can name another's file. Uploads stream:
parts of `PART_BYTES` go to object storage as they arrive (S3 multipart), so a multi-GB
checkpoint never sits in the API's memory; a failed or oversized upload is aborted and
leaves nothing behind.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from control_plane.domain import uris
from control_plane.errors import InvalidRequest, NotFound, TooLarge, Unavailable
from control_plane.services import object_store, storage
from control_plane.settings import Settings

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

# S3 parts are 5 MiB at least (but the last); 16 MiB keeps request counts low.
PART_BYTES = 16 * 1024 * 1024
MAX_LIST = 1_000


@contextlib.contextmanager
def storage_errors() -> Iterator[None]:
    """Object storage failing under a request: 503 (the client may retry), never a 500."""
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        yield
    except ClientError as exc:
        raise Unavailable(f"object storage answered {object_store.error_code(exc)}") from None
    except BotoCoreError as exc:
        raise Unavailable(f"object storage is unavailable: {type(exc).__name__}") from None


def file_location(path: str) -> uris.Location:
    """`path` as a file of the caller's namespace; 422 for a prefix or a traversal."""
    loc = storage.parse(uris.STORE_SCHEME + path, "path")
    if loc.key.endswith("/"):
        raise InvalidRequest(
            f"path {path!r} names a directory; give a file name",
            errors=[{"field": "path", "message": "ends with '/'"}],
        )
    return loc


@dataclass
class Upload:
    """One file being received; `add` parts as they come, then `finish` (or `abort`)."""

    settings: Settings
    tenant_id: str
    location: uris.Location
    size: int = 0
    _buffer: bytearray = field(default_factory=bytearray)
    _parts: list[dict[str, Any]] = field(default_factory=list)
    _upload_id: str | None = None
    _s3: S3Client | None = None

    @property
    def key(self) -> str:
        return uris.store_key(self.tenant_id, self.location.key)

    @property
    def bucket(self) -> str:
        return self.settings.store_bucket

    def add(self, chunk: bytes) -> None:
        """Take received bytes; sends a part whenever a whole one is buffered."""
        self.size += len(chunk)
        if self.size > self.settings.upload_max_bytes:
            limit = self.settings.upload_max_bytes
            raise TooLarge(f"the file passed the limit of {limit} bytes", limit_bytes=limit)
        self._buffer += chunk
        while len(self._buffer) >= PART_BYTES:
            with storage_errors():
                self._send_part(bytes(self._buffer[:PART_BYTES]))
            del self._buffer[:PART_BYTES]

    def _client(self) -> S3Client:
        if self._s3 is None:
            self._s3 = object_store.client(self.settings)
            object_store.ensure_bucket(self._s3, self.bucket)
        return self._s3

    def _send_part(self, data: bytes) -> None:
        s3 = self._client()
        if self._upload_id is None:
            made = s3.create_multipart_upload(Bucket=self.bucket, Key=self.key)
            self._upload_id = made["UploadId"]
        number = len(self._parts) + 1
        sent = s3.upload_part(
            Bucket=self.bucket, Key=self.key, UploadId=self._upload_id,
            PartNumber=number, Body=data,
        )  # fmt: skip
        self._parts.append({"PartNumber": number, "ETag": sent["ETag"]})

    def finish(self) -> dict[str, Any]:
        """Store the file (replacing any previous one at its path); its public description."""
        with storage_errors():
            return self._finish()

    def _finish(self) -> dict[str, Any]:
        s3 = self._client()
        if self._upload_id is None:
            s3.put_object(Bucket=self.bucket, Key=self.key, Body=bytes(self._buffer))
        else:
            if self._buffer:
                self._send_part(bytes(self._buffer))
            s3.complete_multipart_upload(
                Bucket=self.bucket, Key=self.key, UploadId=self._upload_id,
                MultipartUpload={"Parts": self._parts},  # type: ignore[typeddict-item]
            )  # fmt: skip
        self._buffer.clear()
        head = s3.head_object(Bucket=self.bucket, Key=self.key)
        return _public(self.location.key, int(head["ContentLength"]), head)

    def abort(self) -> None:
        """Drop what was sent; nothing of this upload stays in the store."""
        if self._upload_id is not None:
            # best effort: stores also expire incomplete uploads by their own rules
            with contextlib.suppress(Exception):
                self._client().abort_multipart_upload(
                    Bucket=self.bucket, Key=self.key, UploadId=self._upload_id
                )
        self._buffer.clear()


def _public(path: str, size: int, head: Any) -> dict[str, Any]:
    modified = head.get("LastModified")
    return {
        "path": path,
        "uri": uris.STORE_SCHEME + path,
        "bytes": size,
        "etag": str(head.get("ETag", "")).strip('"'),
        "modified_at": modified.isoformat().replace("+00:00", "Z") if modified else None,
    }


def list_(
    settings: Settings, tenant_id: str, prefix: str, cursor: str | None, limit: int
) -> tuple[list[dict[str, Any]], str | None]:
    """The tenant's files under `prefix`, in path order, after the path `cursor`."""
    from botocore.exceptions import ClientError

    # Both become S3 keys: the same rules as any path a tenant names.
    if prefix:
        storage.parse(uris.STORE_SCHEME + prefix, "prefix")
    if cursor:
        storage.parse(uris.STORE_SCHEME + cursor, "cursor")
    base = uris.store_key(tenant_id, "")
    kwargs: dict[str, Any] = {"Bucket": settings.store_bucket, "Prefix": base + prefix}
    kwargs["MaxKeys"] = max(1, min(limit, MAX_LIST))
    if cursor:
        kwargs["StartAfter"] = base + cursor
    with storage_errors():
        try:
            page = object_store.client(settings).list_objects_v2(**kwargs)
        except ClientError as exc:
            if object_store.error_code(exc) not in object_store.MISSING:
                raise
            return [], None  # nothing was ever uploaded
    data = [_public(o["Key"][len(base) :], int(o["Size"]), o) for o in page.get("Contents", [])]
    more = page.get("IsTruncated") and data
    return data, (data[-1]["path"] if more else None)


def delete(settings: Settings, tenant_id: str, path: str) -> None:
    """Remove one file; NotFound when the tenant has none at `path`."""
    from botocore.exceptions import ClientError

    loc = file_location(path)
    key = uris.store_key(tenant_id, loc.key)
    with storage_errors():
        s3 = object_store.client(settings)
        try:
            s3.head_object(Bucket=settings.store_bucket, Key=key)
        except ClientError as exc:
            if object_store.error_code(exc) not in object_store.MISSING:
                raise
            raise NotFound(f"file '{path}' does not exist") from None
        s3.delete_object(Bucket=settings.store_bucket, Key=key)


__all__ = ["PART_BYTES", "Upload", "delete", "file_location", "list_"]
