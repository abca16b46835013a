"""The staged (device) path's ring logic on the CPU: a fake copier runs the "device" copies
late, on its own thread, so a slot handed out again before its copy finished would corrupt
the result; bitwise equality with safetensors proves it never is."""

from __future__ import annotations

import queue
import random
import threading
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import loader


class FakeEvent:
    def __init__(self) -> None:
        self._done = threading.Event()

    def synchronize(self) -> None:
        self._done.wait()


class LateCopier:
    """Copies run FIFO on one thread after a random delay (like a busy copy engine)."""

    def __init__(self) -> None:
        self._q: queue.Queue[tuple[torch.Tensor, torch.Tensor] | FakeEvent] = queue.Queue()
        self._rng = random.Random(0)
        self.copies = 0
        threading.Thread(target=self._run, daemon=True).start()

    def copy_async(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        self._q.put((dst, src))

    def record(self) -> FakeEvent:
        e = FakeEvent()
        self._q.put(e)
        return e

    def _run(self) -> None:
        while True:
            item = self._q.get()
            if isinstance(item, FakeEvent):
                item._done.set()
                continue
            time.sleep(self._rng.random() * 0.002)
            dst, src = item
            dst.copy_(src)
            self.copies += 1


def tensors() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    out = {f"w{i}": torch.randn(64, 300 + i, generator=g) for i in range(12)}
    out["odd"] = torch.randint(0, 255, (7,), dtype=torch.uint8, generator=g)
    out["h"] = torch.randn(33, generator=g).half()
    out["empty"] = torch.empty(0, 3)
    return out


@pytest.mark.parametrize("concurrency", [1, 3])
def test_ring_reuses_slots_only_after_their_copies(tmp_path: Path, concurrency: int) -> None:
    path = tmp_path / "model.safetensors"
    save_file(tensors(), str(path))
    copier = LateCopier()
    ring = 4 * (64 << 10)
    options = loader.LoadOptions(
        concurrency=concurrency, part_bytes=64 << 10, ring_bytes=ring, first_request_bytes=4096
    )
    result = loader.load(str(path), options=options, copier=copier)
    want = load_file(str(path))
    assert set(result.tensors) == set(want)
    for name, t in want.items():
        assert torch.equal(result.tensors[name].view(torch.uint8), t.view(torch.uint8)), name
    assert copier.copies >= result.metrics.num_parts - 1
    assert result.metrics.part_bytes == 64 << 10


def test_ring_bound_is_respected(tmp_path: Path) -> None:
    from loader import sinks

    path = tmp_path / "model.safetensors"
    save_file(tensors(), str(path))
    seen: list[sinks.StagedSink] = []
    original = sinks.StagedSink.__init__

    def spy(self: sinks.StagedSink, *args: object, **kwargs: object) -> None:
        original(self, *args, **kwargs)  # type: ignore[arg-type]
        seen.append(self)

    sinks.StagedSink.__init__ = spy  # type: ignore[method-assign]
    try:
        loader.load(
            str(path),
            options=loader.LoadOptions(concurrency=4, part_bytes=32 << 10, ring_bytes=96 << 10),
            copier=LateCopier(),
        )
    finally:
        sinks.StagedSink.__init__ = original  # type: ignore[method-assign]
    (sink,) = seen
    assert 1 <= sink.max_slots_in_use <= 3  # 96 KiB ring / 32 KiB slots


@pytest.mark.gpu
def test_cuda_load_matches_safetensors(tmp_path: Path) -> None:
    path = tmp_path / "model.safetensors"
    save_file(tensors(), str(path))
    result = loader.load(
        str(path),
        device="cuda",
        options=loader.LoadOptions(part_bytes=64 << 10, ring_bytes=1 << 20),
    )
    for name, t in load_file(str(path)).items():
        got = result.tensors[name]
        assert got.device.type == "cuda"
        assert torch.equal(got.cpu().view(torch.uint8), t.view(torch.uint8)), name
    bf16 = loader.load(str(path), device="cuda", dtype=torch.bfloat16).tensors
    assert bf16["w0"].dtype == torch.bfloat16 and bf16["odd"].dtype == torch.uint8
