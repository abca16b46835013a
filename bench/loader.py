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
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Run as a script, this file's folder is sys.path[0] and `import loader` would import this file.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
sys.path.insert(0, str(ROOT))

from bench.loaderbench.checkpoint import SHAPES, machine, serve_checkpoint  # noqa: E402
from bench.loaderbench.children import child, tier_child  # noqa: E402
from bench.loaderbench.contenders import CONTENDERS, contenders, run_one  # noqa: E402
from bench.loaderbench.tiers import tiers_main  # noqa: E402


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


if __name__ == "__main__":
    main()
