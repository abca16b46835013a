"""Storage URIs a tenant supplies (a model, a batch input), parsed and normalised; pure.

    parse("store://models/demo/")          # Location("store", "", "models/demo/")
    parse("s3://ext-bucket/ckpt/")          # Location("s3", "ext-bucket", "ckpt/")
    parse("file:///srv/models/x")          # Location("host", "", "/srv/models/x")
    parse("s3://b/a/../other")             # UriError: '..' is not allowed

What a location may be read with — and whether this tenant may read it at all — is decided by
`services/storage/storage_access.py`; this module only makes sure that a URI means exactly one
object or prefix. Anything that could make two spellings reach the same key differently, or climb
out of a prefix (dot segments, percent-encoded separators or dots, backslashes, control characters,
empty segments), is refused rather than "cleaned": a client that sends such a URI has made a mistake
or is probing, and either way the answer is a 422 naming the field.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

Kind = Literal["store", "s3", "host", "hf"]
STORE_SCHEME = "store://"
MAX_URI_CHARS = 2_000
# S3 bucket names: 3–63 lowercase letters, digits, dots and hyphens, alphanumeric at both ends.
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
_HF_REPO = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")
_HF_REVISION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,99}$")
# Percent-escapes of '.', '/', '\' and '%' itself (double encoding) could hide a traversal.
_HIDDEN = re.compile(r"%(2e|2f|5c|25)", re.IGNORECASE)
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


class UriError(ValueError):
    """A URI that names no single object or prefix; `reason` says why (shown to the client)."""

    def __init__(self, uri: str, reason: str) -> None:
        super().__init__(f"{uri!r}: {reason}")
        self.uri = uri
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Location:
    kind: Kind  # store: the tenant's namespace; s3: a bucket; host: a path; hf: the Hub
    bucket: str  # the bucket (s3), the repo (hf); "" otherwise
    key: str  # the key or prefix (store, s3), the absolute path (host), "rev/path" (hf)

    @property
    def uri(self) -> str:
        """The canonical spelling, as stored and shown back."""
        if self.kind == "store":
            return STORE_SCHEME + self.key
        if self.kind == "s3":
            return f"s3://{self.bucket}/{self.key}"
        if self.kind == "host":
            return "file://" + self.key
        return f"hf://{self.bucket}" + (f"@{self.key}" if self.key else "")


def parse(uri: str) -> Location:
    """The one location `uri` names; UriError when it is malformed or could climb out."""
    if len(uri) > MAX_URI_CHARS:
        raise UriError(uri[:60] + "…", f"longer than {MAX_URI_CHARS} characters")
    if _CONTROL.search(uri):
        raise UriError(uri, "control characters are not allowed")
    if "\\" in uri:
        raise UriError(uri, "backslashes are not allowed")
    if _HIDDEN.search(uri):
        raise UriError(uri, "percent-encoded '.', '/', '\\' or '%' are not allowed")
    if uri.startswith(STORE_SCHEME):
        return Location("store", "", _key(uri, uri[len(STORE_SCHEME) :]))
    if uri.startswith("s3://"):
        bucket, _, rest = uri[len("s3://") :].partition("/")
        if not _BUCKET.fullmatch(bucket) or ".." in bucket:
            raise UriError(uri, "the bucket name is not a valid S3 bucket name")
        return Location("s3", bucket, _key(uri, rest))
    if uri.startswith("file://"):
        path = uri[len("file://") :]
        if not path.startswith("/"):
            raise UriError(uri, "a file:// URI needs an absolute path (file:///path)")
        return Location("host", "", "/" + _key(uri, path[1:]))
    if uri.startswith("/"):
        return Location("host", "", "/" + _key(uri, uri[1:]))
    if uri.startswith("hf://"):
        repo, _, revision = uri[len("hf://") :].partition("@")
        if not _HF_REPO.fullmatch(repo) or ".." in repo:
            raise UriError(uri, "expected hf://org/repo[@revision]")
        if revision and (not _HF_REVISION.fullmatch(revision) or ".." in revision.split("/")):
            raise UriError(uri, "the revision is not a valid Hub revision")
        return Location("hf", repo, revision)
    raise UriError(uri, "expected store://path, s3://bucket/key, hf://org/repo or a host path")


def _key(uri: str, key: str) -> str:
    """`key` checked segment by segment; a trailing '/' (a prefix) is kept."""
    if not key:
        raise UriError(uri, "names no key: give a path after the bucket or scheme")
    segments = key.split("/")
    inner = segments[:-1] if segments[-1] == "" else segments
    for segment in inner:
        if segment in ("", ".", ".."):
            shown = f"'{segment}'" if segment else "an empty segment ('//')"
            raise UriError(uri, f"{shown} is not allowed in a path")
    return key


def store_key(tenant_id: str, key: str) -> str:
    """Where a tenant's `store://key` lives in the platform's bucket."""
    return f"tenants/{tenant_id}/{key}"


__all__ = ["STORE_SCHEME", "Location", "UriError", "parse", "store_key"]
