"""`python -m loader URI [--device cpu]`: load a checkpoint with a progress bar, print metrics.

    python -m loader s3://models/llama-3.2-1b/
    python -m loader hf://Qwen/Qwen2.5-0.5B --device cuda --json

Exit codes: 0 loaded, 2 bad arguments, 3 a LoaderError (the message says what to fix).
"""

from __future__ import annotations

import argparse
import json
import sys

from loader import LoaderError, LoadOptions, Progress, load


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m loader",
        description="Load a safetensors checkpoint (s3://, hf://, file:// or a path) and "
        "report how fast it loaded.",
        epilog="example: python -m loader s3://models/demo/ --device cpu",
    )
    ap.add_argument("uri", help="a .safetensors object, an index .json, or a directory/prefix")
    ap.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, ... (default: cpu)")
    ap.add_argument("--concurrency", type=int, default=None, help="concurrent ranged GETs")
    ap.add_argument(
        "--cache-dir", default=None, help="local cache tier directory (filled after the load)"
    )
    ap.add_argument("--json", action="store_true", help="print the metrics as one JSON object")
    args = ap.parse_args(argv)

    from rich.console import Console
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        TextColumn,
        TimeElapsedColumn,
        TransferSpeedColumn,
    )
    from rich.progress import (
        Progress as Bar,
    )

    console = Console(stderr=True)
    options = LoadOptions(concurrency=args.concurrency, cache_dir=args.cache_dir)
    with Bar(
        TextColumn("{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TextColumn("{task.fields[tensors]}"),
        TimeElapsedColumn(),
        console=console,
        disable=args.json,
    ) as bar:
        task = bar.add_task("header", total=None, tensors="")

        def on_progress(p: Progress) -> None:
            bar.update(
                task,
                description=p.phase,
                completed=p.bytes_done,
                total=p.bytes_total,
                tensors=f"{p.tensors_ready}/{p.tensors_total} tensors",
            )

        try:
            result = load(args.uri, device=args.device, on_progress=on_progress, options=options)
        except LoaderError as exc:
            console.print(f"[red]error:[/red] {exc}")
            return 3
    fill = result.fill_tiers()  # the cache tier, once the load is measured
    m = result.metrics
    report = {
        "uri": m.uri,
        "device": m.device,
        "tensors": len(result.tensors),
        "objects": m.num_objects,
        "bytes": m.bytes_total,
        "seconds": round(m.seconds, 3),
        "gbps": round(m.gbps, 3),
        "phases_s": {k: round(v, 3) for k, v in m.phases_s.items()},
        "parts": m.num_parts,
        "part_bytes": m.part_bytes,
        "concurrency": m.concurrency,
        "retries": m.num_retries,
        "cache_hits": m.cache_hits,
        "cache_filled": len(fill.filled),
        "cache_fill_s": round(fill.seconds, 3),
        "cache_fill_failed": fill.failed,
    }
    if args.json:
        print(json.dumps(report))
    else:
        phases = ", ".join(f"{k} {v:.2f}s" for k, v in m.phases_s.items())
        print(
            f"loaded {len(result.tensors)} tensors, {m.bytes_total / 1e9:.3f} GB from "
            f"{m.num_objects} object(s) to {m.device} in {m.seconds:.2f}s ({m.gbps:.2f} GB/s)\n"
            f"phases: {phases}\n"
            f"{m.num_parts} parts of {m.part_bytes >> 10} KiB, {m.concurrency} concurrent, "
            f"{m.num_retries} retries, {m.cache_hits} cache hits"
        )
        if fill.filled:
            print(f"cache: {len(fill.filled)} entries written in {fill.seconds:.2f}s")
        for uri, reason in fill.failed.items():
            print(f"cache: {uri} not cached: {reason}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
