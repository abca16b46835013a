"""The embedded platform, driven from outside: `platform up --detach` in a state directory
(as tests/e2e/conftest.py does), its HTTP API, its S3 store, and read-only looks at what the
API does not show a tenant — the warm pool's worker rows (SQL), their heartbeats (Redis) and
the weight-cache tier directories. `close()` runs `platform down` and checks that no process of
it (workers included) is left.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from bench.coldstart.models import Model

if TYPE_CHECKING:
    import httpx
    import redis
    from mypy_boto3_s3 import S3Client
    from sqlalchemy.orm import Session, sessionmaker

STORE_BUCKET = os.environ.get("PLATFORM_STORE_BUCKET", "platform-store")  # the platform's
ENDED = ("stopped", "failed")  # worker states of a process that is gone
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Uploaded:
    """A model in the admin tenant's namespace."""

    store_uri: str  # store://… as a deployment names it
    weights_key: str  # its model.safetensors, the key in the store bucket (tenants/<id>/…)

    @property
    def weights_uri(self) -> str:
        """model.safetensors as the loader reads it (the tiers' entries are keyed by it)."""
        return f"s3://{STORE_BUCKET}/{self.weights_key}"

    def among(self, uris: Iterable[str]) -> bool:
        """Whether these object URIs (a tier's, a heartbeat's) include the weights."""
        return any(u.endswith("/" + self.weights_key) for u in uris)


def wait_for(what: str, probe: Callable[[], T | None], timeout_s: float, every_s: float = 0.1) -> T:
    """probe() until it returns something; SystemExit naming `what` after timeout_s."""
    deadline = time.monotonic() + timeout_s
    while (value := probe()) is None:
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out after {timeout_s:.0f}s waiting for {what}")
        time.sleep(every_s)
    return value


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
    """One `platform up` with `extra_env`; the workers' cache tiers live in `cache_dirs`."""

    def __init__(
        self, state_dir: Path, extra_env: Mapping[str, str], cache_dirs: Mapping[str, Path]
    ) -> None:
        import httpx

        from control_plane.embedded.processes import free_port

        self.state_dir = state_dir
        self.cache_dirs = dict(cache_dirs)  # tier -> its directory, for the tiers that are on
        self.token = secrets.token_hex(3)  # names this run's deployments and store prefix
        self.worker_ids: set[str] = set()  # every worker seen, checked gone at close()
        self.env = {**os.environ, "PLATFORM_STATE_DIR": str(state_dir), **extra_env}
        self._sessions: sessionmaker[Session] | None = None
        self._redis: redis.Redis | None = None
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
        if self._redis is not None:
            self._redis.close()
        down = self._cli("down", "--state-dir", str(self.state_dir))
        deadline = time.monotonic() + 15
        texts = [str(self.state_dir), *self.worker_ids]
        while (left := processes_mentioning(texts)) and time.monotonic() < deadline:
            time.sleep(0.2)
        if down.returncode != 0 or left:
            raise SystemExit(f"platform down: rc {down.returncode} {down.stderr}; left: {left}")

    # storage ---------------------------------------------------------------------------------

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

    def upload(self, model: Model, mode: str) -> Uploaded:
        """Put `model` into the admin tenant's namespace, through the API (`api`) or, but for
        one marker file that tells where the namespace lives, straight into the store (`s3`)."""
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
        return Uploaded("store://" + prefix, weights[0])

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

    # the weight-cache tiers ------------------------------------------------------------------

    def empty_tiers(self, tiers: Iterable[str]) -> None:
        """Remove these tiers' entries (those of the tiers that are on)."""
        for tier in tiers:
            if tier in self.cache_dirs:
                shutil.rmtree(self.cache_dirs[tier], ignore_errors=True)

    def tiers_holding(self, model: Uploaded) -> set[str]:
        """The tiers (of those on) holding a complete entry of the model's weights."""
        from loader import cached_uris

        return {t for t, d in self.cache_dirs.items() if model.among(cached_uris(d))}

    def wait_tiers_filled(self, model: Uploaded, source: str, timeout_s: float = 180.0) -> None:
        """Until the tiers faster than `source` (where the worker's load read the weights:
        a tier, or "origin") hold the model: a worker fills those in the background once it
        is ready (`LoadedModel.fill_tiers`); the slower ones it leaves as they are."""
        order = ("host", "disk", "origin")  # fastest first
        faster = order[: order.index(source)] if source in order else order[:-1]
        want = set(faster) & set(self.cache_dirs)
        wait_for(
            f"the tier fill of {model.weights_uri} ({sorted(want)})",
            lambda: True if self.tiers_holding(model) >= want else None,
            timeout_s,
            every_s=0.2,
        )

    # workers ---------------------------------------------------------------------------------

    def wait_no_workers(self, timeout_s: float = 180.0) -> None:
        """Until every worker of this tenant has stopped (a deleted deployment's drains)."""

        def none_live() -> bool | None:
            data = self.http.get("/v1/workers").json()["data"]
            self.worker_ids.update(w["id"] for w in data)
            return True if all(w["state"] in ENDED for w in data) else None

        wait_for("this tenant's workers to stop", none_live, timeout_s, every_s=0.2)

    def pool_workers(self) -> dict[str, str]:
        """Live warm-pool workers (no deployment yet): id → "state engine", from the worker
        rows (the pool is the platform tenant's: no user's API lists it)."""
        from sqlalchemy import select

        from control_plane.db.models import Worker
        from control_plane.db.session import make_engine, make_sessionmaker

        if self._sessions is None:
            self._sessions = make_sessionmaker(make_engine(self.state["database_url"]))
        with self._sessions() as s:
            rows = s.execute(
                select(Worker.id, Worker.state, Worker.engine).where(
                    Worker.deployment_id.is_(None), Worker.state.not_in(ENDED)
                )
            ).all()
        self.worker_ids.update(r.id for r in rows)
        return {r.id: f"{r.state} {r.engine}" for r in rows}

    def heartbeat(self, worker_id: str) -> dict[str, Any] | None:
        """The worker's latest heartbeat (common/protocol.py), None when it has none."""
        import redis

        from common.protocol import worker_heartbeat_key

        if self._redis is None:
            self._redis = redis.Redis.from_url(self.state["redis_url"])
        raw = self._redis.get(worker_heartbeat_key(worker_id))
        return None if raw is None else dict(json.loads(raw))

    def wait_pool_ready(
        self, model: Uploaded, host_hit: bool, engine: str = "builtin", timeout_s: float = 180.0
    ) -> str:
        """Until the pool is one idle worker of `engine` and nothing else (no pool boot or
        drain under way to compete for the cores), whose heartbeat says its host tier holds
        the model iff `host_hit` (what placement reads); its id."""
        from common.protocol import HEARTBEAT_HOST_TIER_FIELD

        def ready() -> str | None:
            pool = self.pool_workers()
            if len(pool) != 1 or next(iter(pool.values())) != f"idle {engine}":
                return None
            (worker_id,) = pool
            beat = self.heartbeat(worker_id)
            if beat is None or beat.get("state") != "idle":
                return None
            holds = model.among(beat.get(HEARTBEAT_HOST_TIER_FIELD) or [])
            return worker_id if holds == host_hit else None

        hit = "holds" if host_hit else "lacks"
        return wait_for(
            f"one idle warm-pool worker whose host tier {hit} the model", ready, timeout_s, 0.2
        )

    def billing_records(self, worker_id: str, timeout_s: float = 10.0) -> list[dict[str, Any]]:
        """The tenant's billing records of the worker, once its load one and the one after it
        are in (`warm`, or `idle`/`busy` for a worker that jobs waited for: no warm-up)."""
        deadline = time.monotonic() + timeout_s
        while True:
            got = self.http.get("/v1/billing/records", params={"worker_id": worker_id})
            data: list[dict[str, Any]] = got.json()["data"]
            phases = {r["phase"] for r in data}
            if "load" in phases and phases & {"warm", "idle", "busy"}:
                return data
            if time.monotonic() > deadline:
                return data  # timeline() names what is missing
            time.sleep(0.2)

    def placement(self, deployment: str) -> dict[str, Any] | None:
        """The deployment's `scaling.placement`: where its latest worker came from."""
        doc = self.http.get(f"/v1/deployments/{deployment}").json()
        got = (doc.get("scaling") or {}).get("placement")
        return None if got is None else dict(got)
