"""Ranged GETs over plain keep-alive HTTP connections (stdlib `http.client`).

Why not boto3/urllib3 for the data path: their response objects copy every read through a
`bytes` object; here `readinto` goes from the socket straight into the destination memory
(the C buffered reader loops `recv_into` without the GIL). Signing (S3) and auth (HF) are the
sources' business: they hand in the headers.

Every response is checked before a byte is used: status, `Content-Range` (start, end and total
size), `Content-Length`, and the ETag against the version pinned by the first response. A
server that answers a ranged GET with 200 is accepted when its `Content-Range` is right; one
that ignores `Range` and sends the whole object is accepted only for reads it can serve by
skipping forward (see `RangeBody.skip_to`).
"""

from __future__ import annotations

import http.client
import re
import ssl
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

from loader.errors import AccessDenied, FetchError, LoaderError, ObjectChanged, ObjectNotFound


class Retryable(Exception):
    """A transient failure of one request (timeout, reset, 5xx, short body): retry the part."""


class RangeIgnored(Retryable):
    """The server sent the whole object for a ranged GET that does not start at 0."""


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    size: int  # bytes in the object
    etag: str  # version tag without quotes; "" when the server sends none


_CONTENT_RANGE = re.compile(r"bytes (\d+)-(\d+)/(\d+|\*)")
RETRY_STATUS = {408, 429, 500, 502, 503, 504}
DISCARD_BYTES = 1 << 20


def normalize_etag(etag: str | None) -> str:
    return (etag or "").removeprefix("W/").strip('"')


class HttpPool:
    """Keep-alive connections to one origin; one connection per in-flight request."""

    def __init__(self, base_url: str) -> None:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {base_url}")
        self.https = parts.scheme == "https"
        self.host = parts.hostname
        self.port = parts.port or (443 if self.https else 80)
        self._idle: list[http.client.HTTPConnection] = []
        self._lock = threading.Lock()
        self._ssl = ssl.create_default_context() if self.https else None

    def _connect(self, timeout_s: float) -> http.client.HTTPConnection:
        if self._ssl is not None:
            return http.client.HTTPSConnection(
                self.host, self.port, timeout=timeout_s, context=self._ssl
            )
        return http.client.HTTPConnection(self.host, self.port, timeout=timeout_s)

    def request(
        self, method: str, target: str, headers: Mapping[str, str], timeout_s: float
    ) -> HttpResponse:
        """Send one request; a stale idle connection is replaced once, silently."""
        for attempt in range(2):
            with self._lock:
                conn = self._idle.pop() if self._idle else None
            reused = conn is not None
            if conn is None:
                conn = self._connect(timeout_s)
            conn.timeout = timeout_s
            if conn.sock is not None:
                conn.sock.settimeout(timeout_s)
            try:
                conn.request(method, target, headers=dict(headers))
                resp = conn.getresponse()
            except (OSError, http.client.HTTPException) as exc:
                conn.close()
                if reused and attempt == 0 and not isinstance(exc, TimeoutError):
                    continue  # the server closed an idle keep-alive connection
                raise Retryable(f"{method} failed: {exc!r}") from exc
            return HttpResponse(self, conn, resp)
        raise AssertionError("unreachable")

    def release(self, conn: http.client.HTTPConnection, reusable: bool) -> None:
        if reusable:
            with self._lock:
                self._idle.append(conn)
        else:
            conn.close()

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()


class HttpResponse:
    def __init__(
        self, pool: HttpPool, conn: http.client.HTTPConnection, resp: http.client.HTTPResponse
    ) -> None:
        self.pool = pool
        self.conn = conn
        self.resp = resp
        self.status = resp.status

    def header(self, name: str) -> str | None:
        return self.resp.getheader(name)

    def readinto(self, out: memoryview) -> int:
        try:
            return self.resp.readinto(out)
        except (OSError, http.client.HTTPException) as exc:
            raise Retryable(f"receive failed: {exc!r}") from exc

    def read_small(self, limit: int = 1 << 16) -> bytes:
        try:
            return self.resp.read(limit)
        except (OSError, http.client.HTTPException):
            return b""

    def close(self) -> None:
        done = self.resp.isclosed() or self.resp.length == 0
        self.pool.release(self.conn, done and not self.resp.will_close)
        if not done:
            self.resp.close()


class RangeBody:
    """Bytes `[pos, end)` of an object, received from one response."""

    def __init__(self, resp: HttpResponse, pos: int, end: int, whole: bool = False) -> None:
        self._resp = resp
        self.pos = pos  # object offset of the next byte
        self.end = end  # object offset after the last byte this body will deliver
        self.whole = whole  # the server ignored Range and sends the whole object

    def readinto(self, out: memoryview) -> int:
        """Fill `out` completely (it must fit before `end`); Retryable on a short body."""
        want = len(out)
        if self.pos + want > self.end:
            raise ValueError("read past the end of the range")
        self._fill(out)
        return want

    def _fill(self, out: memoryview) -> None:
        got = 0
        while got < len(out):
            n = self._resp.readinto(out[got:])
            if not n:
                self.pos += got
                raise Retryable(f"body ended {self.end - self.pos} bytes early")
            got += n
        self.pos += got

    def skip_to(self, offset: int, scratch: memoryview) -> None:
        """Discard bytes up to object `offset` (gaps between parts, or a Range-less reply)."""
        while self.pos < offset:
            self.readinto(scratch[: min(len(scratch), offset - self.pos)])

    def close(self) -> None:
        self._resp.close()


ErrorMapper = Callable[[int, bytes], LoaderError | None]


def open_range(
    uri: str,
    pool: HttpPool,
    target: str,
    headers: Mapping[str, str],
    start: int,
    end: int,
    pin: ObjectInfo | None,
    timeout_s: float,
    map_error: ErrorMapper | None = None,
    allow_skip: bool = False,
) -> tuple[ObjectInfo, RangeBody]:
    """GET bytes `[start, end)` (end is clipped to the object size) and validate the reply.

    With `pin` (the version seen by the first request) a different size or ETag raises
    ObjectChanged; without it, the reply defines the version. With `allow_skip` a reply that
    ignores Range is accepted: the body then starts before `start` and the caller skips.
    """
    assert end > start
    hdrs = {**headers, "Range": f"bytes={start}-{end - 1}", "Accept-Encoding": "identity"}
    if pin is not None and pin.etag:
        hdrs["If-Match"] = f'"{pin.etag}"'
    resp = pool.request("GET", target, hdrs, timeout_s)
    try:
        info, body_start, body_end = _check(uri, resp, start, end, pin, map_error, allow_skip)
    except BaseException:
        resp.close()
        raise
    whole = resp.header("Content-Range") is None
    return info, RangeBody(resp, body_start, body_end, whole)


def _check(
    uri: str,
    resp: HttpResponse,
    start: int,
    end: int,
    pin: ObjectInfo | None,
    map_error: ErrorMapper | None,
    allow_skip: bool,
) -> tuple[ObjectInfo, int, int]:
    status = resp.status
    if status not in (200, 206):
        raise _status_error(uri, status, resp.read_small(), pin, map_error)
    etag = normalize_etag(resp.header("ETag"))
    length = resp.header("Content-Length")
    content_range = resp.header("Content-Range")
    if content_range:
        m = _CONTENT_RANGE.fullmatch(content_range.strip())
        if not m or m.group(3) == "*":
            raise Retryable(f"unparseable Content-Range {content_range!r}")
        first, last, total = int(m.group(1)), int(m.group(2)), int(m.group(3))
        body_start, body_end = first, last + 1
    elif status == 200:
        # The server ignored Range and is sending the whole object.
        if length is None:
            raise Retryable("reply to a ranged GET has neither Content-Range nor Content-Length")
        total, body_start, body_end = int(length), 0, int(length)
    else:
        raise Retryable("206 reply without Content-Range")
    if pin is not None and (total != pin.size or (etag and pin.etag and etag != pin.etag)):
        raise ObjectChanged(
            uri,
            f"the object changed while loading (size {pin.size} → {total}, "
            f"ETag {pin.etag or '-'} → {etag or '-'}); load it again",
        )
    if length is not None and int(length) != body_end - body_start:
        raise Retryable(f"Content-Length {length} does not match Content-Range {content_range}")
    want_end = min(end, total)
    if body_start != start or body_end != want_end:
        if content_range is None and start > 0 and not allow_skip:
            raise RangeIgnored("the server ignored Range and sent the whole object")
        if content_range is not None:
            raise Retryable(f"asked bytes {start}-{want_end - 1}, got {content_range}")
    return ObjectInfo(total, etag), body_start, min(body_end, want_end)


def _status_error(
    uri: str, status: int, body: bytes, pin: ObjectInfo | None, map_error: ErrorMapper | None
) -> Exception:
    mapped = map_error(status, body) if map_error else None
    if mapped is not None:
        return mapped
    if status in RETRY_STATUS:
        return Retryable(f"HTTP {status}")
    if status == 404:
        return ObjectNotFound(uri, "object does not exist (HTTP 404)")
    if status in (401, 403):
        return AccessDenied(uri, f"access denied (HTTP {status}); check the credentials")
    if status == 412:
        return ObjectChanged(uri, "the object changed while loading (ETag mismatch); load again")
    if status == 416:
        if pin is not None:
            return ObjectChanged(uri, "the object shrank while loading; load it again")
        return FetchError(uri, "the object is empty (HTTP 416 for its first bytes)")
    return FetchError(uri, f"unexpected HTTP {status}: {body[:200]!r}")
