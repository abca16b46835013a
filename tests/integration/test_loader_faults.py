"""The loader against a misbehaving server: a real HTTP proxy (stdlib `http.server` in a
thread) in front of `rclone serve s3` fails, stalls, truncates or un-ranges chosen requests,
or replaces the object mid-load. Loads either come out bitwise equal to safetensors or raise
a typed error naming the URI; never a partial model."""

from __future__ import annotations

import contextlib
import dataclasses
import http.client
import re
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file

import loader
from loader.s3 import s3_client

KEY = "faults/model.safetensors"
URI = f"s3://test/{KEY}"
# Small parts and short timeouts so that every fault costs milliseconds.
FAST = loader.LoadOptions(
    concurrency=4,
    part_bytes=64 << 10,
    first_request_bytes=16 << 10,
    timeout_s=1.0,
    min_part_timeout_s=0.3,
    backoff_s=0.01,
    max_backoff_s=0.05,
    max_retries=4,
)

# (request number among ranged data GETs, method, headers) → fault name or None
Rule = Callable[[int, dict[str, str]], str | None]


class FaultProxy:
    """Forwards to the S3 server; `rule` picks a fault per GET with a Range header."""

    def __init__(self, upstream: str, root: Path) -> None:
        self.upstream_url = upstream
        self.upstream = upstream.removeprefix("http://")
        self.root = root  # the S3 server's directory, for whole-object replies
        self.rule: Rule = lambda n, h: None
        self.count = 0
        self.faults: list[str] = []
        self.on_request: Callable[[int], None] = lambda n: None
        self._lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def handle(self) -> None:
                # the client may give up on a request (a timeout, a cancelled fill)
                with contextlib.suppress(ConnectionResetError, BrokenPipeError):
                    super().handle()

            def do_HEAD(self) -> None:
                proxy.forward(self, "HEAD")

            def do_GET(self) -> None:
                proxy.forward(self, "GET")

            def do_PUT(self) -> None:
                proxy.forward(self, "PUT")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def forward(self, h: BaseHTTPRequestHandler, method: str) -> None:
        headers = {k: v for k, v in h.headers.items()}
        fault = None
        if method == "GET" and "Range" in headers:
            with self._lock:
                n = self.count
                self.count += 1
            self.on_request(n)
            fault = self.rule(n, headers)
            if fault:
                self.faults.append(fault)
        if fault == "fail":
            h.send_response(503)
            h.send_header("Content-Length", "0")
            h.end_headers()
            return
        length = int(headers.get("Content-Length") or 0)
        body = h.rfile.read(length) if length else None
        conn = http.client.HTTPConnection(self.upstream, timeout=30)
        conn.request(method, h.path, body=body, headers=headers)
        resp = conn.getresponse()
        data = resp.read()
        conn.close()
        out_headers = [(k, v) for k, v in resp.getheaders() if k.lower() != "transfer-encoding"]
        if fault == "ignore-range" and resp.status in (200, 206):
            # A server that ignores Range: the whole object, 200, no Content-Range.
            data = (self.root / h.path.lstrip("/").split("?")[0]).read_bytes()
            out_headers = [
                (k, v)
                for k, v in out_headers
                if k.lower() not in ("content-range", "content-length")
            ] + [("Content-Length", str(len(data)))]
            resp.status = 200
        if fault == "bad-range":
            # A buggy server: the Content-Range does not describe the bytes sent.
            out_headers = [
                (k, re.sub(r"bytes (\d+)", lambda m: f"bytes {int(m.group(1)) + 1}", v))
                if k.lower() == "content-range"
                else (k, v)
                for k, v in out_headers
            ]
        h.send_response(resp.status)
        for k, v in out_headers:
            h.send_header(k, v)
        h.end_headers()
        if method == "HEAD":
            return
        if fault == "truncate":
            h.wfile.write(data[: len(data) // 2])
            h.wfile.flush()
            h.close_connection = True
            return
        if fault == "stall":
            h.wfile.write(data[: len(data) // 3])
            h.wfile.flush()
            time.sleep(3.0)
            h.close_connection = True
            return
        h.wfile.write(data)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def sample() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    out = {f"layer{i}": torch.randn(128, 257, generator=g) for i in range(8)}  # ~1 MB
    out["bf16"] = torch.randn(999, generator=g).bfloat16()
    out["flag"] = torch.tensor([True, False])
    return out


@pytest.fixture
def proxy(s3_env: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[FaultProxy]:
    path = tmp_path / "model.safetensors"
    save_file(sample(), str(path))
    s3_client().upload_file(str(path), "test", KEY)  # straight to the server, not the proxy
    p = FaultProxy(s3_env.url, s3_env.root)
    monkeypatch.setenv("AWS_ENDPOINT_URL", p.url)
    yield p
    p.close()


def expected(proxy: FaultProxy) -> dict[str, torch.Tensor]:
    return load_file(str(proxy.root / "test" / KEY))


def assert_equal(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert set(got) == set(want)
    for name, t in want.items():
        assert torch.equal(got[name].view(torch.uint8), t.view(torch.uint8)), name


@pytest.mark.parametrize("fault", ["fail", "truncate", "stall", "ignore-range", "bad-range"])
def test_transient_faults_are_retried(proxy: FaultProxy, fault: str) -> None:
    proxy.rule = lambda n, h: fault if n in (1, 4, 5) else None
    t0 = time.monotonic()
    result = loader.load(URI, options=FAST)
    assert_equal(result.tensors, expected(proxy))
    assert proxy.faults == [fault] * 3
    assert result.metrics.num_retries >= 3
    assert time.monotonic() - t0 < 15


def test_a_server_that_always_ignores_range_is_read_as_one_stream(proxy: FaultProxy) -> None:
    proxy.rule = lambda n, h: "ignore-range"
    result = loader.load(URI, options=FAST)
    assert_equal(result.tensors, expected(proxy))
    # the header GET, then one GET for the rest of the object: no quadratic re-reads
    assert proxy.count == 2


def test_exhausted_retries_raise_fetch_error_naming_the_uri(proxy: FaultProxy) -> None:
    proxy.rule = lambda n, h: "fail" if n > 0 else None
    with pytest.raises(loader.FetchError, match=re.escape(URI) + ".*failed 5 times"):
        loader.load(URI, options=FAST)


def test_object_replaced_mid_load_is_refused(proxy: FaultProxy) -> None:
    data = bytearray((proxy.root / "test" / KEY).read_bytes())
    data[-1] ^= 0xFF  # same size, different content → different ETag
    upstream = s3_client(loader.S3Options(endpoint_url=proxy.upstream_url))

    def replace(n: int) -> None:
        if n == 3:  # a new version is uploaded while the load is running
            upstream.put_object(Bucket="test", Key=KEY, Body=bytes(data))

    proxy.on_request = replace
    with pytest.raises(loader.ObjectChanged, match=re.escape(URI) + ".*changed while loading"):
        loader.load(URI, options=FAST)


# --------------------------------------------------------------------------- tier fills


def tiers(tmp_path: Path) -> loader.LoadOptions:
    return dataclasses.replace(
        FAST,
        cache_dir=str(tmp_path / "disk"),
        host_cache_dir=str(tmp_path / "host"),
        host_cache_max_bytes=1 << 30,
    )


def tier_files(tmp_path: Path) -> list[str]:
    return sorted(p.name for d in ("host", "disk") for p in (tmp_path / d).glob("*"))


def test_a_fill_whose_reads_fail_leaves_no_entry(proxy: FaultProxy, tmp_path: Path) -> None:
    result = loader.load(URI, options=tiers(tmp_path))
    proxy.rule = lambda n, h: "fail"
    report = result.fill_tiers()
    assert report.filled == () and "failed 5 times" in report.failed[URI]
    assert tier_files(tmp_path) == []
    assert_equal(result.tensors, expected(proxy))


def test_an_object_replaced_mid_fill_is_not_cached(proxy: FaultProxy, tmp_path: Path) -> None:
    result = loader.load(URI, options=tiers(tmp_path))
    data = bytearray((proxy.root / "test" / KEY).read_bytes())
    data[-1] ^= 0xFF  # same size, different content → different ETag
    upstream = s3_client(loader.S3Options(endpoint_url=proxy.upstream_url))
    fill_starts = proxy.count

    def replace(n: int) -> None:
        if n == fill_starts + 3:
            upstream.put_object(Bucket="test", Key=KEY, Body=bytes(data))

    proxy.on_request = replace
    report = result.fill_tiers()
    assert report.filled == () and "ObjectChanged" in report.failed[URI]
    assert tier_files(tmp_path) == []


def test_a_fill_from_a_server_that_ignores_range_reads_one_stream(
    proxy: FaultProxy, tmp_path: Path
) -> None:
    proxy.rule = lambda n, h: "ignore-range"
    result = loader.load(URI, options=tiers(tmp_path))
    assert proxy.count == 2
    assert len(result.fill_tiers().filled) == 2 and proxy.count == 3
    for d in ("host", "disk"):
        (entry,) = (tmp_path / d).glob("*.safetensors")
        assert entry.read_bytes() == (proxy.root / "test" / KEY).read_bytes()


def test_a_cancelled_fill_removes_its_temp_files_at_once(proxy: FaultProxy, tmp_path: Path) -> None:
    result = loader.load(URI, options=tiers(tmp_path))
    requested, release = threading.Event(), threading.Event()

    def hold(n: int) -> None:  # the fill's GETs wait until the test lets them go
        requested.set()
        release.wait(10)

    proxy.on_request = hold
    reports: list[loader.FillReport] = []
    fill = threading.Thread(target=lambda: reports.append(result.fill_tiers()))
    fill.start()
    assert requested.wait(10)
    assert any(name.endswith(".partial") for name in tier_files(tmp_path))
    result.fill.cancel()  # what happens at interpreter exit while a daemon thread fills
    assert tier_files(tmp_path) == []
    release.set()
    fill.join(10)
    assert reports[0].filled == () and URI in reports[0].failed
    assert tier_files(tmp_path) == []
