"""What the platform's store can hold at a tenant's path, checked before the store is touched:
the rules a path must meet (`path_problem`, pure) and the file a new one would clash with
(`conflict`).

A file and a prefix of other files may not share a path ("a" beside "a/b"): a store over a
filesystem (the embedded `rclone serve s3`, MinIO) keeps one file per key and cannot hold
both, and on S3, which can, they would be two different things under one `store://` name.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from control_plane.domain import uris
from control_plane.services.storage import object_store

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

# What S3-compatible stores hold as a key: 1,024 bytes of UTF-8 (S3's limit), each segment at
# most 255 bytes (NAME_MAX of the filesystem under a store that keeps one file per key, as the
# embedded rclone and MinIO do). A tenant's path follows `tenants/<tenant id>/`, a tenant id
# being at most MAX_TENANT_ID_CHARS ASCII characters (`db/models/tenants.py`), so every tenant
# gets the same limit: 1,024 - len("tenants/" + 40 + "/") = 975 bytes.
MAX_KEY_BYTES = 1_024
MAX_SEGMENT_BYTES = 255
MAX_TENANT_ID_CHARS = 40
MAX_PATH_BYTES = MAX_KEY_BYTES - len(uris.store_key("t" * MAX_TENANT_ID_CHARS, ""))
# The embedded store's own working files: it would store a file under such a name and never
# list it (nor could the tenant delete it from a listing).
HIDDEN_SEGMENT_PREFIX = ".rclone_temp_"


def path_problem(path: str) -> str | None:
    """Why an S3-compatible store cannot hold a file at `path` (None: it can); pure. `path`
    is a key `uris.parse` accepted: no empty, `.` or `..` segment, no control character."""
    try:
        size = len(path.encode())
    except UnicodeEncodeError:
        return "is not valid Unicode (a lone surrogate)"
    if size > MAX_PATH_BYTES:
        return f"is {size} bytes of UTF-8; a path may have at most {MAX_PATH_BYTES} bytes"
    for segment in path.split("/"):
        n = len(segment.encode())
        if n > MAX_SEGMENT_BYTES:
            return (
                f"has a segment of {n} bytes of UTF-8 ({segment[:16]!r}...); each segment "
                f"between '/' may have at most {MAX_SEGMENT_BYTES} bytes"
            )
        if segment.startswith(HIDDEN_SEGMENT_PREFIX):
            return f"has a segment starting {HIDDEN_SEGMENT_PREFIX!r}, a name the store reserves"
    return None


def conflict(s3: S3Client, bucket: str, tenant_id: str, path: str) -> str | None:
    """The tenant's file that a file at `path` would clash with — one below `path/` (then
    `path` is a prefix), or one at a prefix of `path` — or None."""
    from botocore.exceptions import ClientError

    base = uris.store_key(tenant_id, "")
    below = s3.list_objects_v2(Bucket=bucket, Prefix=f"{base}{path}/", MaxKeys=1)
    for found in below.get("Contents", []):
        return found["Key"][len(base) :]
    segments = path.split("/")
    for n in range(1, len(segments)):
        above = "/".join(segments[:n])
        try:
            s3.head_object(Bucket=bucket, Key=base + above)
        except ClientError as exc:
            if object_store.error_code(exc) not in object_store.MISSING:
                raise
            continue  # no file there (a store over a filesystem: maybe a directory)
        return above
    return None


__all__ = ["MAX_PATH_BYTES", "MAX_SEGMENT_BYTES", "conflict", "path_problem"]
