"""A real PostgreSQL server for the tests (Debian's binaries), one database per test."""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import signal
import subprocess
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

from control_plane.embedded.processes import ManagedProcess, free_port, spawn, wait_until


def postgres_bindir() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None


def start_postgres(
    root: Path, host: str = "127.0.0.1", before_exec: Callable[[], None] | None = None
) -> tuple[ManagedProcess, str]:
    """initdb + postgres on a free port of `host` (loopback; a test host's address, with
    `before_exec` entering its network namespace); returns (process, server URL)."""
    bindir = postgres_bindir()
    assert bindir is not None, "PostgreSQL is not installed (.ci/run installs Debian's)"
    data, sock = root / "data", root / "sock"
    data.mkdir(parents=True)
    sock.mkdir()
    run_as = None
    if os.geteuid() == 0:
        # PostgreSQL refuses to run as root: use the package's `postgres` user.
        pw = pwd.getpwnam("postgres")
        run_as = (pw.pw_uid, pw.pw_gid)
        for p in (root, data, sock):
            os.chown(p, pw.pw_uid, pw.pw_gid)

    def as_user() -> None:
        if run_as is not None:
            os.setgid(run_as[1])
            os.setuid(run_as[0])

    subprocess.run(
        [str(bindir / "initdb"), "-D", str(data), "-A", "trust", "-U", "postgres", "-E", "UTF8",
         "--no-sync"],
        check=True, capture_output=True, preexec_fn=as_user, cwd="/",
    )  # fmt: skip
    if host != "127.0.0.1":
        # initdb trusts loopback only: the test hosts reach it over their own network
        with (data / "pg_hba.conf").open("a") as hba:
            hba.write("host all all samenet trust\n")
    port = free_port()
    cmd = [
        str(bindir / "postgres"), "-D", str(data), "-p", str(port), "-k", str(sock),
        "-c", f"listen_addresses={host}", "-c", "fsync=off", "-c", "synchronous_commit=off",
        "-c", "full_page_writes=off", "-c", "max_connections=200",
    ]  # fmt: skip
    proc = spawn("postgres", cmd, root / "postgres.log", cwd=Path("/"), run_as=run_as,
                 stop_signal=signal.SIGINT, before_exec=before_exec)  # fmt: skip
    url = f"postgresql+psycopg://postgres@{host}:{port}"

    def ready() -> bool:
        import psycopg

        with psycopg.connect(f"host={host} port={port} user=postgres dbname=postgres"):
            return True

    wait_until(proc, ready, 30)
    return proc, url


# The database the migrations ran on once, copied for each test's (`tests/conftest.py`).
MIGRATED = "migrated"


def _admin(server_url: str, statement: str) -> None:
    """Runs `statement` on the server's maintenance database, outside a transaction (as
    CREATE and DROP DATABASE must)."""
    import psycopg

    dsn = server_url.replace("postgresql+psycopg://", "postgresql://") + "/postgres"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(statement)


def create_database(server_url: str, name: str, template: str | None = None) -> None:
    """Creates the database `name` on the server, empty or a copy of `template` (which no
    connection may use meanwhile)."""
    copy = f' TEMPLATE "{template}"' if template else ""
    _admin(server_url, f'CREATE DATABASE "{name}"{copy}')


def fresh_database(server_url: str, template: str | None = None) -> Iterator[str]:
    """A new database on the server, empty or a copy of `template`; dropped afterwards
    (connections and all)."""
    name = "t_" + uuid.uuid4().hex[:12]
    create_database(server_url, name, template)
    yield f"{server_url}/{name}"
    _admin(server_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
