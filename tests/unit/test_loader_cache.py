"""Cache tier directories on a real filesystem: entries appear whole with their sidecar,
`cached_uris` lists exactly the complete ones, eviction drops both files, and temporary files
of writers that died are swept."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from loader import cached_uris
from loader.cache import (
    ABANDONED_PARTIAL_S,
    STALE_PARTIAL_S,
    CacheWriter,
    DiskCache,
    _host,
)
from loader.http import ObjectInfo


def put(cache: DiskCache, uri: str, size: int = 100, etag: str = "e1") -> CacheWriter:
    w = cache.writer(uri, ObjectInfo(size, etag))
    assert w is not None
    w.write(0, b"x" * size)
    return w


def test_cached_uris_lists_exactly_the_complete_entries(tmp_path: Path) -> None:
    cache = DiskCache(tmp_path, max_bytes=1000)
    assert cached_uris(tmp_path / "absent") == set()
    put(cache, "s3://m/a.safetensors").commit()
    put(cache, "s3://m/b.safetensors").commit()
    put(cache, "s3://m/b.safetensors", etag="e2").commit()  # a second version of b
    writing = put(cache, "s3://m/c.safetensors")  # not committed yet
    put(cache, "s3://m/d.safetensors").abort()
    filled = cache.fill("s3://m/e.safetensors", ObjectInfo(3, "e"), lambda p: p.write_bytes(b"abc"))
    assert filled is not None
    assert cached_uris(tmp_path) == {f"s3://m/{n}.safetensors" for n in "abe"}
    writing.commit()
    assert "s3://m/c.safetensors" in cached_uris(tmp_path)

    # an entry that lost its sidecar, or whose size is not the sidecar's, is not listed
    a = cache.path_for("s3://m/a.safetensors", ObjectInfo(100, "e1"))
    a.with_suffix(".json").unlink()
    e = cache.path_for("s3://m/e.safetensors", ObjectInfo(3, "e"))
    e.write_bytes(b"ab")
    assert cached_uris(tmp_path) == {"s3://m/b.safetensors", "s3://m/c.safetensors"}
    assert cache.lookup("s3://m/a.safetensors", ObjectInfo(100, "e1")) == a  # a hit restores it
    assert "s3://m/a.safetensors" in cached_uris(tmp_path)


def test_eviction_drops_the_entry_and_its_sidecar(tmp_path: Path) -> None:
    cache = DiskCache(tmp_path, max_bytes=250)
    for i, uri in enumerate(("s3://m/old", "s3://m/new")):
        put(cache, uri).commit()
        os.utime(cache.path_for(uri, ObjectInfo(100, "e1")), (i, i))
    put(cache, "s3://m/third").commit()  # evicts the oldest to fit
    assert cached_uris(tmp_path) == {"s3://m/new", "s3://m/third"}
    assert sorted(p.suffix for p in tmp_path.iterdir()) == [".json"] * 2 + [".safetensors"] * 2


def test_temp_files_of_dead_writers_and_orphan_sidecars_are_swept(tmp_path: Path) -> None:
    cache = DiskCache(tmp_path, max_bytes=1000)
    code = "import os; print(os.getpid())"
    child = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)
    dead = int(child.stdout)  # a process that has exited
    now = time.time()

    def touch(name: str, age_s: float) -> Path:
        p = tmp_path / name
        p.write_bytes(b"")
        os.utime(p, (now - age_s, now - age_s))
        return p

    here = _host()
    old_dead = touch(f"k1.safetensors.{dead}.7.{here}.partial", STALE_PARTIAL_S + 5)
    young_dead = touch(f"k2.safetensors.{dead}.7.{here}.partial", 1)
    old_live = touch(f"k3.safetensors.{os.getpid()}.7.{here}.partial", STALE_PARTIAL_S + 5)
    abandoned = touch(f"k4.json.{os.getpid()}.7.{here}.partial", ABANDONED_PARTIAL_S + 5)
    # another pod's writer on a shared volume, whose pid means nothing here: kept until silent
    other_host = touch(f"k7.safetensors.{dead}.7.worker-b.partial", STALE_PARTIAL_S + 5)
    other_silent = touch(f"k8.safetensors.{dead}.7.worker-b.partial", ABANDONED_PARTIAL_S + 5)
    older_format = touch(f"k9.safetensors.{dead}.7.partial", STALE_PARTIAL_S + 5)
    orphan = touch("k5.json", STALE_PARTIAL_S + 5)
    young_orphan = touch("k6.json", 1)  # its entry is about to be renamed into place
    cache.sweep_partials(now)
    assert not old_dead.exists() and not abandoned.exists() and not orphan.exists()
    assert young_dead.exists() and old_live.exists() and young_orphan.exists()
    assert other_host.exists() and not other_silent.exists() and not older_format.exists()
