"""Uploading a model into a tenant's namespace: `platform models upload` through the API vs
boto3's `upload_file` straight to the same S3 server (the ceiling), same file, interleaved.

    .venv/bin/python bench/upload.py                 # 1 GiB file, 3 rounds; a table + JSON
    .venv/bin/python bench/upload.py --size-mb 4096 --rounds 5

Starts the embedded platform (`platform up --detach` on a free port, a temporary state dir;
`platform down` at the end), writes one file of random bytes, then each round runs both
contenders in fresh processes (order alternating): the CLI (SDK -> API -> S3 multipart
into `rclone serve s3`) and boto3 `upload_file` (its default TransferConfig: 8 MiB parts,
10 threads; the platform's client settings) to that rclone server. CPU-seconds come from
the child's rusage (the client's, with its peak RSS) and /proc (the API's and rclone's; the
API's peak RSS). The API's upload is read back once at the end and compared with the file.

To measure another version of the code (say, before a change), run from outside the
repository with PYTHONPATH pointing at a copy of it: `python -m control_plane.api` puts the
current directory first on sys.path.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
sys.path.insert(0, str(ROOT))
from bench.loaderbench.checkpoint import machine  # noqa: E402  (the repository root is on sys.path just above)

BIN = Path(sys.executable).parent
PREFIX = "models/bench-upload"  # the API's upload, in the admin tenant's namespace
DIRECT_KEY = "bench-upload/direct.bin"  # boto3's, at the store bucket's top

# boto3 upload_file with the platform's own client settings (storage.s3_client), run as a child.
DIRECT = """
import os, sys, time, boto3
from botocore.config import Config
config = Config(s3={"addressing_style": "path"}, request_checksum_calculation="when_required")
s3 = boto3.client("s3", endpoint_url=os.environ["PLATFORM_S3_ENDPOINT_URL"], config=config)
s3.upload_file(sys.argv[1], sys.argv[2], sys.argv[3])
"""


def proc_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mb(pid: int, field: str = "VmRSS") -> float:
    """The process's resident memory now (VmRSS), or its peak so far (VmHWM)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return 0.0


def write_file(path: Path, size: int) -> None:
    path.parent.mkdir(parents=True)
    with path.open("wb") as f:
        left = size
        while left:
            n = min(left, 64 << 20)
            f.write(os.urandom(n))  # incompressible, like weights
            left -= n


def run_one(cmd: list[str], env: dict[str, str], pids: dict[str, int]) -> dict[str, float]:
    """Run one upload in a child: its wall time, CPU-seconds and peak RSS, and the CPU-seconds
    the API and the S3 server spent meanwhile."""
    os.sync()  # the previous upload's dirty pages are not this one's to write back
    before = {k: proc_cpu_s(p) for k, p in pids.items()}
    with tempfile.TemporaryFile() as log:
        t0 = time.perf_counter()
        child = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(child.pid, 0)  # the child's own rusage
        seconds = time.perf_counter() - t0
        child.returncode = os.waitstatus_to_exitcode(status)
        if child.returncode != 0:
            log.seek(0)
            raise SystemExit(f"{cmd[:3]} failed ({child.returncode}):\n{log.read().decode()}")
    r = {
        "seconds": seconds,
        "client_cpu_s": usage.ru_utime + usage.ru_stime,
        "client_rss_mb": usage.ru_maxrss / 1024,
    }
    r.update({f"{k}_cpu_s": proc_cpu_s(p) - before[k] for k, p in pids.items()})
    return r


def processes_mentioning(text: str, wait_s: float = 10.0) -> list[str]:
    """Live processes whose command line holds `text`, after up to `wait_s` for them to go."""
    deadline = time.monotonic() + wait_s
    while True:
        found = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit() and int(entry.name) != os.getpid():
                try:
                    cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
                    zombie = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
                except OSError:
                    continue
                if text in cmdline and not zombie:
                    found.append(f"{entry.name}: {cmdline}")
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.2)


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(8 << 20):
            h.update(block)
    return h.hexdigest()


def check_stored(state: dict[str, Any], path: str, want: str) -> None:
    """The tenant's file at `path` reads back as the uploaded file (sha256)."""
    import boto3
    from botocore.config import Config

    s3 = boto3.client(
        "s3",
        endpoint_url=state["s3_endpoint_url"],
        aws_access_key_id=state["s3_access_key_id"],
        aws_secret_access_key=state["s3_secret_access_key"],
        region_name="us-east-1",
        config=Config(s3={"addressing_style": "path"}),
    )
    bucket = state["store_bucket"]
    listed = s3.list_objects_v2(Bucket=bucket, Prefix="tenants/").get("Contents", [])
    [key] = [o["Key"] for o in listed if o["Key"].endswith("/" + path)]  # tenants/<id>/<path>
    h = hashlib.sha256()
    for block in s3.get_object(Bucket=bucket, Key=key)["Body"].iter_chunks(8 << 20):
        h.update(block)
    if h.hexdigest() != want:
        raise SystemExit(f"{path} differs from the uploaded file")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--size-mb", type=int, default=1024, help="file size in MiB (default 1024)")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()

    from control_plane.embedded.processes import free_port
    from control_plane.settings import Settings

    results: dict[str, list[dict[str, float]]] = {"platform models upload": [], "boto3 direct": []}
    with tempfile.TemporaryDirectory(prefix="bench-upload-") as tmp:
        state_dir, model = Path(tmp) / "state", Path(tmp) / "model"
        size = args.size_mb << 20
        write_file(model / "model.safetensors", size)
        env = {**os.environ, "PLATFORM_STATE_DIR": str(state_dir)}
        port = str(free_port())
        command = ["up", "--detach", "--port", port, "--state-dir", str(state_dir)]
        up = subprocess.run(
            [str(BIN / "platform"), *command], env=env, capture_output=True, text=True, timeout=180
        )
        if up.returncode != 0:
            raise SystemExit(f"platform up failed:\n{up.stdout}\n{up.stderr}")
        try:
            state = json.loads((state_dir / "platform.json").read_text())
            default_bucket = Settings.model_fields["store_bucket"].default
            state["store_bucket"] = os.environ.get("PLATFORM_STORE_BUCKET", default_bucket)
            env.update(
                PLATFORM_URL=state["url"],
                PLATFORM_API_KEY=state["api_key"],
                PLATFORM_S3_ENDPOINT_URL=state["s3_endpoint_url"],
                AWS_ACCESS_KEY_ID=state["s3_access_key_id"],
                AWS_SECRET_ACCESS_KEY=state["s3_secret_access_key"],
                AWS_DEFAULT_REGION="us-east-1",
            )
            pids = {"api": state["children"]["api"], "s3": state["children"]["s3"]}
            commands = {
                "platform models upload": [
                    str(BIN / "platform"), "models", "upload", str(model), PREFIX + "/",
                ],
                "boto3 direct": [
                    sys.executable, "-c", DIRECT, str(model / "model.safetensors"),
                    state["store_bucket"], DIRECT_KEY,
                ],
            }  # fmt: skip
            print(f"file {size / 1e9:.2f} GB; machine: {machine()}", flush=True)
            labels = list(commands)
            api_idle_mb = rss_mb(pids["api"])
            for i in range(args.rounds):
                for label in labels[i % 2 :] + labels[: i % 2]:
                    r = run_one(commands[label], env, pids)
                    results[label].append(r)
                    print(f"  round {i + 1} {label:24s} {r['seconds']:6.2f}s", flush=True)
            api_rss_mb = rss_mb(pids["api"], "VmHWM")  # only the API path goes through it
            check_stored(
                state, f"{PREFIX}/model.safetensors", sha256_file(model / "model.safetensors")
            )
        finally:
            down = subprocess.run(
                [str(BIN / "platform"), "down", "--state-dir", str(state_dir)],
                env=env, capture_output=True, text=True, timeout=180,
            )  # fmt: skip
            if down.returncode != 0:
                print(f"platform down failed:\n{down.stdout}\n{down.stderr}", file=sys.stderr)
            if left := processes_mentioning(str(state_dir)):
                print(f"processes left behind: {left}", file=sys.stderr)

    def med(label: str, key: str) -> float:
        return statistics.median(r[key] for r in results[label])

    print()
    print(f"{'contender':24s} {'median s':>9s} {'MB/s':>6s} {'vs boto3':>8s} "
          f"{'client cpu-s':>12s} {'api cpu-s':>9s} {'s3 cpu-s':>8s} "
          f"{'client RSS MB':>13s}")  # fmt: skip
    ceiling = med("boto3 direct", "seconds")
    for label in results:
        s = med(label, "seconds")
        print(
            f"{label:24s} {s:9.2f} {size / s / 1e6:6.0f} {ceiling / s:8.2f} "
            f"{med(label, 'client_cpu_s'):12.2f} {med(label, 'api_cpu_s'):9.2f} "
            f"{med(label, 's3_cpu_s'):8.2f} {max(r['client_rss_mb'] for r in results[label]):13.0f}"
        )
    print(f"API process RSS: {api_idle_mb:.0f} MB before the uploads, {api_rss_mb:.0f} MB at peak")
    ours = med("platform models upload", "seconds")
    summary = {
        "bench": "upload",
        "size_bytes": size,
        "rounds": args.rounds,
        "api_s": round(ours, 2),
        "boto3_s": round(ceiling, 2),
        "api_mb_s": round(size / ours / 1e6, 1),
        "boto3_mb_s": round(size / ceiling / 1e6, 1),
        "vs_ceiling": round(ceiling / ours, 3),
        "client_peak_rss_mb": round(max(r["client_rss_mb"] for r in results[labels[0]])),
        "api_peak_rss_mb": round(api_rss_mb),
        "api_idle_rss_mb": round(api_idle_mb),
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
