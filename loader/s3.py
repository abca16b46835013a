"""S3-compatible object storage: SigV4-signed ranged GETs over a shared connection pool.

Endpoint, region and credentials are resolved like the AWS SDKs do (botocore's credential
chain: environment, profile, SSO, instance metadata, web identity) into an `S3Endpoint`: once
per `loader.sources.ObjectStore` (a load, a worker's model files), so a changed environment is
seen by the next one, and the chain's own requests (instance metadata, STS) are paid once per
store rather than per object. Addressing is path-style (`endpoint/bucket/key`), which every
S3-compatible server (MinIO, rclone, Ceph, R2) accepts. `s3_client()` gives a boto3 client with
the same settings for uploads and tools.
"""

from __future__ import annotations

import http.client
import os
import random
import threading
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import quote, urlencode, urlparse

from loader.errors import AccessDenied, FetchError, LoaderError, ObjectNotFound
from loader.http import (
    RETRY_STATUS,
    HttpPool,
    HttpResponse,
    ObjectInfo,
    RangeBody,
    Retryable,
    normalize_etag,
    open_range,
)
from loader.options import S3Options

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

# The requests around the data (HEAD, whole small objects, listings): how long one may go
# without receiving a byte (a per-receive timeout: a slow but live transfer is not cut; a
# dead connection, e.g. one lost in a partition, costs this much of a cold start), and their
# retries on transient failures, backing off from 0.1 s doubling to 2 s (about 6 s of
# retries in all, jitter aside: a store's restart or a cut connection, not a long outage).
CONTROL_TIMEOUT_S = 10.0
CONTROL_RETRIES = 6
CONTROL_BACKOFF_S = 0.1
CONTROL_MAX_BACKOFF_S = 2.0
T = TypeVar("T")
_POOLS: dict[str, HttpPool] = {}
_POOLS_LOCK = threading.Lock()
_NOT_FOUND = {"NoSuchKey", "NoSuchBucket", "NotFound", "NoSuchVersion"}
_DENIED = {
    "AccessDenied",
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "ExpiredToken",
    "InvalidToken",
    "AllAccessDisabled",
}


def _region(options: S3Options) -> str:
    return (
        options.region
        or os.environ.get("AWS_REGION")
        or os.environ.get("AWS_DEFAULT_REGION")
        or "us-east-1"
    )


def endpoint_url(options: S3Options) -> str:
    return (
        options.endpoint_url
        or os.environ.get("AWS_ENDPOINT_URL_S3")
        or os.environ.get("AWS_ENDPOINT_URL")
        or f"https://s3.{_region(options)}.amazonaws.com"
    ).rstrip("/")


def pool_for(url: str) -> HttpPool:
    """One keep-alive pool per endpoint, shared by every load in the process."""
    with _POOLS_LOCK:
        pool = _POOLS.get(url)
        if pool is None:
            pool = _POOLS[url] = HttpPool(url)
        return pool


def s3_client(options: S3Options | None = None) -> S3Client:
    """A boto3 client with the loader's settings (path-style, no whole-object checksums)."""
    import boto3
    from botocore.config import Config

    options = options or S3Options()
    # A fresh session per client: credentials come from the environment at call time
    # (boto3's default session would cache the first ones it saw).
    return boto3.session.Session(profile_name=options.profile).client(
        "s3",
        endpoint_url=endpoint_url(options),
        region_name=_region(options),
        config=Config(
            s3={"addressing_style": "path"},
            retries={"max_attempts": 5, "mode": "standard"},
            # Whole-object checksums do not apply to ranged GETs.
            request_checksum_calculation="when_required",
            response_checksum_validation="when_required",
        ),
    )


def preload() -> None:
    """Import what the first S3 request needs (botocore's credential chain and SigV4 signer:
    ~0.14 s on 2 cores), so that a process that waits before its first load (a warm-pool
    worker) does not pay it inside the load."""
    import botocore.auth
    import botocore.awsrequest
    import botocore.session  # noqa: F401


@dataclass(frozen=True, slots=True)
class S3Endpoint:
    """Where and as whom to send S3 requests: `S3Options` and the environment, resolved."""

    url: str  # endpoint URL, no trailing slash
    region: str  # signing region
    credentials: Any  # botocore Credentials (temporary ones refresh themselves); None: anonymous

    @classmethod
    def resolve(cls, options: S3Options) -> S3Endpoint:
        """Run botocore's credential chain (may ask instance metadata or STS)."""
        import botocore.session

        credentials = botocore.session.Session(profile=options.profile).get_credentials()
        return cls(endpoint_url(options), _region(options), credentials)


class S3Source:
    """One S3 object.

    >>> S3Source("s3://models/llama/model.safetensors", S3Endpoint.resolve(S3Options()))
    """

    remote = True

    def __init__(self, uri: str, endpoint: S3Endpoint) -> None:
        parsed = urlparse(uri)
        self.uri = uri
        self.bucket = parsed.netloc
        self.key = parsed.path.lstrip("/")
        if not self.bucket or not self.key:
            raise LoaderError(uri, "expected s3://bucket/key")
        self.region = endpoint.region
        self.endpoint = endpoint.url
        self.pool = pool_for(self.endpoint)
        self.path = "/" + quote(self.bucket) + "/" + quote(self.key, safe="/~")
        creds = endpoint.credentials
        self._credentials = creds.get_frozen_credentials() if creds is not None else None
        self._signers = threading.local()

    def _headers(self, method: str, target: str, extra: dict[str, str]) -> dict[str, str]:
        if self._credentials is None:
            return extra  # anonymous access (public buckets)
        from botocore.auth import S3SigV4Auth
        from botocore.awsrequest import AWSRequest

        signer = getattr(self._signers, "signer", None)
        if signer is None:
            signer = self._signers.signer = S3SigV4Auth(self._credentials, "s3", self.region)
        request = AWSRequest(method=method, url=self.endpoint + target, headers=extra)
        signer.add_auth(request)
        return {k: str(v) for k, v in request.headers.items()}

    def _request(self, method: str, target: str) -> HttpResponse:
        return self.pool.request(
            method, target, self._headers(method, target, {}), CONTROL_TIMEOUT_S
        )

    def _status_error(self, what: str, status: int, body: bytes) -> Exception:
        """The error for a non-200 answer: typed when it means something, Retryable (5xx,
        429, 408) when another try may get through."""
        mapped = self.map_error(status, body)
        if mapped is not None:
            return mapped
        if status in RETRY_STATUS:
            return Retryable(f"{what} answered HTTP {status}")
        return FetchError(self.uri, f"{what} answered HTTP {status}")

    def _retrying(self, what: str, once: Callable[[], T]) -> T:
        """`once()`, tried again on a transient failure (refused, reset, timed out, 5xx) with
        backoff and jitter: a load must not fail on a blip of the store that its part
        fetches would ride out (they retry the same way, loader.fetch)."""
        for attempt in range(CONTROL_RETRIES + 1):
            try:
                return once()
            except Retryable as exc:
                if attempt == CONTROL_RETRIES:
                    raise FetchError(
                        self.uri,
                        f"{what} failed {attempt + 1} times (last: {exc}); the storage is "
                        "unreachable or overloaded",
                    ) from exc
                backoff_s = min(CONTROL_MAX_BACKOFF_S, CONTROL_BACKOFF_S * 2**attempt)
                time.sleep(backoff_s * (0.5 + random.random()))
        raise AssertionError("unreachable")

    def map_error(self, status: int, body: bytes) -> LoaderError | None:
        code = _error_code(body)
        if code in _NOT_FOUND or status == 404:
            what = f"bucket {self.bucket!r}" if code == "NoSuchBucket" else "object"
            return ObjectNotFound(self.uri, f"{what} does not exist ({code or 'HTTP 404'})")
        if code in _DENIED or status in (401, 403):
            return AccessDenied(
                self.uri,
                f"access denied ({code or f'HTTP {status}'}); check AWS_ACCESS_KEY_ID, "
                "AWS_SECRET_ACCESS_KEY (or AWS_PROFILE) and the bucket policy",
            )
        return None

    def stat(self) -> ObjectInfo:
        def once() -> ObjectInfo:
            resp = self._request("HEAD", self.path)
            try:
                if resp.status != 200:
                    raise self._status_error("HEAD", resp.status, b"")
                return ObjectInfo(
                    int(resp.header("Content-Length") or 0), normalize_etag(resp.header("ETag"))
                )
            finally:
                resp.read_small()
                resp.close()

        return self._retrying("HEAD", once)

    def open_range(
        self,
        start: int,
        end: int,
        pin: ObjectInfo | None,
        timeout_s: float,
        allow_skip: bool = False,
    ) -> tuple[ObjectInfo, RangeBody]:
        extra = {"Range": f"bytes={start}-{end - 1}"}
        if pin is not None and pin.etag:
            extra["If-Match"] = f'"{pin.etag}"'
        return open_range(
            self.uri,
            self.pool,
            self.path,
            self._headers("GET", self.path, extra),
            start,
            end,
            pin,
            timeout_s,
            self.map_error,
            allow_skip,
        )

    def read_all(self) -> bytes:
        def once() -> bytes:
            resp = self._request("GET", self.path)
            try:
                if resp.status != 200:
                    raise self._status_error("GET", resp.status, resp.read_small())
                return _read_body(resp)
            finally:
                resp.close()

        return self._retrying("GET", once)

    def list_names(self) -> list[str]:
        """Keys under this key's "directory", relative to it (first 1000)."""
        prefix = self.key.rsplit("/", 1)[0] + "/" if "/" in self.key else ""
        return [k[len(prefix) :] for k in self.list_keys(prefix, max_keys=1000)]

    def list_keys(self, prefix: str, max_keys: int = 1000) -> list[str]:
        query = urlencode(
            {"list-type": "2", "prefix": prefix, "delimiter": "/", "max-keys": str(max_keys)}
        )
        target = "/" + quote(self.bucket) + "?" + query

        def once() -> bytes:
            resp = self._request("GET", target)
            try:
                body = _read_body(resp)
                if resp.status != 200:
                    raise self._status_error("listing", resp.status, body)
                return body
            finally:
                resp.close()

        body = self._retrying("listing", once)
        root = ET.fromstring(body)
        keys = [el.text or "" for el in root.iter() if el.tag.endswith("}Key") or el.tag == "Key"]
        return sorted(keys)


def _read_body(resp: HttpResponse) -> bytes:
    try:
        return resp.resp.read()
    except (OSError, http.client.HTTPException) as exc:
        raise Retryable(f"receive failed: {exc!r}") from exc


def _error_code(body: bytes) -> str:
    if not body:
        return ""
    try:
        root: Any = ET.fromstring(body)
    except ET.ParseError:
        return ""
    code = root.find("Code")
    return str(code.text) if code is not None and code.text else ""
