"""The child side: one measured load in a fresh process (this loader, run:ai Model Streamer,
boto3 + safetensors, or the raw ceiling; or one load through the cache tiers), run as
`bench/loader.py --child ...`; each prints one `RESULT {json}` line."""

from __future__ import annotations

import json
import os
import resource
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from loader import Fused

from bench.loaderbench.checkpoint import BUCKET, KEY


def _rss_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def _cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def child(name: str, uri: str, size: int) -> None:
    """Run one load; print one JSON line."""
    import torch  # (import cost is not measured)

    device = torch.device(os.environ.get("BENCH_DEVICE", "cpu"))
    if device.type == "cuda":
        torch.zeros(1, device=device)  # the CUDA context, outside the clock

    extra_env = json.loads(os.environ.get("BENCH_ENV", "{}"))
    os.environ.update(extra_env)
    if name.startswith("runai"):
        import runai_model_streamer  # noqa: F401
    import boto3  # noqa: F401
    import safetensors.torch  # noqa: F401

    import loader

    base_rss = _rss_kb("VmRSS")
    cpu0, t0 = _cpu_s(), time.perf_counter()
    dest_bytes = 0
    if name == "loader":
        options = loader.LoadOptions(**json.loads(os.environ.get("BENCH_LOADER_OPTIONS", "{}")))
        result = loader.load(uri, device=device, options=options)
        dest_bytes = sum(t.numel() * t.element_size() for t in result.tensors.values())
    elif name.startswith("runai"):
        from runai_model_streamer import SafetensorsStreamer

        tensors = {}
        with SafetensorsStreamer() as streamer:
            streamer.stream_file(uri)
            for tname, tensor in streamer.get_tensors():
                tensors[tname] = tensor.to(device)
        dest_bytes = sum(t.numel() * t.element_size() for t in tensors.values())
    elif name == "boto3":
        from safetensors.torch import load_file

        from loader.s3 import s3_client

        with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_TMP")) as d:
            path = os.path.join(d, "model.safetensors")
            s3_client().download_file(BUCKET, KEY, path)
            tensors = load_file(path, device=str(device))
            dest_bytes = sum(t.numel() * t.element_size() for t in tensors.values())
    elif name == "ceiling":
        default = loader.LoadOptions().resolved_concurrency()  # the loader's: 4 on 2 cores
        dest_bytes = raw_ceiling(size, int(os.environ.get("BENCH_CONCURRENCY", default)))
    else:
        raise SystemExit(f"unknown contender {name}")
    if device.type == "cuda":
        torch.cuda.synchronize()
        if name != "ceiling":
            dest_bytes = 0  # in GPU memory: not part of the RSS
    seconds = time.perf_counter() - t0
    out = {
        "name": name,
        "seconds": seconds,
        "cpu_s": _cpu_s() - cpu0,
        "peak_rss_mb": _rss_kb("VmHWM") / 1024,
        "extra_rss_mb": (_rss_kb("VmHWM") - base_rss) / 1024 - dest_bytes / 2**20,
        "bytes": size,
    }
    print("RESULT " + json.dumps(out), flush=True)


def tier_child(scenario: str, uri: str) -> None:
    """One load through the cache tiers (BENCH_HOST_TIER, BENCH_DISK_TIER); then, timed
    apart, its `fill_tiers()`. Prints one JSON line."""
    import boto3  # noqa: F401  (import costs are not measured)
    import torch  # noqa: F401

    import loader

    options = loader.LoadOptions()
    if scenario != "no tiers":
        options = loader.LoadOptions(
            cache_dir=os.environ["BENCH_DISK_TIER"],
            cache_max_bytes=64 << 30,
            host_cache_dir=os.environ["BENCH_HOST_TIER"],
            host_cache_max_bytes=64 << 30,
        )
    name_map = fused_name_map if scenario.endswith("fused") else None
    t0 = time.perf_counter()
    result = loader.load(uri, options=options, name_map=name_map)
    seconds = time.perf_counter() - t0
    t1 = time.perf_counter()
    filled = result.fill_tiers().filled
    fill_s = time.perf_counter() - t1 if filled else 0.0
    out = {"seconds": seconds, "fill_s": fill_s, "tier_hits": result.metrics.tier_hits}
    print("RESULT " + json.dumps(out), flush=True)


def fused_name_map(name: str) -> str | Fused:
    """As the worker loads (worker.model.weights.load_name_map): q/k/v and gate/up fused."""
    import loader

    members = {"q_proj": ("qkv", 0), "k_proj": ("qkv", 1), "v_proj": ("qkv", 2)}
    members |= {"gate_proj": ("gate_up", 0), "up_proj": ("gate_up", 1)}
    prefix, _, rest = name.rpartition(".")[0].rpartition(".")
    if rest in members:
        target, index = members[rest]
        return loader.Fused(f"{prefix}.{target}_proj.weight", index)
    return name


def raw_ceiling(size: int, concurrency: int) -> int:
    """Concurrent ranged GETs into one preallocated buffer: signing + receive, no parsing."""
    import queue
    import threading

    import torch

    from loader.options import S3Options
    from loader.s3 import S3Endpoint, S3Source

    src = S3Source(f"s3://{BUCKET}/{KEY}", S3Endpoint.resolve(S3Options()))
    # Allocated, not touched, by torch's allocator like the loader's arena (it backs large
    # blocks with transparent huge pages: numpy's malloc'd buffer costs 2-3x the CPU here).
    buf = torch.empty(size, dtype=torch.uint8)
    view = memoryview(buf.numpy())  # type: ignore[arg-type]  # an ndarray is a buffer
    part = int(os.environ.get("BENCH_PART_BYTES", str(8 << 20)))
    work: queue.Queue[int] = queue.Queue()
    for start in range(0, size, part):
        work.put(start)

    def run() -> None:
        while True:
            try:
                start = work.get_nowait()
            except queue.Empty:
                return
            end = min(start + part, size)
            _, body = src.open_range(start, end, None, 60.0)
            body.readinto(view[start:end])
            body.close()

    threads = [threading.Thread(target=run) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return size
