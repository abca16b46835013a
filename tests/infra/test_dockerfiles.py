"""The Dockerfiles, read structurally (docker cannot run here): non-root, no weights copied,
ports and pins that agree with the settings, pyproject.toml and the chart."""

from __future__ import annotations

import fnmatch
import importlib.util
import re
import subprocess
import tomllib
from pathlib import Path
from types import ModuleType

import pytest
import yaml

from control_plane.settings import Settings
from control_plane.tasks_api import CONTROL_QUEUE
from tests.infra import dockerfile
from tests.infra.chart import CHART, INFRA, REPO

DOCKER = INFRA / "docker"
CONTROL_PLANE = DOCKER / "control-plane.Dockerfile"
WORKER = DOCKER / "worker.Dockerfile"
DOCKERFILES = [CONTROL_PLANE, WORKER]
# What model weights look like; none may enter an image.
WEIGHT_PATTERNS = ["*.safetensors", "*.bin", "*.pt", "*.pth", "*.gguf"]


def values() -> dict:
    return yaml.safe_load((CHART / "values.yaml").read_text())


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_final_stage_runs_as_a_numeric_non_root_user(path: Path) -> None:
    users = [i for i in dockerfile.final_stage(dockerfile.parse(path)) if i.keyword == "USER"]
    assert users, "no USER: the container would run as root"
    user = users[-1].args.split(":")[0]
    # numeric, so Kubernetes' runAsNonRoot can verify it; and the chart runs as that uid
    assert user.isdigit() and int(user) != 0
    assert int(user) == values()["podSecurityContext"]["runAsUser"]


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_no_weights_are_copied(path: Path) -> None:
    for i in dockerfile.parse(path):
        if i.keyword in ("COPY", "ADD"):
            sources = [w for w in i.words() if not w.startswith("--")][:-1]
            for source in sources:
                assert not any(fnmatch.fnmatch(source, p) for p in WEIGHT_PATTERNS), i.args
                assert not re.search(r"(^|/)(weights|models?|checkpoints?)(/|$)", source), i.args
                assert "://" not in source, f"{i.args}: downloads at build time"
    ignore = (DOCKER / f"{path.name}.dockerignore").read_text().splitlines()
    for pattern in WEIGHT_PATTERNS:
        assert f"**/{pattern}" in ignore


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_copied_sources_exist_and_pass_the_dockerignore(path: Path) -> None:
    ignore = (DOCKER / f"{path.name}.dockerignore").read_text().splitlines()
    allowed = [p[1:] for p in ignore if p.startswith("!")]
    for i in dockerfile.parse(path):
        if i.keyword == "COPY" and not any(w.startswith("--from") for w in i.words()):
            for source in i.words()[:-1]:
                assert (REPO / source).exists(), source
                assert any(
                    fnmatch.fnmatch(source, a) or fnmatch.fnmatch(source + "/x", a) for a in allowed
                ), f"{source} is excluded from the build context"


def test_control_plane_image() -> None:
    instructions = dockerfile.parse(CONTROL_PLANE)
    final = dockerfile.final_stage(instructions)
    installs = " ".join(i.args for i in instructions if i.keyword == "RUN")
    assert '".[server,kubernetes]"' in installs
    assert "torch" not in installs  # control_plane never imports torch
    exposed = {int(i.args) for i in final if i.keyword == "EXPOSE"}
    assert exposed == {Settings().api_port} == {values()["api"]["port"]}
    assert dockerfile.env(final)["PLATFORM_API_HOST"] == "0.0.0.0"
    (check,) = [i for i in final if i.keyword == "HEALTHCHECK"]
    assert "platform-healthcheck" in check.args


def test_worker_image() -> None:
    instructions = dockerfile.parse(WORKER)
    final = dockerfile.final_stage(instructions)
    base = next(i for i in instructions if i.keyword == "FROM").args
    default_base = dockerfile.build_args(instructions)["CUDA_IMAGE"]
    assert base == "${CUDA_IMAGE}" and default_base.startswith("nvidia/cuda:")
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    (pin,) = [d for d in pyproject["project"]["optional-dependencies"]["worker"] if "torch" in d]
    assert pin == f"torch=={dockerfile.build_args(instructions)['TORCH_VERSION']}"
    assert dockerfile.build_args(instructions)["EXTRAS"] == "worker"
    installs = " ".join(i.args for i in instructions if i.keyword == "RUN")
    assert '".[${EXTRAS}]"' in installs
    port = int(dockerfile.env(final)["PLATFORM_WORKER_METRICS_PORT"])
    exposed = {int(i.args) for i in final if i.keyword == "EXPOSE"}
    assert exposed == {port} == {values()["workers"]["metricsPort"]}
    assert any(i.keyword == "HEALTHCHECK" for i in final)


def test_image_names_agree_with_the_chart_and_compose() -> None:
    """Each Dockerfile names the image it builds (`-t NAME` in its header); the chart's values
    and compose use those names."""
    tags = {}
    for path in DOCKERFILES:
        (tag,) = re.findall(r"docker build -f \S+ -t (\S+) \.", path.read_text())
        tags[path.name] = tag
    image = values()["image"]
    assert image["controlPlane"]["repository"] == tags["control-plane.Dockerfile"]
    assert image["worker"]["repository"] == tags["worker.Dockerfile"]
    compose = yaml.safe_load((INFRA / "compose" / "compose.yaml").read_text())
    for name, service in compose["services"].items():
        dockerfile_path = service.get("build", {}).get("dockerfile")
        if dockerfile_path == "infra/docker/control-plane.Dockerfile":
            assert service["image"] == tags["control-plane.Dockerfile"], name


def _entrypoint_roles() -> dict[str, str]:
    text = (DOCKER / "entrypoint.sh").read_text()
    return dict(re.findall(r"^  (\w+)\)\n(.*?);;", text, flags=re.M | re.S))


def test_entrypoint_roles() -> None:
    roles = _entrypoint_roles()
    assert set(roles) == {"api", "reconciler", "celery", "migrate", "s3"}
    assert "python -m control_plane.api" in roles["api"]
    assert "python -m control_plane.reconcile" in roles["reconciler"]
    # the queue the API dispatches control tasks to
    assert f"-Q {CONTROL_QUEUE} " in roles["celery"]
    subprocess.run(["sh", "-n", str(DOCKER / "entrypoint.sh")], check=True)


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, DOCKER / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_healthcheck_probes_what_each_role_serves() -> None:
    target = _load("healthcheck").target
    assert target(["python", "-m", "control_plane.api"], {}) == "http://127.0.0.1:8000/healthz"
    assert (
        target(["python", "-m", "control_plane.api"], {"PLATFORM_API_PORT": "9000"})
        == "http://127.0.0.1:9000/healthz"
    )
    worker = ["python", "-m", "worker", "--worker-id", "w1", "--pool"]
    env = {"PLATFORM_WORKER_METRICS_HOST": "0.0.0.0", "PLATFORM_WORKER_METRICS_PORT": "9400"}
    assert target(worker, env) == "http://127.0.0.1:9400/metrics"
    assert target(worker, {"PLATFORM_WORKER_METRICS_PORT": "0"}) is None
    # Celery's command line says "worker" too, but it is not `-m worker`
    celery = ["/opt/venv/bin/python", "/opt/venv/bin/celery", "-A", "x", "worker"]
    assert target(celery, env) is None
    assert target(["python", "-m", "control_plane.reconcile"], env) is None


def test_the_vllm_worker_image_is_the_worker_image_with_the_tested_vllm() -> None:
    """The vLLM image (a build argument of the worker image) names the vLLM version the tests
    run (the Makefile's vLLM environment), and installs it beside the pinned torch."""
    text = WORKER.read_text()
    (version,) = re.findall(r"--build-arg VLLM_VERSION=(\S+)", text)
    (tested,) = re.findall(r"^VLLM_VERSION \?= (\S+)$", (REPO / "Makefile").read_text(), re.M)
    assert version == tested
    (run,) = [
        i.args for i in dockerfile.parse(WORKER) if "VLLM_VERSION" in i.args and i.keyword == "RUN"
    ]
    assert '"vllm==${VLLM_VERSION}"' in run and '"torch==${TORCH_VERSION}"' in run
