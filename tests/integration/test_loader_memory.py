"""Extra host memory is bounded whatever the checkpoint size: a 1 GiB checkpoint loads with
peak RSS beyond the destination arena under 64 MiB (host path) and under ring + 64 MiB
(staged path, 64 MiB ring, a CPU stand-in for the device), and a tier fill copies it with
under 48 MiB. Measured in a fresh subprocess from /proc/self/status VmHWM."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest

GiB = 1 << 30
MiB = 1 << 20

CHILD = r"""
import json, sys, threading
import torch
import loader

def status(field):
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024

class Event:
    def synchronize(self):
        pass

class Copier:  # synchronous CPU stand-in for the CUDA copy engine
    def copy_async(self, dst, src):
        dst.copy_(src)
    def record(self):
        return Event()

path, mode = sys.argv[1], sys.argv[2]
base = status("VmRSS")
ring = 64 << 20
result = loader.load(
    path,
    options=loader.LoadOptions(ring_bytes=ring),
    copier=Copier() if mode == "staged" else None,
)
arena = sum(t.numel() * t.element_size() for t in result.tensors.values())
first = next(iter(result.tensors.values()))
print(json.dumps({"extra": status("VmHWM") - base - arena, "arena": arena,
                  "probe": float(first.reshape(-1)[12345].item())}))
"""


@pytest.fixture(scope="module")
def big_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 1 GiB safetensors file (4 × 256 MiB of F32) written with a repeated 16 MiB block."""
    path = tmp_path_factory.mktemp("big") / "model.safetensors"
    n = 256 * MiB
    header = {
        f"w{i}": {"dtype": "F32", "shape": [n // 4], "data_offsets": [i * n, (i + 1) * n]}
        for i in range(4)
    }
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    block = (bytes(range(256)) * (16 * MiB // 256))[: 16 * MiB]
    with path.open("wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        for _ in range(GiB // len(block)):
            f.write(block)
    return path


@pytest.mark.parametrize(("mode", "bound"), [("host", 64 * MiB), ("staged", 128 * MiB)])
def test_peak_extra_rss_is_bounded(big_checkpoint: Path, mode: str, bound: int) -> None:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(big_checkpoint), mode],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONWARNINGS": "error"},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert r["arena"] == GiB
    assert r["extra"] < bound, f"{mode}: {r['extra'] / MiB:.0f} MiB extra"
    k = 12345 * 4 % 256  # byte k of the data section is k % 256
    assert r["probe"] == struct.unpack("<f", bytes((k + i) % 256 for i in range(4)))[0]


FILL_CHILD = r"""
import json, sys
from pathlib import Path
from loader.cache import DiskCache, Tier
from loader.fill import FillJob, TierFill
from loader.http import ObjectInfo
from loader.options import LoadOptions

path, root = Path(sys.argv[1]), Path(sys.argv[2])

def status(field):
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024

uri, info = "s3://models/big/model.safetensors", ObjectInfo(path.stat().st_size, "e1")
disk = DiskCache(root / "disk", 2 << 30)
disk.fill(uri, info, lambda tmp: tmp.hardlink_to(path))  # the disk tier holds it
host = DiskCache(root / "host", 2 << 30)
with path.open("rb") as f:
    prefix = f.read(8)
    raw = prefix + f.read(int.from_bytes(prefix, "little"))
job = FillJob(uri, info, raw, False, ("host",))
base = status("VmRSS")
report = TierFill([job], [Tier("host", host), Tier("disk", disk)], LoadOptions()).run()
print(json.dumps({"extra": status("VmHWM") - base, "filled": report.filled,
                  "failed": report.failed}))
"""


def test_a_tier_fill_uses_its_part_buffers_only(big_checkpoint: Path, tmp_path: Path) -> None:
    """A disk hit's fill of the host tier copies 1 GiB through two 8 MiB buffers."""
    out = subprocess.run(
        [sys.executable, "-c", FILL_CHILD, str(big_checkpoint), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONWARNINGS": "error"},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert r["filled"] == [["host", "s3://models/big/model.safetensors"]], r["failed"]
    assert r["extra"] < 48 * MiB, f"{r['extra'] / MiB:.0f} MiB extra"
    (entry,) = (tmp_path / "host").glob("*.safetensors")
    assert entry.stat().st_size == big_checkpoint.stat().st_size
