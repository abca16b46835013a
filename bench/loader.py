"""Weight loading from S3: this loader vs run:ai Model Streamer, boto3 + safetensors, and the
raw ceiling, on one ≥1 GB checkpoint shaped like a small Llama, served by `rclone serve s3` on
loopback, interleaved in one run.

    .venv/bin/python bench/loader.py            # 5 interleaved rounds; prints a table + JSON
    .venv/bin/python bench/loader.py --rounds 3 --layers 10
    python bench/loader.py --device cuda --shape 8b --rounds 3    # S3 -> GPU memory, 16 GB
    .venv/bin/python bench/loader.py --tiers    # the cache tiers: a miss vs no tiers, the
                                                # fill after it, host and disk hits

With `--device cuda` every contender ends with the tensors in GPU memory: the loader streams
through its pinned ring, run:ai's and safetensors' CPU tensors are copied with `.to(device)`
(as vLLM does with them); the raw ceiling stays a host-memory ceiling (network and server).
The CUDA context is created before the clock starts, for every contender alike.

Every measured load runs in a fresh subprocess (so peak RSS and CPU are its own); the server's
CPU-seconds come from /proc of the rclone process. Needs the `bench` extra
(runai-model-streamer, runai-model-streamer-s3).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from loader import Fused

ROOT = Path(__file__).resolve().parent.parent
# Run as a script, this file's folder is sys.path[0] and `import loader` would import this file.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
sys.path.insert(0, str(ROOT))
BUCKET = "models"
KEY = "bench-llama/model.safetensors"


# --------------------------------------------------------------------------- child side


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


# --------------------------------------------------------------------------- parent side


# (hidden, kv width, MLP, vocab, layers) per shape
SHAPES = {
    "small": (2048, 512, 5632, 32000, 10),  # a small Llama: 10 layers ≈ 1.16 GB
    "8b": (4096, 1024, 14336, 128256, 32),  # Llama-3-8B: ≈ 16.1 GB
}


def make_checkpoint(path: Path, shape: str, layers: int | None) -> int:
    """A Llama-shaped bf16 checkpoint (GQA 4:1) of the given shape."""
    import torch
    from safetensors.torch import save_file

    hidden, kv, mlp, vocab, default_layers = SHAPES[shape]
    layers = default_layers if layers is None else layers
    shapes: dict[str, tuple[int, ...]] = {
        "model.embed_tokens.weight": (vocab, hidden),
        "model.norm.weight": (hidden,),
        "lm_head.weight": (vocab, hidden),
    }
    for i in range(layers):
        p = f"model.layers.{i}."
        shapes |= {
            p + "self_attn.q_proj.weight": (hidden, hidden),
            p + "self_attn.k_proj.weight": (kv, hidden),
            p + "self_attn.v_proj.weight": (kv, hidden),
            p + "self_attn.o_proj.weight": (hidden, hidden),
            p + "mlp.gate_proj.weight": (mlp, hidden),
            p + "mlp.up_proj.weight": (mlp, hidden),
            p + "mlp.down_proj.weight": (hidden, mlp),
            p + "input_layernorm.weight": (hidden,),
            p + "post_attention_layernorm.weight": (hidden,),
        }
    g = torch.Generator().manual_seed(0)
    tensors = {}
    for n, s in shapes.items():
        t = torch.empty(s, dtype=torch.bfloat16)
        # cheap, non-constant content: a random row repeated
        t.view(-1, s[-1])[:] = torch.randn(s[-1], generator=g).bfloat16()
        tensors[n] = t
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path), metadata={"format": "pt"})
    return path.stat().st_size


def run_child(argv: list[str], env: dict[str, str], what: str) -> dict[str, Any]:
    """`python argv` in a fresh process, after the page cache's writeback (no earlier run's
    files are written during this one); its last `RESULT {json}` line, parsed. SystemExit
    naming `what` when it fails."""
    os.sync()
    time.sleep(0.5)
    out = subprocess.run(
        [sys.executable, *argv], env=env, capture_output=True, text=True, timeout=600
    )
    lines = [x for x in out.stdout.splitlines() if x.startswith("RESULT ")]
    if out.returncode != 0 or not lines:
        raise SystemExit(f"{what} failed ({out.returncode}):\n{out.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(lines[-1][len("RESULT ") :])
    return result


def proc_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def contenders(
    concurrency: list[int], target_gbps: float, loader_options: str = ""
) -> dict[str, dict[str, str]]:
    """Each contender's extra environment: the loader at its defaults and with each variant of
    `loader_options` (JSON: label -> LoadOptions fields), run:ai at its defaults and at each
    concurrency."""
    target = {"RUNAI_STREAMER_S3_TARGET_GBPS": f"{target_gbps:g}"} if target_gbps else {}
    variants = json.loads(loader_options or "{}")
    tuned = {f"loader {k}": {"BENCH_LOADER_OPTIONS": json.dumps(v)} for k, v in variants.items()}
    return {
        "loader": {},
        **tuned,
        "runai default": {},
        **{f"runai c={c}": {"RUNAI_STREAMER_CONCURRENCY": str(c), **target} for c in concurrency},
        "boto3 + load_file": {},
        "raw ceiling": {},
    }


CONTENDERS = contenders([1, 2, 4], 1)
KIND = {
    "loader": "loader",
    "boto3 + load_file": "boto3",
    "raw ceiling": "ceiling",
}


def run_one(label: str, s3_env: dict[str, str], size: int, server_pid: int) -> dict[str, float]:
    kind = "loader" if label.startswith("loader") else KIND.get(label, "runai")
    env = {
        **os.environ,
        **s3_env,
        "BENCH_ENV": json.dumps(CONTENDERS[label]),
        "RUNAI_STREAMER_S3_USE_VIRTUAL_ADDRESSING": "0",
        "RUNAI_STREAMER_S3_REQUEST_TIMEOUT_MS": "60000",
        "RUNAI_STREAMER_LOG_LEVEL": "WARNING",
        "AWS_EC2_METADATA_DISABLED": "true",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    s0 = proc_cpu_s(server_pid)  # the server idles through run_child's writeback pause
    r = run_child([__file__, "--child", kind, f"s3://{BUCKET}/{KEY}", str(size)], env, label)
    r["server_cpu_s"] = proc_cpu_s(server_pid) - s0
    return r


def machine() -> str:
    cpu = "?"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    mem_gb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return (
        f"{os.cpu_count()} cores {cpu}, {mem_gb:.0f} GiB RAM, Linux {platform.release()}, "
        f"Python {platform.python_version()}"
    )


def serve_checkpoint(root: Path, args: argparse.Namespace) -> tuple[int, Any, dict[str, str]]:
    """The bench checkpoint behind `rclone serve s3` in `root`: its size, the server, and the
    environment that points a client at it."""
    from control_plane.embedded.processes import free_port, start_s3

    size = make_checkpoint(root / "objects" / BUCKET / KEY, args.shape, args.layers)
    access, secret = "AKBENCH" + secrets.token_hex(8).upper(), secrets.token_urlsafe(24)
    server = start_s3(root / "objects", free_port(), access, secret, root / "rclone.log", (BUCKET,))
    env = {
        "AWS_ENDPOINT_URL": server.extra["url"],
        "AWS_ACCESS_KEY_ID": access,
        "AWS_SECRET_ACCESS_KEY": secret,
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    return size, server, env


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--layers", type=int, default=None, help="layers (default: the shape's)")
    ap.add_argument("--shape", choices=sorted(SHAPES), default="small")
    ap.add_argument("--device", default="cpu", help="where the tensors end: cpu or cuda")
    ap.add_argument(
        "--runai-concurrency", default="1,2,4", help="RUNAI_STREAMER_CONCURRENCY values to try"
    )
    ap.add_argument(
        "--runai-target-gbps",
        type=float,
        default=1.0,
        help="RUNAI_STREAMER_S3_TARGET_GBPS for those (0: run:ai's default)",
    )
    ap.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    ap.add_argument(
        "--loader-options",
        default="",
        help='loader variants, JSON label -> LoadOptions: {"ring 512M": {"ring_bytes": 536870912}}',
    )
    ap.add_argument("--skip", default="", help="contenders to leave out, comma-separated")
    ap.add_argument("--tiers", action="store_true", help="bench the cache tiers instead")
    args = ap.parse_args()
    CONTENDERS.clear()
    CONTENDERS.update(
        contenders(
            [int(c) for c in args.runai_concurrency.split(",") if c],
            args.runai_target_gbps,
            args.loader_options,
        )
    )
    for label in filter(None, args.skip.split(",")):
        CONTENDERS.pop(label.strip(), None)
    if args.child:
        if args.child[0] == "tier":
            tier_child(os.environ["BENCH_SCENARIO"], args.child[1])
        else:
            child(args.child[0], args.child[1], int(args.child[2]))
        return
    if args.tiers:
        tiers_main(args)
        return

    with tempfile.TemporaryDirectory(prefix="bench-loader-") as tmp:
        size, server, s3_env = serve_checkpoint(Path(tmp), args)
        s3_env |= {
            # boto3's download goes to tmpfs when there is one: no disk writeback to skew others
            "BENCH_TMP": "/dev/shm" if os.path.isdir("/dev/shm") else tmp,
            "BENCH_DEVICE": args.device,
        }
        try:
            print(
                f"checkpoint {size / 1e9:.2f} GB -> {args.device}; machine: {machine()}",
                flush=True,
            )
            run_one("raw ceiling", s3_env, size, server.pid)  # warm-up: rclone hashes the file
            results: dict[str, list[dict[str, float]]] = {k: [] for k in CONTENDERS}
            labels = list(CONTENDERS)
            for i in range(args.rounds):
                for label in labels[i % len(labels) :] + labels[: i % len(labels)]:
                    r = run_one(label, s3_env, size, server.pid)
                    results[label].append(r)
                    print(f"  round {i + 1} {label:18s} {r['seconds']:.2f}s", flush=True)
        finally:
            server.stop()

    def med(label: str, key: str) -> float:
        return statistics.median(r[key] for r in results[label])

    print()
    print(f"{'contender':18s} {'median s':>9s} {'GB/s':>6s} {'client cpu-s':>12s} "
          f"{'server cpu-s':>12s} {'peak RSS MB':>11s}")  # fmt: skip
    for label in CONTENDERS:
        s = med(label, "seconds")
        print(
            f"{label:18s} {s:9.2f} {size / s / 1e9:6.2f} {med(label, 'cpu_s'):12.2f} "
            f"{med(label, 'server_cpu_s'):12.2f} {med(label, 'peak_rss_mb'):11.0f}"
        )
    ours = med("loader", "seconds")
    runai = {k: med(k, "seconds") for k in CONTENDERS if k.startswith("runai")}
    summary = {
        "bench": "loader",
        "device": args.device,
        "checkpoint_gb": round(size / 1e9, 2),
        "gbps": round(size / ours / 1e9, 3),
        "vs_runai_best": round(min(runai.values()) / ours, 3),
        "vs_runai_default": round(runai["runai default"] / ours, 3),
        "vs_ceiling": round(med("raw ceiling", "seconds") / ours, 3),
        "peak_extra_rss_mb": round(max(r["extra_rss_mb"] for r in results["loader"]), 1),
    }
    for label in results:
        if label.startswith("loader "):
            summary[f"gbps_{label}"] = round(size / med(label, "seconds") / 1e9, 3)
    print(json.dumps(summary))


TIER_SCENARIOS = ("no tiers", "miss", "host hit", "host hit, fused", "disk hit", "disk hit, fused")


def tiers_main(args: argparse.Namespace) -> None:
    """Interleaved rounds of the tier scenarios, each load in a fresh process (tiers emptied
    before each "miss", the host tier emptied before each disk hit); a table and JSON."""
    import shutil

    with tempfile.TemporaryDirectory(prefix="bench-tiers-") as tmp:
        root = Path(tmp)
        size, server, s3_env = serve_checkpoint(root, args)
        host = Path("/dev/shm" if os.path.isdir("/dev/shm") else tmp) / f"bench-tiers-{os.getpid()}"
        env = {
            **os.environ,
            **s3_env,
            "AWS_EC2_METADATA_DISABLED": "true",
            "BENCH_HOST_TIER": str(host),
            "BENCH_DISK_TIER": str(root / "disk"),
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        }

        def run(scenario: str) -> dict[str, Any]:
            r = run_child(
                [__file__, "--child", "tier", f"s3://{BUCKET}/{KEY}", str(size)],
                {**env, "BENCH_SCENARIO": scenario},
                scenario,
            )
            hit = scenario.split(" ")[0] if "hit" in scenario else None
            if r["tier_hits"] != ({hit: 1} if hit else {}):
                raise SystemExit(f"{scenario}: read from {r['tier_hits'] or 'the origin'}")
            print(f"  {scenario:16s} {r['seconds']:.2f}s  fill {r['fill_s']:.2f}s", flush=True)
            return r

        results: dict[str, list[dict[str, Any]]] = {k: [] for k in TIER_SCENARIOS}
        try:
            print(f"checkpoint {size / 1e9:.2f} GB -> cpu; machine: {machine()}", flush=True)
            run("no tiers")  # warm-up: rclone hashes the file
            for i in range(args.rounds):
                order = list(TIER_SCENARIOS)  # odd rounds: the miss first, then no tiers
                order[:2] = order[:2] if i % 2 == 0 else order[1::-1]
                for scenario in order:
                    if scenario == "miss":
                        shutil.rmtree(host, ignore_errors=True)
                        shutil.rmtree(root / "disk", ignore_errors=True)
                    if scenario.startswith("disk"):
                        for entry in host.glob("*"):
                            entry.unlink()
                    results[scenario].append(run(scenario))
        finally:
            server.stop()
            shutil.rmtree(host, ignore_errors=True)

    def med(scenario: str, key: str) -> float:
        return float(statistics.median(r[key] for r in results[scenario]))

    base = med("no tiers", "seconds")
    print(f"\n{'scenario':16s} {'median s':>9s} {'GB/s':>6s} {'vs no tiers':>11s} {'fill s':>7s}")
    for scenario in TIER_SCENARIOS:
        sec = med(scenario, "seconds")
        fill = med(scenario, "fill_s")
        print(f"{scenario:16s} {sec:9.2f} {size / sec / 1e9:6.2f} {base / sec:11.2f} {fill:7.2f}")
    summary: dict[str, Any] = {"bench": "loader-tiers", "checkpoint_gb": round(size / 1e9, 2)}
    for scenario in TIER_SCENARIOS:
        key = scenario.replace(", ", "_").replace(" ", "_")
        summary[f"gbps_{key}"] = round(size / med(scenario, "seconds") / 1e9, 3)
        summary[f"fill_s_{key}"] = round(med(scenario, "fill_s"), 3)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
