"""The bench's command line: build the models, run each group of scenarios on its own
`platform up` (the scenarios without a pool on one with PLATFORM_WARM_POOL_MAX=0, those with
one on another), then print the tables, the targets and the JSON line."""

from __future__ import annotations

import argparse
import contextlib
import json
import secrets
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from bench.coldstart.driver import Platform, Uploaded
from bench.coldstart.models import Model, build_models
from bench.coldstart.phases import PHASES
from bench.coldstart.report import (
    Round,
    first_token_s,
    load_table,
    median,
    summarize,
    table,
    target_lines,
)
from bench.coldstart.rounds import cold_round, stream_child, weight_stream
from bench.coldstart.scenarios import SCENARIOS, Scenario, by_platform, tier_env
from bench.coldstart.worker_log import TIER_NAMES
from bench.loaderbench.checkpoint import machine

ROOT = Path(__file__).resolve().parents[2]
VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"


def parse_args(description: str) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=description, formatter_class=argparse.RawTextHelpFormatter
    )
    ap.add_argument("--rounds", type=int, default=3, help="timed requests per scenario and model")
    ap.add_argument("--skip-big", action="store_true", help="the demo model only")
    ap.add_argument(
        "--scenarios",
        default=",".join(s.key for s in SCENARIOS),
        help="which to run, comma-separated (default: all): " + ", ".join(s.key for s in SCENARIOS),
    )
    ap.add_argument("--state-dir", type=Path, help="the platforms' state (default: a temp dir)")
    ap.add_argument("--model-dir", type=Path, help="build models here and keep them (reused)")
    ap.add_argument(
        "--upload",
        choices=("s3", "api"),
        default="s3",
        help="big weights straight into the namespace (s3) or via the API",
    )
    ap.add_argument(
        "--tiers",
        default="host,disk",
        help="weight-cache tiers the workers have (comma-separated; '' for none)",
    )
    ap.add_argument(
        "--engines",
        default="builtin,vllm" if VLLM_PYTHON.exists() else "builtin",
        help="engines the big model is deployed on (vllm needs `make vllm-venv`)",
    )
    ap.add_argument("--child-stream", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.engines = tuple(e for e in args.engines.split(",") if e)
    if set(args.engines) - {"builtin", "vllm"} or "builtin" not in args.engines:
        ap.error("--engines: builtin, optionally with vllm")
    if "vllm" in args.engines and not VLLM_PYTHON.exists():
        ap.error(f"--engines vllm: no vLLM environment at {VLLM_PYTHON} (`make vllm-venv`)")
    args.tiers = [t for t in args.tiers.split(",") if t]
    if set(args.tiers) - set(TIER_NAMES):
        ap.error(f"--tiers: choose from {sorted(TIER_NAMES)}")
    args.scenarios = [k for k in args.scenarios.split(",") if k]
    if set(args.scenarios) - {s.key for s in SCENARIOS}:
        ap.error(f"--scenarios: choose from {[s.key for s in SCENARIOS]}")
    return args


def run_on_platform(
    group: list[Scenario], models: list[Model], args: argparse.Namespace, state_dir: Path
) -> tuple[list[Round], list[float]]:
    """One `platform up` for `group` (same settings): upload the models, read the big one once
    (untimed), then per round every scenario of the group for every model, and the loader
    alone once; `platform down`."""
    env_line = " ".join(f"{k}={v}" for k, v in group[0].platform_env.items())
    print(f"platform up ({env_line}): {', '.join(s.key for s in group)}", flush=True)
    rounds: list[Round] = []
    streams: list[float] = []
    with contextlib.ExitStack() as stack:
        shm = Path("/dev/shm")  # the host tier belongs on a tmpfs
        dirs = {
            "host": (shm if shm.is_dir() else state_dir)
            / f"bench-cold-start-{secrets.token_hex(4)}",
            "disk": state_dir / "weights-cache",
        }
        cache_dirs = {t: d for t, d in dirs.items() if t in args.tiers}
        stack.callback(shutil.rmtree, dirs["host"], True)  # after `platform down`
        vllm = {"PLATFORM_VLLM_PYTHON": str(VLLM_PYTHON) if "vllm" in args.engines else ""}
        p = Platform(state_dir, tier_env(cache_dirs) | group[0].platform_env | vllm, cache_dirs)
        stack.callback(p.close)
        uploaded: dict[str, Uploaded] = {}
        for m in models:
            same = next((o for o in models if o.path == m.path and o.key in uploaded), None)
            if same is not None:  # the same checkpoint on another engine: the same objects
                uploaded[m.key] = uploaded[same.key]
                continue
            mode = args.upload if m.key == "big" else "api"
            t0 = time.monotonic()
            uploaded[m.key] = p.upload(m, mode)
            print(f"  uploaded {m.key} ({mode}) in {time.monotonic() - t0:.1f}s", flush=True)
        if "big" in uploaded:
            # Untimed: the first read of a freshly uploaded object is slow (the store's first
            # pass over it: ~2x here, on the request and the loader alone alike); without this
            # it falls on whichever scenario comes first in round 1.
            print(f"  primed: loader alone {weight_stream(p, uploaded['big']):.2f}s", flush=True)
        for i in range(1, args.rounds + 1):
            for m in models:
                for s in group:
                    r = cold_round(p, m, uploaded[m.key], s, i)
                    rounds.append(r)
                    ph = " ".join(f"{k} {r.phases_s[k]:.2f}" for k in PHASES)
                    if r.engine_ttft_s is not None:  # the part of `token` inside the engine
                        ph += f" [engine ttft {r.engine_ttft_s:.2f}]"
                    print(
                        f"  round {i} {s.key:12s} {m.key:4s} first token "
                        f"{r.phases_s['total']:.2f}s ({ph}; {r.tier}; placement {r.placement}; "
                        f"starting {'>'.join(r.starting) or '-'}; first event {r.first_event})",
                        flush=True,
                    )
            if "big" in uploaded:
                p.wait_no_workers()
                streams.append(weight_stream(p, uploaded["big"]))
                print(f"  round {i} loader alone {streams[-1]:.2f}s", flush=True)
    return rounds, streams


def git_revision() -> str:
    """The commit, and which files differ from it (read-only git)."""

    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)
        return done.stdout if done.returncode == 0 else ""

    head = git("rev-parse", "--short", "HEAD").strip() or "unknown"
    # "XY path" lines (a rename: "XY old -> new")
    changed = sorted({line[3:] for line in git("status", "--short").splitlines() if line})
    if not changed:
        return head
    if len(changed) <= 8:
        return f"{head} with uncommitted changes in {', '.join(changed)}"
    tops: dict[str, int] = {}
    for path in changed:
        top = path.split("/", 1)[0]
        tops[top] = tops.get(top, 0) + 1
    where = ", ".join(f"{top}/ {n}" for top, n in sorted(tops.items()))
    return f"{head} with uncommitted changes in {len(changed)} paths ({where})"


def main(description: str) -> None:
    args = parse_args(description)
    if args.child_stream:
        stream_child(*args.child_stream)
        return
    na = {
        s.key: f"n/a ({s.needs_tier} tier off)"
        for s in SCENARIOS
        if s.needs_tier and s.needs_tier not in args.tiers
    }
    active = [s for s in SCENARIOS if s.key in args.scenarios and s.key not in na]
    revision = git_revision()  # again at the end: the tree may change under a long run
    rounds: list[Round] = []
    streams: list[float] = []
    with tempfile.TemporaryDirectory(prefix="bench-cold-start-") as tmp:
        root = (args.state_dir or Path(tmp) / "state").resolve()
        work = args.model_dir or Path(tmp) / "models"
        work.mkdir(parents=True, exist_ok=True)
        t0 = time.monotonic()
        models = build_models(work, args.skip_big, args.engines)
        print(
            f"models ready in {time.monotonic() - t0:.1f}s: "
            + ", ".join(f"{m.key} {m.size_bytes / 1e9:.3f} GB" for m in models),
            flush=True,
        )
        for group in by_platform(active):
            state_dir = root / ("pool" if group[0].pool else "no-pool")
            got, stream = run_on_platform(group, models, args, state_dir)
            rounds += got
            streams += stream

    keys = [m.key for m in models]
    headline = "big" if "big" in keys else "demo"
    stream_s = median(streams)
    print(f"\nmachine: {machine()}; commit {revision}")
    if (now := git_revision()) != revision:
        print(f"NOTE: the tree changed during the run; at its end: commit {now}")
    print(
        f"{args.rounds} rounds, medians; models: "
        + ", ".join(f"{m.key} {m.size_bytes / 1e9:.3f} GB" for m in models)
        + "\n"
    )
    print("\n".join(table(SCENARIOS, keys, rounds, na, stream_s)))
    if any(r.first_event != "output" for r in rounds):
        print("* some rounds saw no output event: first token = the terminal event")
    print()
    print("\n".join(load_table(active, keys, rounds, stream_s)))
    print()
    print("\n".join(target_lines(SCENARIOS, rounds, stream_s, headline)))
    edge = median(r.edge_read_s for r in rounds if r.model == headline)
    ttft = median(r.engine_ttft_s for r in rounds if (r.model, r.scenario) == (headline, "no_pool"))
    extra = {
        "first_call_edge_read_s": None if edge is None else round(edge, 3),
        "engine_ttft_s": None if ttft is None else round(ttft, 3),
        "rounds": args.rounds,
        "tiers": args.tiers,
        "upload": args.upload,
    }
    if "big-vllm" in keys:  # the same checkpoint on vLLM: its first token per scenario
        extra["vllm_first_token_s"] = {
            s.key: _round(first_token_s(rounds, s.key, "big-vllm")) for s in active
        }
    print(json.dumps(summarize(SCENARIOS, rounds, streams, headline, extra)))


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 3)
