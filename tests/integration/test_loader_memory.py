"""Extra host memory is bounded whatever the checkpoint size: a 1 GiB checkpoint loads with
peak RSS beyond the destination arena under 64 MiB (host path) and under ring + 64 MiB
(staged path, 64 MiB ring, a CPU stand-in for the device). Measured in a fresh subprocess
from /proc/self/status VmHWM."""

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
