"""The local provider runs each worker with its engine's environment: `python -m worker` of
the platform's own python for the built-in engine (its warm-pool workers too), of the vLLM
environment (PLATFORM_VLLM_PYTHON) for an assignment whose engine is vllm and for vLLM
warm-pool workers (`--pool --engine vllm`); the embedded platform finds the repository's
.venv-vllm."""

from __future__ import annotations

import time
from pathlib import Path

from common.messages import ASSIGNMENT_ENV, Assignment
from control_plane.embedded.sizing import default_vllm_python
from control_plane.providers.base import WorkerSpec
from control_plane.providers.local import LocalProvider, worker_env


def stand_in(path: Path, name: str) -> Path:
    """An interpreter that records who ran (its name), the assignment it was given and its
    arguments."""
    python = path / name / "python"
    python.parent.mkdir(parents=True)
    python.write_text(
        f'#!/bin/sh\nprintf "%s\\n%s" "{name}" "${ASSIGNMENT_ENV}" > "{path}/ran-$4"\n'
        f'printf "%s" "$*" > "{path}/args-$4"\n'
    )
    python.chmod(0o755)
    return python


def assignment(engine: str, accelerator_count: int) -> Assignment:
    return Assignment(
        "dep_1", 1, "s3://b/m/", "q", 1, engine=engine, accelerator_count=accelerator_count
    )


def run(provider: LocalProvider, specs: list[WorkerSpec]) -> None:
    for spec in specs:
        provider.start(spec)
    deadline = time.monotonic() + 10
    while provider.running() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert {e.worker_id for e in provider.reap()} == {s.worker_id for s in specs}


def test_each_worker_runs_with_its_engines_python(tmp_path: Path) -> None:
    builtin, vllm = stand_in(tmp_path, "builtin"), stand_in(tmp_path, "vllm")
    env = worker_env({"PATH": "/bin:/usr/bin"}, {})
    provider = LocalProvider(env, tmp_path / "logs", str(builtin), str(vllm))
    run(
        provider,
        [
            WorkerSpec("wrk_b", "cpu", assignment("builtin", 1)),
            WorkerSpec("wrk_v", "cpu", assignment("vllm", 2)),
            WorkerSpec("wrk_p", "cpu", None),  # a pool worker: the built-in engine
            WorkerSpec("wrk_pv", "cpu", None, pool_engine="vllm"),  # a vLLM pool worker
        ],
    )
    ran = {w: (tmp_path / f"ran-{w}").read_text().split("\n", 1) for w in ("wrk_b", "wrk_v")}
    assert ran["wrk_b"][0] == "builtin" and ran["wrk_v"][0] == "vllm"
    got = Assignment.from_json(ran["wrk_v"][1])
    assert (got.engine, got.accelerator_count) == ("vllm", 2)
    assert (tmp_path / "ran-wrk_p").read_text().split("\n")[0] == "builtin"
    assert (tmp_path / "args-wrk_p").read_text().endswith("--pool --engine builtin")
    # a vLLM pool worker: vLLM's python, told to prepare vLLM; no assignment yet
    assert (tmp_path / "ran-wrk_pv").read_text() == "vllm\n"
    assert (tmp_path / "args-wrk_pv").read_text().endswith("--pool --engine vllm")


def test_without_a_vllm_environment_the_worker_starts_and_fails_on_its_own(
    tmp_path: Path,
) -> None:
    """An engine chosen while the platform had vLLM: the worker starts with the platform's
    python (it fails to import vLLM and reports why), no tick fails on it."""
    builtin = stand_in(tmp_path, "builtin")
    provider = LocalProvider(
        worker_env({"PATH": "/bin:/usr/bin"}, {}), tmp_path / "logs", str(builtin)
    )
    run(provider, [WorkerSpec("wrk_v", "cpu", assignment("vllm", 1))])
    assert (tmp_path / "ran-wrk_v").read_text().startswith("builtin\n")


def test_the_embedded_platform_finds_the_repositorys_vllm_environment(tmp_path: Path) -> None:
    repo, venv = tmp_path / "repo", tmp_path / "venvs" / ".venv"
    assert default_vllm_python(repo, venv) == ""
    beside = tmp_path / "venvs" / ".venv-vllm" / "bin" / "python"
    beside.parent.mkdir(parents=True)
    beside.touch()
    assert default_vllm_python(repo, venv) == str(beside)
    own = repo / ".venv-vllm" / "bin" / "python"
    own.parent.mkdir(parents=True)
    own.touch()
    assert default_vllm_python(repo, venv) == str(own)  # the repository's first
