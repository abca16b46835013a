"""`hf://` URIs against a local stand-in for the Hub (`HF_ENDPOINT`): a stdlib HTTP server
answering `resolve` like the Hub does (small files directly, large ones by a redirect to a
storage URL with X-Linked-* headers), with Range support."""

from __future__ import annotations

import hashlib
import json
import re
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file

import loader

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def serve_hub(files: Path) -> tuple[ThreadingHTTPServer, str]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:
            pass

        def do_HEAD(self) -> None:
            self.handle_any(head=True)

        def do_GET(self) -> None:
            self.handle_any(head=False)

        def handle_any(self, head: bool) -> None:
            m = re.fullmatch(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", self.path)
            cdn = re.fullmatch(r"/cdn/(.+)", self.path)
            name = (m.group(3) if m else cdn.group(1) if cdn else "").split("?")[0]
            path = files / name
            if not name or not path.is_file() or (m and m.group(2) not in ("main", COMMIT)):
                self.send_response(404)
                self.send_header("X-Error-Code", "EntryNotFound")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            data = path.read_bytes()
            etag = hashlib.sha256(data).hexdigest()
            if m and name.endswith(".safetensors"):
                self.send_response(302)
                self.send_header("Location", f"http://127.0.0.1:{port}/cdn/{name}?sig=x")
                self.send_header("X-Repo-Commit", COMMIT)
                self.send_header("X-Linked-Etag", f'"{etag}"')
                self.send_header("X-Linked-Size", str(len(data)))
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            start, end = 0, len(data)
            rng = self.headers.get("Range")
            if rng:
                a, b = rng.removeprefix("bytes=").split("-")
                start, end = int(a), min(int(b) + 1, len(data))
                self.send_response(206)
                self.send_header("Content-Range", f"bytes {start}-{end - 1}/{len(data)}")
            else:
                self.send_response(200)
            self.send_header("ETag", f'"{etag}"')
            self.send_header("X-Repo-Commit", COMMIT)
            self.send_header("Accept-Ranges", "bytes")
            self.send_header("Content-Length", str(end - start))
            self.end_headers()
            if not head:
                self.wfile.write(data[start:end])

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    port = server.server_address[1]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{port}"


@pytest.fixture
def hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    server, url = serve_hub(tmp_path)
    monkeypatch.setenv("HF_ENDPOINT", url)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    yield tmp_path
    server.shutdown()
    server.server_close()


def test_hf_repo_loads_like_safetensors(hub: Path) -> None:
    g = torch.Generator().manual_seed(5)
    tensors = {"a": torch.randn(300, 7, generator=g), "b": torch.randn(5, generator=g).half()}
    save_file({"a": tensors["a"]}, str(hub / "model-1.safetensors"))
    save_file({"b": tensors["b"]}, str(hub / "model-2.safetensors"))
    index = {"weight_map": {"a": "model-1.safetensors", "b": "model-2.safetensors"}}
    (hub / "model.safetensors.index.json").write_text(json.dumps(index))
    (hub / "config.json").write_text('{"x": 1}')
    options = loader.LoadOptions(part_bytes=1 << 16, first_request_bytes=1024)
    got = loader.load("hf://org/model@main", options=options).tensors
    for name, t in tensors.items():
        assert torch.equal(got[name], t), name
    assert loader.read_bytes("hf://org/model/config.json") == b'{"x": 1}'
    assert loader.exists("hf://org/model@" + COMMIT + "/config.json")
    assert not loader.exists("hf://org/model/absent.json")
    single = loader.load_checkpoint("hf://org/model/model-1.safetensors")
    assert torch.equal(single["a"], load_file(str(hub / "model-1.safetensors"))["a"])


def test_hf_missing_file_is_object_not_found(hub: Path) -> None:
    with pytest.raises(loader.ObjectNotFound, match=re.escape("hf://org/model@v9/x.safetensors")):
        loader.load("hf://org/model@v9/x.safetensors")


def test_hf_transfer_fills_the_cache_tier_then_the_cache_serves(
    hub: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """The load streams the file with the loader's own GETs; the tier fill afterwards
    downloads it with hf_transfer into the disk tier, then copies it to the host tier."""
    pytest.importorskip("hf_transfer")
    g = torch.Generator().manual_seed(9)
    tensors = {"w": torch.randn(257, 33, generator=g), "n": torch.arange(7, dtype=torch.int64)}
    save_file(tensors, str(hub / "model.safetensors"))
    cache_dir, host_dir = tmp_path_factory.mktemp("cache"), tmp_path_factory.mktemp("host")
    options = loader.LoadOptions(
        cache_dir=str(cache_dir),
        host_cache_dir=str(host_dir),
        host_cache_max_bytes=1 << 30,
        part_bytes=1 << 14,
    )
    uri = "hf://org/model/model.safetensors"

    first = loader.load(uri, options=options)
    assert first.metrics.cache_hits == 0
    for name, t in tensors.items():
        assert torch.equal(first.tensors[name], t), name
    assert not list(cache_dir.iterdir()) and not list(host_dir.iterdir())
    assert first.fill_tiers().filled == (("disk", uri), ("host", uri))
    for d in (cache_dir, host_dir):
        entries = list(d.glob("*.safetensors"))
        assert [e.read_bytes() for e in entries] == [(hub / "model.safetensors").read_bytes()]
        assert not list(d.glob("*.partial"))

    again = loader.load(uri, options=options)
    assert again.metrics.tier_hits == {"host": 1}
    assert torch.equal(again.tensors["w"], tensors["w"])


def test_hf_transfer_failure_leaves_no_entry(
    hub: Path, tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("hf_transfer")
    from loader.hf import HfSource

    save_file({"w": torch.ones(64)}, str(hub / "model.safetensors"))
    cache_dir = tmp_path_factory.mktemp("cache")
    # the file disappears from storage between the load and hf_transfer's requests
    download = HfSource.download

    def vanishing(self: HfSource, *args: Any) -> None:
        (hub / "model.safetensors").unlink()
        download(self, *args)

    monkeypatch.setattr(HfSource, "download", vanishing)
    uri = "hf://org/model/model.safetensors"
    result = loader.load(uri, options=loader.LoadOptions(cache_dir=str(cache_dir), max_retries=0))
    assert torch.equal(result.tensors["w"], torch.ones(64))
    report = result.fill_tiers()
    assert report.filled == () and "hf_transfer download failed" in report.failed[uri]
    assert not list(cache_dir.iterdir())
