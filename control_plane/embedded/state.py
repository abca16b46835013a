"""What the embedded platform keeps in its state directory: the credentials generated on the
first `up` (`credentials.json`), and `platform.json`, which says where a running one serves and
under which process id (`up` writes it when ready, `down` reads it)."""

from __future__ import annotations

import dataclasses
import json
import os
import secrets
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

STATE_FILE = "platform.json"
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


def platform_log_path(state_dir: Path) -> Path:
    """Where a detached supervisor writes (its banner, its children's restarts, a stack dump)."""
    return state_dir / "logs" / "platform.log"
