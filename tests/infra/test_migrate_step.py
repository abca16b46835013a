"""The image's `migrate` role (infra/docker/migrate.py), which the chart's hook Job and compose
run before the control plane starts: it brings the schema up and installs the bootstrap admin
key, and refuses a malformed key before it touches the database."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from sqlalchemy import inspect

from control_plane.db.session import make_engine, make_sessionmaker
from control_plane.services.tenants.api_keys import authenticate, generate_key

REPO = Path(__file__).resolve().parents[2]


def _migrate(database_url: str, admin_key: str) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/bin:/bin", "PLATFORM_DATABASE_URL": database_url,
           "BOOTSTRAP_ADMIN_KEY": admin_key}  # fmt: skip
    return subprocess.run(
        [sys.executable, "infra/docker/migrate.py"], cwd=REPO, env=env,
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_a_malformed_bootstrap_key_is_refused_before_the_schema_changes(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'platform.db'}"
    done = _migrate(url, "pk_not-a-key")
    assert done.returncode == 2
    assert "BOOTSTRAP_ADMIN_KEY is not a platform API key" in done.stderr
    assert "Traceback" not in done.stderr
    engine = make_engine(url)
    assert inspect(engine).get_table_names() == []  # nothing half done
    engine.dispose()


def test_the_schema_and_the_bootstrap_key_are_installed_once(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'platform.db'}"
    key = generate_key()[0]
    for _ in range(2):  # a retried Job changes nothing
        done = _migrate(url, key)
        assert done.returncode == 0, done.stderr
    engine = make_engine(url)
    with make_sessionmaker(engine)() as session:
        assert "admin" in authenticate(session, key).scopes
    engine.dispose()
