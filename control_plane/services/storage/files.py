"""A tenant's files in the platform's store (`store://path`): upload, list, delete.

The store is one bucket (`PLATFORM_STORE_BUCKET`); a tenant's files live under
`tenants/<tenant id>/`, and a tenant can only spell paths below its own prefix (see
`domain/uris.py`), so no request of one tenant can name another's file. Uploads stream:
parts (`part_bytes_for`) go to object storage as they arrive (S3 multipart), up to
`MAX_PARTS_IN_FLIGHT` of them at once while the body keeps coming, so a multi-GB checkpoint
never sits in the API's memory (at most `MAX_PARTS_IN_FLIGHT + 1` parts per upload) and
goes at the store's speed; a failed or oversized upload is aborted and leaves nothing behind.

A path is refused (422) before the store is touched when an S3-compatible store could not hold
it, and an upload is refused (409) when its file would sit where a prefix of other files is, or
below one of the tenant's files (`store_paths.py` says which).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from control_plane.domain import uris
from control_plane.errors import Conflict, InvalidRequest, NotFound, TooLarge, Unavailable
from control_plane.services.storage import object_store, storage_access, store_paths
from control_plane.settings import Settings

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

# S3 parts are 5 MiB at least (but the last), 10,000 at most per upload; 16 MiB keeps request
# counts low, and bigger ones only when a file needs them (`part_bytes_for`).
PART_BYTES = 16 * 1024 * 1024
MAX_PARTS = 10_000
# Parts being sent to the store at once, per upload: one part's round trip (signing, the
# server writing it) overlaps the next ones and the body still arriving. NOTE: an upload holds
# at most MAX_PARTS_IN_FLIGHT + 1 parts in memory (the one filling, those being sent).
MAX_PARTS_IN_FLIGHT = 3
MAX_LIST = 1_000
# How long a store's listing may lag a write it refused before a conflict shows (the embedded
# rclone's directory cache, 1 s, and a margin); waited only after a refused write.
SETTLE_S = 1.5

# The store's answers that mean "this key cannot be stored": the client's path, not an outage.
_INVALID_KEY = {"KeyTooLongError", "InvalidObjectName", "XMinioInvalidObjectName", "InvalidURI"}
_INVALID_KEY |= {"InvalidArgument"}  # rclone, for a key it will not hold ("a/./b")


@contextlib.contextmanager
def storage_errors(field: str = "path") -> Iterator[None]:
    """Object storage failing under a request: 422 naming `field` when it refused the key
    (a client's mistake), else 503 (the client may retry), never a 500."""
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        yield
    except ClientError as exc:
        code = object_store.error_code(exc)
        if code in _INVALID_KEY:
            raise InvalidRequest(
                f"object storage cannot hold this {field} ({code})",
                errors=[{"field": field, "message": f"refused by object storage ({code})"}],
            ) from None
        raise Unavailable(f"object storage answered {code}") from None
    except BotoCoreError as exc:
        raise Unavailable(f"object storage is unavailable: {type(exc).__name__}") from None


def file_location(path: str) -> uris.Location:
    """`path` as a file of the caller's namespace; 422 for a prefix, a traversal, or a path
    the store cannot hold."""
    loc = storage_access.parse(uris.STORE_SCHEME + path, "path")
    if loc.key.endswith("/"):
        raise InvalidRequest(
            f"path {path!r} names a directory; give a file name",
            errors=[{"field": "path", "message": "ends with '/'"}],
        )
    problem = store_paths.path_problem(loc.key)
    if problem is not None:
        raise InvalidRequest(
            f"path {problem}", errors=[{"field": "path", "message": problem}], path=path
        )
    return loc


def part_bytes_for(max_bytes: int) -> int:
    """The part size of an upload of at most `max_bytes`: `PART_BYTES`, or more when
    `MAX_PARTS` parts of it would not hold that many bytes."""
    return max(PART_BYTES, -(-max_bytes // MAX_PARTS))


@dataclass
class Upload:
    """One file being received; `add` bytes as they come, then `finish` (or `abort`).

    Whole parts are sent by a few threads of the upload's own while the caller goes on adding;
    `add` waits (holding the request body back) while `MAX_PARTS_IN_FLIGHT` are on their way.

        upload = Upload(settings, tenant_id, file_location("models/a/model.safetensors"))
        for chunk in body:
            upload.add(chunk)
        described = upload.finish()  # or upload.abort() on any failure
    """

    settings: Settings
    tenant_id: str
    location: uris.Location
    # The body's declared length, when it has one (it cannot be longer); sizes the parts.
    declared_bytes: int | None = None
    size: int = 0  # bytes received so far
    # Received and not yet sent: fewer bytes than a part, as they came.
    _pending: list[bytes] = field(default_factory=list)
    _pending_bytes: int = 0
    _part_bytes: int = 0  # from __post_init__
    # Every part started, by part number (1, 2, ...): its ETag once the store has it.
    _parts: dict[int, Future[str]] = field(default_factory=dict)
    _pool: ThreadPoolExecutor | None = None  # sends the parts; from the first part on
    _upload_id: str | None = None
    _s3: S3Client | None = None

    def __post_init__(self) -> None:
        limit = self.settings.upload_max_bytes
        declared = self.declared_bytes
        self._part_bytes = part_bytes_for(limit if declared is None else min(declared, limit))

    @property
    def key(self) -> str:
        return uris.store_key(self.tenant_id, self.location.key)

    @property
    def bucket(self) -> str:
        return self.settings.store_bucket

    def add(self, *chunks: bytes) -> None:
        """Take received bytes, in order; starts sending a part whenever a whole one is here."""
        self.size += sum(len(c) for c in chunks)
        if self.size > self.settings.upload_max_bytes:
            limit = self.settings.upload_max_bytes
            raise TooLarge(f"the file passed the limit of {limit} bytes", limit_bytes=limit)
        for chunk in chunks:
            while self._pending_bytes + len(chunk) >= self._part_bytes:
                need = self._part_bytes - self._pending_bytes
                self._pending.append(chunk[:need])
                chunk = chunk[need:]
                part = b"".join(self._pending)  # the one copy a part costs
                self._pending.clear()
                self._pending_bytes = 0
                with self._writing():
                    self._start_part(part)
            if chunk:
                self._pending.append(chunk)
                self._pending_bytes += len(chunk)

    def _client(self) -> S3Client:
        """The store's client; the first call checks that the file may go there (409)."""
        if self._s3 is None:
            s3 = object_store.client(self.settings)
            object_store.ensure_bucket(s3, self.bucket)
            self._refuse_conflict(s3)
            self._s3 = s3
        return self._s3

    def _refuse_conflict(self, s3: S3Client) -> None:
        other = store_paths.conflict(s3, self.bucket, self.tenant_id, self.location.key)
        if other is None:
            return
        path = self.location.key
        inside = other.startswith(path + "/")
        raise Conflict(
            f"'{path}' cannot be a file: "
            + (f"'{other}' is a file under it" if inside else f"'{other}' is a file, not a prefix")
            + "; delete that file first, or choose another path",
            path=path,
            conflicts_with=other,
        )

    @contextlib.contextmanager
    def _writing(self) -> Iterator[None]:
        """The store's errors while the file is written.

        NOTE: two uploads that would clash ("a" and "a/b") can both pass the check before
        either writes; the store then decides. S3 keeps both keys. A store over a filesystem
        refuses the second write (the embedded rclone: InternalError) and keeps the first file;
        rclone's listing may show the refused file instead of the kept one until its directory
        cache expires (1 s, `embedded/processes.py`; an aborted multipart upload restarts
        that). So after a write the store refused, the upload is aborted, the store given
        SETTLE_S to show what it kept, and the path checked again: the conflict (409) it is when
        the other upload won, else the store's error."""
        from botocore.exceptions import ClientError

        with storage_errors():
            try:
                yield
            except ClientError as exc:
                # A key the store calls invalid is no race: storage_errors answers 422.
                if self._s3 is not None and object_store.error_code(exc) not in _INVALID_KEY:
                    self.abort()
                    time.sleep(SETTLE_S)
                    self._refuse_conflict(self._s3)
                raise

    def _start_part(self, data: bytes) -> None:
        """Send `data` as the next part, once fewer than MAX_PARTS_IN_FLIGHT are on their way;
        raises the error of a part that failed (so a failure stops the upload early)."""
        s3 = self._client()
        if self._upload_id is None:
            made = s3.create_multipart_upload(Bucket=self.bucket, Key=self.key)
            self._upload_id = made["UploadId"]
            self._pool = ThreadPoolExecutor(MAX_PARTS_IN_FLIGHT, thread_name_prefix="upload")
        assert self._pool is not None, "the pool is made with the multipart upload"
        in_flight = [f for f in self._parts.values() if not f.done()]
        if len(in_flight) >= MAX_PARTS_IN_FLIGHT:
            wait(in_flight, return_when=FIRST_COMPLETED)
        for part in self._parts.values():
            if part.done():
                part.result()
        number = len(self._parts) + 1
        self._parts[number] = self._pool.submit(self._send_part, s3, self._upload_id, number, data)

    def _send_part(self, s3: S3Client, upload_id: str, number: int, data: bytes) -> str:
        sent = s3.upload_part(
            Bucket=self.bucket, Key=self.key, UploadId=upload_id, PartNumber=number, Body=data
        )
        return sent["ETag"]

    def finish(self) -> dict[str, Any]:
        """Store the file (replacing any previous one at its path); its public description."""
        with self._writing():
            return self._finish()

    def _finish(self) -> dict[str, Any]:
        s3 = self._client()
        rest = b"".join(self._pending)
        self._pending.clear()
        self._pending_bytes = 0
        if self._upload_id is None:
            s3.put_object(Bucket=self.bucket, Key=self.key, Body=rest)
        else:
            if rest:
                self._start_part(rest)
            parts = [{"PartNumber": n, "ETag": part.result()} for n, part in self._parts.items()]
            self._close_pool()
            s3.complete_multipart_upload(
                Bucket=self.bucket, Key=self.key, UploadId=self._upload_id,
                MultipartUpload={"Parts": parts},  # type: ignore[typeddict-item]
            )  # fmt: skip
        head = s3.head_object(Bucket=self.bucket, Key=self.key)
        return _public(self.location.key, int(head["ContentLength"]), head)

    def abort(self) -> None:
        """Drop what was sent; nothing of this upload stays in the store."""
        self._pending.clear()
        self._pending_bytes = 0
        # NOTE: parts already on their way finish first and queued ones never start, so no
        # part can reach the store after the abort below.
        self._close_pool()
        if self._upload_id is not None:
            # best effort: stores also expire incomplete uploads by their own rules
            with contextlib.suppress(Exception):
                self._client().abort_multipart_upload(
                    Bucket=self.bucket, Key=self.key, UploadId=self._upload_id
                )
            self._upload_id = None  # aborted once, even when called again

    def _close_pool(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None


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
        storage_access.parse(uris.STORE_SCHEME + prefix, "prefix")
    if cursor:
        storage_access.parse(uris.STORE_SCHEME + cursor, "cursor")
    base = uris.store_key(tenant_id, "")
    kwargs: dict[str, Any] = {"Bucket": settings.store_bucket, "Prefix": base + prefix}
    kwargs["MaxKeys"] = max(1, min(limit, MAX_LIST))
    if cursor:
        kwargs["StartAfter"] = base + cursor
    with storage_errors("prefix"):
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


__all__ = [
    "MAX_PARTS",
    "MAX_PARTS_IN_FLIGHT",
    "PART_BYTES",
    "Upload",
    "delete",
    "file_location",
    "list_",
    "part_bytes_for",
]
