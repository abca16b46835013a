"""`import sdk` pulls httpx and the stdlib only: no server, worker, or ML stack."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FORBIDDEN = ("torch", "fastapi", "celery", "sqlalchemy", "control_plane", "worker", "loader")


def _loaded_after(statement: str) -> set[str]:
    code = f"{statement}\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    return set(json.loads(done.stdout.splitlines()[-1]))


def _roots(modules: set[str]) -> set[str]:
    return {name.split(".", 1)[0] for name in modules}


def test_import_sdk_is_light() -> None:
    roots = _roots(_loaded_after("import sdk, sdk.webhooks"))
    assert not roots & set(FORBIDDEN), sorted(roots & set(FORBIDDEN))
    # The CLI's own dependencies are not the SDK's either. (click and rich may appear: httpx
    # itself imports them for its own command line when they are installed.)
    assert not roots & {"typer", "yaml", "boto3", "botocore"}


def test_the_cli_loads_without_the_server_worker_or_boto3() -> None:
    roots = _roots(_loaded_after("import sdk.cli.main"))
    assert not roots & {*FORBIDDEN, "boto3", "botocore"}
