"""Hugging Face Hub files: `hf://org/repo[@revision]/path/in/repo`.

`huggingface_hub` resolves the file (HEAD on `{endpoint}/{repo}/resolve/{revision}/{path}`,
following the redirect to the storage URL, with the token from `HF_TOKEN` or the login
cache); the bytes are then fetched with this loader's own concurrent ranged GETs into their
destination. That is what `hf_transfer` does for downloads to disk (recent `huggingface_hub`
releases no longer call it), minus the disk. Filling the cache tiers after a load goes to
disk anyway: then, if `hf_transfer` is installed, it downloads the entry (`download`, see
`loader.fill`). `HF_ENDPOINT` points everything at a mirror or a test server.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from loader.errors import AccessDenied, FetchError, LoaderError, ObjectNotFound
from loader.http import HttpPool, ObjectInfo, RangeBody, Retryable, open_range
from loader.s3 import pool_for


def parse_hf_uri(uri: str) -> tuple[str, str, str]:
    """`hf://org/repo@rev/a/b.json` → ("org/repo", "rev", "a/b.json"); revision "main" default."""
    rest = uri[len("hf://") :]
    parts = rest.split("/", 2)
    if len(parts) < 2 or not parts[0] or not parts[1]:
        raise LoaderError(uri, "expected hf://org/repo[@revision]/path")
    repo, revision = parts[1], "main"
    if "@" in repo:
        repo, revision = repo.split("@", 1)
    return f"{parts[0]}/{repo}", revision, parts[2] if len(parts) == 3 else ""


def hf_transfer_installed() -> bool:
    try:
        import hf_transfer  # noqa: F401
    except ImportError:
        return False
    return True


def hf_endpoint() -> str:
    return (os.environ.get("HF_ENDPOINT") or "https://huggingface.co").rstrip("/")


class HfSource:
    """One file of a Hub repository, pinned to the commit and ETag its metadata names."""

    remote = True

    def __init__(self, uri: str) -> None:
        self.uri = uri
        self.repo, self.revision, self.filename = parse_hf_uri(uri)
        if not self.filename:
            raise LoaderError(uri, "names a repository, not a file")
        self._meta: Any = None

    def _metadata(self) -> Any:
        if self._meta is None:
            from huggingface_hub import get_hf_file_metadata, hf_hub_url
            from huggingface_hub.errors import (
                EntryNotFoundError,
                GatedRepoError,
                HfHubHTTPError,
                RepositoryNotFoundError,
                RevisionNotFoundError,
            )

            endpoint = hf_endpoint()
            url = hf_hub_url(self.repo, self.filename, revision=self.revision, endpoint=endpoint)
            try:
                self._meta = get_hf_file_metadata(url, endpoint=endpoint)
            except (EntryNotFoundError, RevisionNotFoundError) as exc:
                raise ObjectNotFound(self.uri, f"no such file or revision: {exc}") from None
            except GatedRepoError:
                raise AccessDenied(
                    self.uri, "gated repository: accept its terms and set HF_TOKEN"
                ) from None
            except RepositoryNotFoundError:
                raise ObjectNotFound(
                    self.uri, "repository not found (or private: set HF_TOKEN)"
                ) from None
            except HfHubHTTPError as exc:
                raise FetchError(self.uri, f"Hub error: {exc}") from None
            if self._meta.size is None:
                raise FetchError(self.uri, "the Hub did not report the file size")
        return self._meta

    def _location(self) -> tuple[str, str, dict[str, str]]:
        """(origin, path?query, headers) of the file's bytes after the Hub's redirect."""
        meta = self._metadata()
        location = urlsplit(meta.location)
        origin = f"{location.scheme}://{location.netloc}"
        target = location.path + (f"?{location.query}" if location.query else "")
        headers: dict[str, str] = {}
        if origin == hf_endpoint():
            from huggingface_hub.utils import build_hf_headers  # type: ignore[attr-defined]

            # Auth goes to the Hub itself only, never to the (pre-signed) storage redirect.
            headers = {k: v for k, v in build_hf_headers().items() if k.lower() == "authorization"}
        return origin, target, headers

    def _target(self) -> tuple[HttpPool, str, dict[str, str]]:
        origin, target, headers = self._location()
        return pool_for(origin), target, headers

    def download(self, path: Path, concurrency: int, part_bytes: int, max_retries: int) -> None:
        """The whole file into `path` with hf_transfer (concurrent ranged GETs, in Rust), run
        in a child process (`loader.hf_transfer_child` says why)."""
        origin, target, headers = self._location()
        size = self.stat().size
        args = {
            "url": origin + target,
            "filename": str(path),
            "max_files": concurrency,
            "chunk_size": part_bytes,
            "parallel_failures": min(concurrency, 4),
            "max_retries": max_retries,
            "headers": headers,
        }
        done = subprocess.run(
            [sys.executable, "-m", "loader.hf_transfer_child"],
            input=json.dumps(args).encode(),
            capture_output=True,
            check=False,
        )
        if done.returncode != 0:
            reason = done.stderr.decode(errors="replace").strip().splitlines()
            raise FetchError(
                self.uri,
                f"hf_transfer download failed: {reason[-1] if reason else done.returncode}",
            )
        got = path.stat().st_size
        if got != size:
            raise FetchError(self.uri, f"hf_transfer wrote {got} bytes, the Hub says {size}")

    def stat(self) -> ObjectInfo:
        meta = self._metadata()
        return ObjectInfo(int(meta.size), str(meta.etag or ""))

    def open_range(
        self,
        start: int,
        end: int,
        pin: ObjectInfo | None,
        timeout_s: float,
        allow_skip: bool = False,
    ) -> tuple[ObjectInfo, RangeBody]:
        pool, target, headers = self._target()
        info, body = open_range(
            self.uri, pool, target, headers, start, end, None, timeout_s, None, allow_skip
        )
        # The storage ETag may differ from the Hub's; the pin is what the metadata said.
        stat = self.stat()
        if info.size != stat.size:
            body.close()
            raise FetchError(
                self.uri, f"storage serves {info.size} bytes, the Hub says {stat.size}"
            )
        return stat, body

    def read_all(self) -> bytes:
        meta = self._metadata()
        if meta.size == 0:
            return b""
        for attempt in range(4):
            try:
                _, body = self.open_range(0, int(meta.size), None, 30.0)
                try:
                    out = bytearray(body.end - body.pos)
                    body.readinto(memoryview(out))
                    return bytes(out)
                finally:
                    body.close()
            except Retryable:
                if attempt == 3:
                    raise
        raise AssertionError("unreachable")

    def list_names(self) -> list[str]:
        from huggingface_hub import HfApi

        try:
            files = HfApi(endpoint=hf_endpoint()).list_repo_files(self.repo, revision=self.revision)
        except Exception:
            return []
        prefix = self.filename.rsplit("/", 1)[0] + "/" if "/" in self.filename else ""
        return sorted(f[len(prefix) :] for f in files if f.startswith(prefix))
