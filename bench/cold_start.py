"""Cold start on the embedded platform: a request at zero workers, timed to its first token and
broken into the phases it waited through, next to the loader alone streaming the same weights.

    .venv/bin/python bench/cold_start.py                  # 3 rounds, demo + 1.16 GB model
    .venv/bin/python bench/cold_start.py --skip-big --rounds 1     # demo model only, ~1 minute
    .venv/bin/python bench/cold_start.py --model-dir /tmp/cs-models   # keep (and reuse) models

Scenarios (rows), each a fresh deployment (min 0, max 1, cpu) per round, deleted after its
request and drained before the next round (the next request meets zero workers of a
deployment with no arrival history, so no keep-alive or pre-warm can hide the boot). The
workers have both weight-cache tiers (`--tiers`, default host,disk: a host-memory tier on
/dev/shm in front of the local disk tier, as DESIGN §3 has them); a load writes through to
them, and each scenario empties the tiers faster than the one it measures:
- (a) no pool: a new worker process boots; weights from object storage (tiers emptied);
- (a) no pool, disk-cache hit: the same, host tier emptied, after an (a) round;
- (a) no pool, host-memory hit: the same, right after the disk round refilled host memory;
- (b) warm pool, object storage; (c) warm pool, host-memory hit: not built yet, printed
  "n/a (not built)" and null in the JSON line. To add one: give its `Scenario` a `prepare`
  (e.g. wait until a pool worker is idle) and its `platform_env`, and set `built`.

Models: the demo model (`platform models create-demo`) and a 1.16 GB bf16 Llama-shaped
checkpoint (`bench/loader.py`'s "small" shape: hidden 2048, 32 heads of 64, 8 KV heads, MLP
5632, vocab 32000, 10 layers, untied head) with the demo's tokenizer. Its weights are random
rows repeated, so every logit ties and greedy decoding picks a special token whose text is
empty, and the worker streams no `output` event for empty text: `lm_head` is rewritten to
zero rows but two ordinary tokens (+row, -row), so the first token is a visible one. Same
bytes to stream, same compute.

Columns, and where each comes from (all times are this machine's wall clock, so the client's,
the API's and the worker's timestamps compare):
- total: client, request sent -> first `output` SSE event received (`POST .../run`,
  stream=true). Equals the sum of the six phases; each phase column is its own median.
- accept: request sent -> `created_at` of `GET /v1/jobs/{id}` (the API stored the job). The
  API reads a deployment's tokenizer on its first call and keeps it; every round's deployment
  is new, so a refused call reads it first, as for a deployment called before it scaled to
  zero (`first_call_edge_read_s` in the JSON line: what a first call pays on top).
- queue: job created -> the worker's `boot` billing record starts (`GET /v1/billing/records`
  ?worker_id=): the reconciler decided to start a worker.
- boot: the `boot` record: process start, imports, until the worker reports `loading`.
- load: the `load` record (loading -> warming): config and tokenizer reads, weight streaming,
  model build and the engine's KV cache. The worker's log line "loaded N tensors (...)" in
  STATE/logs/workers/<id>.log splits it (files / header / fetch / build) and names the tier
  ("N cache hits {'host': 1}"; no hits: object storage); the rest of `load` is the engine.
- warm: the `warm` record (warming -> idle): one short generation.
- token: worker idle -> first `output` event at the client: delivery, claim, prefill, the
  first decode step and the event's way through Redis and the API.
The worker's `running` event names the worker; a pre-booted worker (a pool) reads as boot 0.
weight_stream_s: the loader alone (`loader.load("s3://...")`, default options, no tiers), in a
fresh process, streaming the same object from the same store, once per round.

Big weights go into the tenant's namespace straight through S3 (`--upload s3`, the default;
where `store://x/` lives is found from a marker file put through the API), since uploading
1.16 GB through the API is slow for now; `--upload api` uses `platform models upload`.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import importlib
import json
import os
import re
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

ROOT = Path(__file__).resolve().parent.parent
# Run as a script, this file's folder is sys.path[0] and `import loader` would import
# bench/loader.py instead of the loader package.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
sys.path.insert(0, str(ROOT))

if TYPE_CHECKING:
    import httpx
    from mypy_boto3_s3 import S3Client

PHASES = ("accept", "queue", "boot", "load", "warm", "token")
TERMINAL = frozenset({"completed", "failed", "canceled", "expired", "timed_out"})
# The summary line's keys (the issue's), first and in this order; extra keys follow.
REQUIRED_KEYS = (
    "first_token_s",
    "first_token_s_warm_pool",
    "first_token_s_host_tier",
    "weight_stream_s",
)
HOST_CACHE_BYTES = 4 << 30  # room for both models
PROMPT = "The weather changed in the afternoon."  # never logged, nor the output
MAX_TOKENS = 8
STORE_BUCKET = os.environ.get("PLATFORM_STORE_BUCKET", "platform-store")  # the platform's


# --------------------------------------------------------------------------- pure helpers


@dataclass(frozen=True, slots=True)
class Timeline:
    """The moments one cold request passed through (unix seconds, one machine's clock)."""

    sent: float  # client: the request left
    accepted: float  # job.created_at: the API stored it
    start_decided: float  # the worker's boot record starts: the reconciler started a worker
    loading: float  # boot record ends: the worker reported `loading`
    warming: float  # load record ends
    ready: float  # warm record ends: the worker is idle
    first_token: float  # client: the first `output` event arrived


def parse_iso(text: str) -> float:
    """Unix seconds of an API timestamp ("2026-01-02T03:04:05.123456Z")."""
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def timeline(
    sent: float, job: Mapping[str, Any], records: Iterable[Mapping[str, Any]], first_token: float
) -> Timeline:
    """The timeline from the job (`GET /v1/jobs/{id}`) and its worker's billing records;
    ValueError when the worker's boot, load or warm record is missing."""
    by_phase: dict[str, Mapping[str, Any]] = {}
    for r in records:
        by_phase.setdefault(str(r["phase"]), r)  # the first segment of each phase
    missing = [p for p in ("boot", "load", "warm") if p not in by_phase]
    if missing:
        raise ValueError(f"no {', '.join(missing)} billing record for the worker")
    return Timeline(
        sent=sent,
        accepted=parse_iso(job["created_at"]),
        start_decided=parse_iso(by_phase["boot"]["start"]),
        loading=parse_iso(by_phase["boot"]["end"]),
        warming=parse_iso(by_phase["load"]["end"]),
        ready=parse_iso(by_phase["warm"]["end"]),
        first_token=first_token,
    )


def phases(t: Timeline) -> dict[str, float]:
    """Seconds per phase (PHASES) and `total`. Each moment is taken no earlier than the one
    before it, so the phases add up to the total and a worker that was up before the request
    (a pool) shows 0 for what it had done already."""
    moments = [t.sent, t.accepted, t.start_decided, t.loading, t.warming, t.ready, t.first_token]
    for i in range(1, len(moments)):
        moments[i] = max(moments[i], moments[i - 1])
    out = {name: moments[i + 1] - moments[i] for i, name in enumerate(PHASES)}
    out["total"] = moments[-1] - moments[0]
    return out


@dataclass(frozen=True, slots=True)
class LoadLog:
    """The worker's "loaded N tensors (...)" line; None where the line lacks a field."""

    tensors: int
    bytes_total: int
    objects: int
    seconds: float  # load_model() in all: files + weights + build
    files_s: float | None  # config.json, tokenizer.json, generation_config.json
    weights_s: float | None  # loader.load()
    gbps: float | None
    header_s: float | None
    fetch_s: float | None
    build_s: float | None  # the model object around the loaded tensors
    cache_hits: int | None  # objects read from a cache tier
    tier_hits: dict[str, int] = field(default_factory=dict)  # of those, per tier (host, disk)

    @property
    def tier(self) -> str:
        """Where the weights came from: "object storage", "disk cache", "host memory", or
        several joined by "+"."""
        if self.cache_hits is None:
            return "?"
        # a line without the per-tier split predates the host tier: its hits are the disk's
        hits = self.tier_hits or ({"disk": self.cache_hits} if self.cache_hits else {})
        names = [TIER_NAMES.get(t, t) for t, n in sorted(hits.items()) if n]
        if sum(hits.values()) < self.objects:
            names.append("object storage")
        return "+".join(names)


TIER_NAMES = {"host": "host memory", "disk": "disk cache"}  # the loader's tier names
LOG_FIELDS = ("files_s", "header_s", "fetch_s", "gbps", "build_s")  # the load table's
_LOADED = re.compile(r"loaded (\d+) tensors \((\d+) bytes, (\d+) objects\) in ([\d.]+)s")


def parse_load_log(text: str) -> LoadLog | None:
    """The last "loaded N tensors" line of a worker log; None when there is none."""
    lines = [line for line in text.splitlines() if _LOADED.search(line)]
    if not lines:
        return None
    line = lines[-1]
    m = _LOADED.search(line)
    assert m is not None

    def num(pattern: str) -> float | None:
        found = re.search(pattern, line)
        return float(found.group(1)) if found else None

    hits = num(r"(\d+) cache hits")
    per_tier = re.search(r"cache hits (\{[^}]*\})", line)
    tier_hits = ast.literal_eval(per_tier.group(1)) if per_tier else {}
    return LoadLog(
        tensors=int(m.group(1)),
        bytes_total=int(m.group(2)),
        objects=int(m.group(3)),
        seconds=float(m.group(4)),
        files_s=num(r"files ([\d.]+)s"),
        weights_s=num(r"weights ([\d.]+)s"),
        gbps=num(r"at ([\d.]+) GB/s"),
        header_s=num(r"header ([\d.]+)s"),
        fetch_s=num(r"fetch ([\d.]+)s"),
        build_s=num(r"build ([\d.]+)s"),
        cache_hits=None if hits is None else int(hits),
        tier_hits={str(k): int(v) for k, v in tier_hits.items()},
    )


def sse_events(lines: Iterable[str]) -> Iterator[tuple[str, str]]:
    """(event, data) of a server-sent event stream; comments (keep-alives) are skipped."""
    event, data = "message", list[str]()
    for line in lines:
        if not line:
            if data:
                yield event, "\n".join(data)
            event, data = "message", list[str]()
        elif line.startswith(":"):
            continue
        elif line.startswith("event:"):
            event = line[len("event:") :].strip()
        elif line.startswith("data:"):
            data.append(line[len("data:") :].removeprefix(" "))
    if data:
        yield event, "\n".join(data)


@dataclass(frozen=True, slots=True)
class Scenario:
    """One way a request meets zero workers of its deployment (a row of the table)."""

    key: str  # short name, used in deployment names
    label: str  # the table's row label
    json_key: str  # the summary key of the big model's median first token
    built: bool  # False: the platform lacks it; "n/a (not built)", null in the JSON line
    # Before the timed request, with the deployment created and no worker running.
    prepare: Callable[[Platform], None] | None = None
    # Settings it needs at `platform up` (besides the cache tiers': tier_env()).
    platform_env: Mapping[str, str] = field(default_factory=dict)
    needs_tier: str | None = None  # "disk" or "host": n/a when that tier is off


@dataclass(frozen=True, slots=True)
class Round:
    """One timed cold request."""

    scenario: str
    model: str
    phases_s: dict[str, float]  # PHASES and total
    tier: str  # where the weights came from, by the worker's log
    load_log: LoadLog | None
    first_event: str  # "output", or the terminal event when no output event came
    engine_ttft_s: float | None  # the engine's own, from the job's output timings
    edge_read_s: float | None = None  # the API reading the model's files (before the clock)


def median(values: Iterable[float | None]) -> float | None:
    xs = [v for v in values if v is not None]
    return statistics.median(xs) if xs else None


def summarize(
    scenarios: Iterable[Scenario],
    rounds: list[Round],
    weight_stream_s: list[float],
    headline_model: str,
    extra: Mapping[str, Any],
) -> dict[str, Any]:
    """The JSON line: each scenario's median first token for `headline_model` (null when not
    built or not run), weight_stream_s, then per-phase medians and the other models."""

    def total(scenario: str, model: str) -> float | None:
        m = median(
            r.phases_s["total"] for r in rounds if (r.scenario, r.model) == (scenario, model)
        )
        return None if m is None else round(m, 3)

    scenarios = list(scenarios)
    out: dict[str, Any] = {"bench": "cold_start", "model": headline_model}
    for s in scenarios:
        out[s.json_key] = total(s.key, headline_model)
    stream = median(weight_stream_s)
    out["weight_stream_s"] = None if stream is None else round(stream, 3)
    main = [r for r in rounds if (r.scenario, r.model) == ("no_pool", headline_model)]
    if main:
        out["phases_s"] = {p: round(median(r.phases_s[p] for r in main) or 0.0, 3) for p in PHASES}
    for model in sorted({r.model for r in rounds} - {headline_model}):
        out[model] = {s.json_key: total(s.key, model) for s in scenarios if s.built}
    out.update(extra)
    first = ("bench", *REQUIRED_KEYS)
    return {k: out[k] for k in first} | {k: v for k, v in out.items() if k not in first}


def fmt(x: float | None, digits: int = 2) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def table(
    scenarios: Iterable[Scenario], models: list[str], rounds: list[Round], na: Mapping[str, str]
) -> list[str]:
    """The markdown table: scenario × model, medians; `na` gives a reason per scenario key."""
    out = [
        "| scenario | model | first token s | accept | queue | boot | load | tier | warm | token |",
        "|---|---|---:|---:|---:|---:|---:|---|---:|---:|",
    ]
    for s in scenarios:
        for model in models:
            rs = [r for r in rounds if (r.scenario, r.model) == (s.key, model)]
            if not rs:
                reason = na.get(s.key, "n/a (not run)")
                out.append(f"| {s.label} | {model} | {reason} |" + " |" * 7)
                continue
            tiers = sorted({r.tier for r in rs})
            marks = "" if all(r.first_event == "output" for r in rs) else " *"
            cells = [fmt(median(r.phases_s[p] for r in rs)) for p in PHASES]
            total = fmt(median(r.phases_s["total"] for r in rs)) + marks
            out.append(
                f"| {s.label} | {model} | {total} | {' | '.join(cells[:4])} | {'/'.join(tiers)} "
                f"| {' | '.join(cells[4:])} |"
            )
    return out


def load_table(
    scenarios: Iterable[Scenario], models: list[Model], rounds: list[Round], alone: float | None
) -> list[str]:
    """The `load` column split by the worker's log line (medians); `engine`: the rest of
    `load` (the engine and its KV cache); `loader alone`: weight_stream_s."""
    out = [
        "| model | scenario | load | files | header | fetch | GB/s | build | engine | alone |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for m in models:
        for s in scenarios:
            rs = [r for r in rounds if (r.model, r.scenario) == (m.key, s.key)]
            logs = [r.load_log for r in rs if r.load_log is not None]
            load = median(r.phases_s["load"] for r in rs)
            logged = median(x.seconds for x in logs)
            cells = [
                load,
                *(median(getattr(x, f) for x in logs) for f in LOG_FIELDS),
                None if load is None or logged is None else load - logged,
                alone if m.key == "big" else None,
            ]
            out.append(f"| {m.key} | {s.label} | " + " | ".join(map(fmt, cells)) + " |")
    return out


# --------------------------------------------------------------------------- models


@dataclass(frozen=True, slots=True)
class Model:
    key: str  # "demo" or "big"
    path: Path  # the local directory
    size_bytes: int  # of model.safetensors


def ascii_token_ids(tokenizer_json: Path, count: int = 2) -> list[int]:
    """The first `count` ids that decode to a plain word (text an output event will carry)."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_json))
    plain = re.compile(r" ?[A-Za-z]{2,}")
    found = [i for i in range(tok.get_vocab_size()) if plain.fullmatch(tok.decode([i]))]
    if len(found) < count:
        raise ValueError(f"{tokenizer_json}: fewer than {count} plain-word tokens")
    return found[:count]


def make_head_visible(path: Path, token_ids: list[int], name: str = "lm_head.weight") -> None:
    """Rewrite `name` in place: every row 0 but row ids[0] = r and row ids[1] = -r (r: its
    first row). Greedy decoding then picks one of the two, whatever the hidden state, unless
    it is orthogonal to r."""
    import numpy as np

    with path.open("r+b") as f:
        header_len = int.from_bytes(f.read(8), "little")
        info = json.loads(f.read(header_len))[name]
    width = {"BF16": 2, "F16": 2, "F32": 4}[info["dtype"]]
    dtype = np.uint16 if width == 2 else np.uint32
    sign = 1 << (8 * width - 1)
    start, end = info["data_offsets"]
    rows = np.memmap(
        path, dtype=dtype, mode="r+", offset=8 + header_len + start, shape=tuple(info["shape"])
    )
    assert rows.nbytes == end - start
    base = np.array(rows[0])
    rows[:] = 0
    rows[token_ids[0]] = base
    rows[token_ids[1]] = base ^ dtype(sign)  # the sign bit flipped: -r
    rows.flush()
    del rows


def bench_loader() -> Any:
    """bench/loader.py (its checkpoint maker, shapes and machine line), imported by name so
    that `mypy bench/cold_start.py` checks this file, not that one."""
    return importlib.import_module("bench.loader")


def build_models(work: Path, skip_big: bool) -> list[Model]:
    """The demo model and (unless skipped) the big one under `work`, reused when complete."""
    models = []
    demo = work / "demo"
    if not (demo / "model.safetensors").exists():
        shutil.rmtree(demo, ignore_errors=True)
        cli = Path(sys.executable).parent / "platform"
        subprocess.run(
            [str(cli), "models", "create-demo", str(demo)],
            check=True,
            capture_output=True,
            timeout=600,
        )
    models.append(Model("demo", demo, (demo / "model.safetensors").stat().st_size))
    if skip_big:
        return models
    big, done = work / "big", work / "big" / ".complete"
    if not done.exists():
        shutil.rmtree(big, ignore_errors=True)
        bench_loader().make_checkpoint(big / "model.safetensors", "small", None)
        for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
            if (demo / name).exists():
                shutil.copy(demo / name, big / name)
        hidden, kv, mlp, vocab, layers = bench_loader().SHAPES["small"]
        config = json.loads((demo / "config.json").read_text())
        config.update(
            hidden_size=hidden,
            head_dim=64,
            num_attention_heads=hidden // 64,
            num_key_value_heads=kv // 64,
            intermediate_size=mlp,
            vocab_size=vocab,
            num_hidden_layers=layers,
            tie_word_embeddings=False,
            torch_dtype="bfloat16",
            max_position_embeddings=2048,
        )
        (big / "config.json").write_text(json.dumps(config, indent=2))
        make_head_visible(big / "model.safetensors", ascii_token_ids(big / "tokenizer.json"))
        done.touch()
    models.append(Model("big", big, (big / "model.safetensors").stat().st_size))
    return models


# --------------------------------------------------------------------------- the platform


def processes_mentioning(texts: Iterable[str]) -> list[str]:
    """Live processes (not zombies) whose command line contains one of `texts`."""
    texts = [t for t in texts if t]
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state != "Z" and any(t in cmdline for t in texts):
            out.append(f"{entry.name}: {cmdline[:200]}")
    return out


class Platform:
    """`platform up --detach` in `state_dir` (as tests/e2e/conftest.py does); `close()` runs
    `platform down` and checks that no process of it (workers included) is left."""

    def __init__(
        self, state_dir: Path, extra_env: Mapping[str, str], cache_dirs: Mapping[str, Path]
    ) -> None:
        import httpx

        from control_plane.embedded.processes import free_port

        self.state_dir = state_dir
        self.cache_dirs = dict(cache_dirs)  # tier -> its directory, for the tiers that are on
        self.token = secrets.token_hex(3)  # names this run's deployments and store prefix
        self.worker_ids: set[str] = set()
        self.env = {**os.environ, "PLATFORM_STATE_DIR": str(state_dir), **extra_env}
        up = self._cli("up", "--detach", "--port", str(free_port()), "--state-dir", str(state_dir))
        if up.returncode != 0:
            raise SystemExit(f"platform up failed:\n{up.stdout}\n{up.stderr}")
        self.state = json.loads((state_dir / "platform.json").read_text())
        self.env.update(
            PLATFORM_URL=self.state["url"],
            PLATFORM_API_KEY=self.state["api_key"],
            PLATFORM_S3_ENDPOINT_URL=self.state["s3_endpoint_url"],
            AWS_ACCESS_KEY_ID=self.state["s3_access_key_id"],
            AWS_SECRET_ACCESS_KEY=self.state["s3_secret_access_key"],
            AWS_DEFAULT_REGION="us-east-1",
        )
        self.http: httpx.Client = httpx.Client(
            base_url=self.state["url"],
            headers={"Authorization": f"Bearer {self.state['api_key']}"},
            timeout=httpx.Timeout(60.0, read=600.0),
        )

    def _cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        cli = Path(sys.executable).parent / "platform"
        return subprocess.run(
            [str(cli), *args], env=self.env, capture_output=True, text=True, timeout=600
        )

    def close(self) -> None:
        self.http.close()
        down = self._cli("down", "--state-dir", str(self.state_dir))
        deadline = time.monotonic() + 15
        texts = [str(self.state_dir), *self.worker_ids]
        while (left := processes_mentioning(texts)) and time.monotonic() < deadline:
            time.sleep(0.2)
        if down.returncode != 0 or left:
            raise SystemExit(f"platform down: rc {down.returncode} {down.stderr}; left: {left}")

    def s3(self) -> S3Client:
        import boto3
        from botocore.config import Config

        return boto3.session.Session().client(
            "s3",
            endpoint_url=self.state["s3_endpoint_url"],
            aws_access_key_id=self.state["s3_access_key_id"],
            aws_secret_access_key=self.state["s3_secret_access_key"],
            region_name="us-east-1",
            config=Config(
                s3={"addressing_style": "path"},
                request_checksum_calculation="when_required",
                response_checksum_validation="when_required",
            ),
        )

    def upload(self, model: Model, mode: str) -> tuple[str, str]:
        """Put `model` into the admin tenant's namespace; (store:// URI, s3:// URI of its
        model.safetensors as the loader reads it)."""
        prefix = f"bench/cold-start-{self.token}/{model.key}/"
        files = sorted(p for p in model.path.iterdir() if p.is_file() and p.name[0] != ".")
        if mode == "api":
            done = self._cli("models", "upload", str(model.path), "store://" + prefix)
            if done.returncode != 0:
                raise SystemExit(f"platform models upload failed: {done.stderr}")
        else:
            # One small file through the API: where it lands is the namespace's prefix.
            marker = files[0]
            put = self.http.put(f"/v1/files/{prefix}{marker.name}", content=marker.read_bytes())
            put.raise_for_status()
            keys = self._store_keys("/" + prefix + marker.name)
            if len(keys) != 1:
                raise SystemExit(f"store://{prefix}{marker.name} not found in {STORE_BUCKET}")
            base = keys[0][: -len(marker.name)]  # tenants/<tenant id>/<prefix>
            s3 = self.s3()
            for f in files[1:]:
                s3.upload_file(str(f), STORE_BUCKET, base + f.name)
        weights = self._store_keys("/" + prefix + "model.safetensors")
        return "store://" + prefix, f"s3://{STORE_BUCKET}/{weights[0]}"

    def _store_keys(self, suffix: str) -> list[str]:
        """Keys of the store bucket under tenants/ that end with `suffix`."""
        pages = (
            self.s3()
            .get_paginator("list_objects_v2")
            .paginate(Bucket=STORE_BUCKET, Prefix="tenants/")
        )
        return [
            o["Key"]
            for page in pages
            for o in page.get("Contents", [])
            if o["Key"].endswith(suffix)
        ]

    def wait_no_workers(self, timeout_s: float = 180.0) -> None:
        """Until every worker of this tenant has stopped (a deleted deployment's drains)."""
        deadline = time.monotonic() + timeout_s
        while True:
            live = [
                w
                for w in self.http.get("/v1/workers").json()["data"]
                if w["state"] not in ("stopped", "failed")
            ]
            if not live:
                return
            if time.monotonic() > deadline:
                raise SystemExit(f"workers still running after {timeout_s:.0f}s: {live}")
            time.sleep(0.2)

    def billing_records(self, worker_id: str, timeout_s: float = 10.0) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout_s
        while True:
            got = self.http.get("/v1/billing/records", params={"worker_id": worker_id})
            data: list[dict[str, Any]] = got.json()["data"]
            if {"boot", "load", "warm"} <= {r["phase"] for r in data}:
                return data
            if time.monotonic() > deadline:
                return data  # timeline() names what is missing
            time.sleep(0.2)


def tier_env(cache_dirs: Mapping[str, Path]) -> dict[str, str]:
    """The workers' settings (passed through by the platform) that turn these tiers on."""
    env = {}
    if "disk" in cache_dirs:
        env["PLATFORM_LOADER_CACHE_DIR"] = str(cache_dirs["disk"])
    if "host" in cache_dirs:
        env["PLATFORM_LOADER_HOST_CACHE_DIR"] = str(cache_dirs["host"])
        env["PLATFORM_LOADER_HOST_CACHE_BYTES"] = str(HOST_CACHE_BYTES)
    return env


def emptied(*tiers: str) -> Callable[[Platform], None]:
    """A `prepare` that empties these cache tiers (those that are on)."""

    def prepare(p: Platform) -> None:
        for tier in tiers:
            if tier in p.cache_dirs:
                shutil.rmtree(p.cache_dirs[tier], ignore_errors=True)

    return prepare


# Each scenario empties the tiers faster than the one it measures; a load writes through to
# the faster tiers (a disk hit refills host memory), so the order matters.
SCENARIOS = (
    Scenario("no_pool", "(a) no pool", "first_token_s", True, emptied("host", "disk")),
    Scenario(
        "no_pool_disk",
        "(a) no pool, disk-cache hit",
        "first_token_s_disk_tier",
        True,
        emptied("host"),
        needs_tier="disk",
    ),
    Scenario(
        "no_pool_host",
        "(a) no pool, host-memory hit",
        "first_token_s_host_tier_no_pool",
        True,
        needs_tier="host",
    ),
    Scenario("warm_pool", "(b) warm pool, object storage", "first_token_s_warm_pool", False),
    Scenario("host_tier", "(c) warm pool, host-memory hit", "first_token_s_host_tier", False),
)


# --------------------------------------------------------------------------- one round


def cold_round(p: Platform, model: Model, uri: str, scenario: Scenario, i: int) -> Round:
    """One request at zero workers of a fresh deployment, timed to its first token."""
    name = f"cs-{model.key}-{scenario.key.replace('_', '-')}-{i}-{p.token}"
    p.wait_no_workers()
    spec = {
        "name": name,
        "model": uri,
        "min_workers": 0,
        "max_workers": 1,
        "accelerator": "cpu",
        "scaledown_window_s": 2,
    }
    p.http.post("/v1/deployments", json=spec).raise_for_status()
    try:
        edge_s = read_model_at_edge(p, name)
        if scenario.prepare is not None:
            scenario.prepare(p)
        os.sync()  # no writeback of the last round's files during this one
        time.sleep(0.5)
        first: dict[str, float] = {}
        worker_id = ""
        body = {"input": {"prompt": PROMPT, "max_tokens": MAX_TOKENS}, "stream": True}
        sent = time.time()
        with p.http.stream("POST", f"/v1/deployments/{name}/run", json=body) as resp:
            resp.raise_for_status()
            job_id = resp.headers["x-job-id"]
            for event, data in sse_events(resp.iter_lines()):
                first.setdefault(event, time.time())
                if event == "running":
                    worker_id = json.loads(data).get("worker_id", "")
                if event in TERMINAL:
                    break
        job = p.http.get(f"/v1/jobs/{job_id}").json()
        if job["status"] != "succeeded":
            raise SystemExit(f"{name}: job {job_id} {job['status']}: {job.get('error')}")
        if not worker_id:  # a stream that missed `running`: the usage record names it
            usage = p.http.get("/v1/usage", params={"deployment": name}).json()["data"]
            worker_id = usage[0]["workers"][0]
        p.worker_ids.add(worker_id)
        first_event = "output" if "output" in first else "completed"
        t = timeline(sent, job, p.billing_records(worker_id), first[first_event])
        log_path = p.state_dir / "logs" / "workers" / f"{worker_id}.log"
        log_text = log_path.read_text(errors="replace") if log_path.exists() else ""
        load_log = parse_load_log(log_text)
        ttft = ((job.get("output") or {}).get("timings") or {}).get("ttft_s")
    finally:
        p.http.delete(f"/v1/deployments/{name}")
    tier = load_log.tier if load_log else "?"
    return Round(scenario.key, model.key, phases(t), tier, load_log, first_event, ttft, edge_s)


def read_model_at_edge(p: Platform, name: str) -> float:
    """Have the API read the deployment's tokenizer and config (services/model_meta.py: on the
    first call of a deployment version, then kept), as for any deployment called before: a
    call whose max_tokens cannot fit the context is refused (422) after that read, before
    anything is written. Returns the seconds it took (what a first call pays on top)."""
    body = {"input": {"prompt": PROMPT, "max_tokens": 32_768}}
    t0 = time.perf_counter()
    refused = p.http.post(f"/v1/deployments/{name}/run", json=body)
    if refused.status_code != 422:
        raise SystemExit(f"{name}: the edge read expected a 422, got {refused.status_code}")
    return time.perf_counter() - t0


def stream_child(uri: str, endpoint_url: str) -> None:
    """In a fresh process: the loader alone streams `uri`; prints one RESULT line."""
    import torch  # noqa: F401  (import cost is not measured, as in bench/loader.py)

    import loader

    options = loader.LoadOptions(s3=loader.S3Options(endpoint_url=endpoint_url))
    t0 = time.perf_counter()
    result = loader.load(uri, options=options)
    seconds = time.perf_counter() - t0
    m = result.metrics
    print("RESULT " + json.dumps({"seconds": seconds, "bytes": m.bytes_total, "gbps": m.gbps}))


def weight_stream(p: Platform, s3_uri: str) -> float:
    env = {k: v for k, v in p.env.items() if not k.startswith("PLATFORM_LOADER_")}
    env["AWS_EC2_METADATA_DISABLED"] = "true"
    os.sync()
    time.sleep(0.5)
    out = subprocess.run(
        [sys.executable, __file__, "--child-stream", s3_uri, p.state["s3_endpoint_url"]],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    lines = [x for x in out.stdout.splitlines() if x.startswith("RESULT ")]
    if out.returncode != 0 or not lines:
        raise SystemExit(f"weight stream failed ({out.returncode}):\n{out.stderr[-3000:]}")
    return float(json.loads(lines[-1][len("RESULT ") :])["seconds"])


# --------------------------------------------------------------------------- main


def git_revision() -> str:
    """The commit, and which files differ from it (read-only git)."""

    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)
        return done.stdout if done.returncode == 0 else ""

    head = git("rev-parse", "--short", "HEAD").strip() or "unknown"
    # "XY path" lines (a rename: "XY old -> new")
    changed = sorted({line[3:] for line in git("status", "--short").splitlines() if line})
    return head + (f" with uncommitted changes in {', '.join(changed)}" if changed else "")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3, help="timed requests per scenario and model")
    ap.add_argument("--skip-big", action="store_true", help="the demo model only")
    ap.add_argument("--state-dir", type=Path, help="the platform's state (default: a temp dir)")
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
    ap.add_argument("--child-stream", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child_stream:
        stream_child(*args.child_stream)
        return

    tiers = [t for t in args.tiers.split(",") if t]
    if set(tiers) - set(TIER_NAMES):
        ap.error(f"--tiers: choose from {sorted(TIER_NAMES)}")
    na = {s.key: "n/a (not built)" for s in SCENARIOS if not s.built}
    na |= {
        s.key: f"n/a ({s.needs_tier} tier off)"
        for s in SCENARIOS
        if s.needs_tier and s.needs_tier not in tiers
    }
    active = [s for s in SCENARIOS if s.key not in na]
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-cold-start-")))
        state_dir = (args.state_dir or tmp / "state").resolve()
        work = args.model_dir or tmp / "models"
        work.mkdir(parents=True, exist_ok=True)
        t0 = time.monotonic()
        models = build_models(work, args.skip_big)
        print(
            f"models ready in {time.monotonic() - t0:.1f}s: "
            + ", ".join(f"{m.key} {m.size_bytes / 1e9:.3f} GB" for m in models),
            flush=True,
        )
        shm = Path("/dev/shm")  # the host tier belongs on a tmpfs
        dirs = {
            "host": (shm if shm.is_dir() else tmp) / f"bench-cold-start-{secrets.token_hex(4)}",
            "disk": state_dir / "weights-cache",
        }
        cache_dirs = {t: d for t, d in dirs.items() if t in tiers}
        stack.callback(shutil.rmtree, dirs["host"], True)  # after `platform down`
        env = tier_env(cache_dirs)
        for s in active:
            env |= s.platform_env
        p = Platform(state_dir, env, cache_dirs)
        stack.callback(p.close)
        uris: dict[str, tuple[str, str]] = {}
        for m in models:
            t0 = time.monotonic()
            uris[m.key] = p.upload(m, args.upload if m.key == "big" else "api")
            print(
                f"uploaded {m.key} ({args.upload if m.key == 'big' else 'api'}) in "
                f"{time.monotonic() - t0:.1f}s",
                flush=True,
            )
        rounds: list[Round] = []
        streams: list[float] = []
        for i in range(1, args.rounds + 1):
            for m in models:
                for s in active:
                    r = cold_round(p, m, uris[m.key][0], s, i)
                    rounds.append(r)
                    ph = " ".join(f"{k} {r.phases_s[k]:.2f}" for k in PHASES)
                    total = r.phases_s["total"]
                    print(
                        f"  round {i} {s.key:12s} {m.key:4s} first token {total:.2f}s ({ph}; "
                        f"{r.tier}, first event {r.first_event})",
                        flush=True,
                    )
            if "big" in uris:
                p.wait_no_workers()
                streams.append(weight_stream(p, uris["big"][1]))
                print(f"  round {i} loader alone {streams[-1]:.2f}s", flush=True)

    headline = "big" if "big" in uris else "demo"
    print(f"\nmachine: {bench_loader().machine()}; commit {git_revision()}")
    print(
        f"{args.rounds} rounds, medians; models: "
        + ", ".join(f"{m.key} {m.size_bytes / 1e9:.3f} GB" for m in models)
        + "\n"
    )
    print("\n".join(table(SCENARIOS, [m.key for m in models], rounds, na)))
    if any(r.first_event != "output" for r in rounds):
        print("* some rounds saw no output event: first token = the terminal event")
    print()
    print("\n".join(load_table(active, models, rounds, median(streams))))
    edge = median(r.edge_read_s for r in rounds if r.model == headline)
    ttft = median(r.engine_ttft_s for r in rounds if (r.model, r.scenario) == (headline, "no_pool"))
    extra = {
        "first_call_edge_read_s": None if edge is None else round(edge, 3),
        "engine_ttft_s": None if ttft is None else round(ttft, 3),
        "rounds": args.rounds,
        "tiers": tiers,
        "upload": args.upload,
    }
    print(json.dumps(summarize(SCENARIOS, rounds, streams, headline, extra)))


if __name__ == "__main__":
    main()
