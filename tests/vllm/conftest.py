"""The vLLM environment (`make vllm-venv`: `.venv-vllm`, vLLM and this project) and tiny
checkpoints for its tests."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.vllm.tiny_models import write_model

ROOT = Path(__file__).resolve().parents[2]
VLLM_PYTHON = Path(os.environ.get("PLATFORM_VLLM_PYTHON") or ROOT / ".venv-vllm" / "bin" / "python")


@pytest.fixture(scope="session")
def vllm_python() -> Path:
    """vLLM's interpreter; `make test` creates it (`make vllm-venv`)."""
    if not VLLM_PYTHON.exists():
        pytest.skip(f"no vLLM environment at {VLLM_PYTHON}: `make vllm-venv` creates it")
    return VLLM_PYTHON


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("vllm-models")
    return {kind: write_model(root / kind, kind) for kind in ("llama", "gemma2", "mixtral")}


def run_vllm_engine(python: Path, models: list[dict[str, Any]], timeout_s: float = 600) -> Any:
    """`tests/vllm/run_engine.py` in the vLLM environment; its JSON result."""
    proc = subprocess.run(
        [str(python), "-m", "tests.vllm.run_engine"],
        input=json.dumps({"models": models}),
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=timeout_s,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])
