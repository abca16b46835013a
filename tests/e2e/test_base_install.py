"""`pip install .` (no extras) gives the SDK and CLI without torch or the server stack."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]


def test_base_install_is_sdk_and_cli_only(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    py = venv / "bin" / "python"
    subprocess.run(
        [str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check", str(ROOT)],
        check=True,
        capture_output=True,
        timeout=600,
    )
    installed = subprocess.run(
        [str(py), "-m", "pip", "list", "--format=freeze"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.lower()
    for heavy in ("torch", "fastapi", "celery", "sqlalchemy", "transformers"):
        assert f"\n{heavy}==" not in "\n" + installed, f"{heavy} was installed by the base install"
    out = subprocess.run(
        [str(py), "-c", "import sdk; from sdk import Client, AsyncClient; print('ok')"],
        check=True,
        capture_output=True,
        text=True,
    )
    assert out.stdout.strip() == "ok"
    up = subprocess.run(
        [str(venv / "bin" / "platform"), "up", "--state-dir", str(tmp_path / "s")],
        capture_output=True,
        text=True,
    )
    assert up.returncode == 1 and "server extra" in up.stderr
