"""The deployment material speaks the code's language: every PLATFORM_* variable it sets is a
real setting, ports are the settings' defaults, probe paths are routes of the API."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from starlette.routing import Match

from control_plane.api.app import create_app
from control_plane.settings import Settings
from tests.infra.chart import CHART, INFRA, VARIANTS, containers, find, objects, render
from worker.settings import WorkerSettings

SDK = Path(__file__).resolve().parents[2] / "sdk"
SDK_NAME = re.compile(r'"(PLATFORM_[A-Z0-9_]+)"')
NAME = re.compile(r"\bPLATFORM_[A-Z0-9_]+\b")


def setting_names() -> set[str]:
    """Every PLATFORM_* variable a control-plane or worker process reads (LogSettings and
    TraceSettings are bases of both), and those the SDK and CLI read (PLATFORM_URL, ...)."""
    fields = {*Settings.model_fields, *WorkerSettings.model_fields}
    sdk = {n for p in SDK.rglob("*.py") for n in SDK_NAME.findall(p.read_text())}
    return {f"PLATFORM_{f.upper()}" for f in fields} | sdk


def material() -> dict[str, str]:
    """Files that set variables, with their text; the chart's as rendered with every variant."""
    files = {
        p.relative_to(INFRA).as_posix(): p.read_text()
        for p in [
            *INFRA.glob("docker/*"),
            *INFRA.glob("compose/*"),
            CHART / "values.yaml",
            *CHART.glob("templates/*"),
        ]
        if p.is_file()
    }
    for variant, values in VARIANTS.items():
        for r in render(values):
            files[f"{variant}:{r.template}"] = r.text
    return files


def test_every_platform_variable_is_a_setting() -> None:
    known = setting_names()
    unknown = {
        (path, name)
        for path, text in material().items()
        for name in NAME.findall(text)
        if name not in known
    }
    assert unknown == set()


def test_the_check_would_catch_a_typo() -> None:
    assert "PLATFORM_REDIS_URL" in setting_names()
    assert "PLATFORM_REDIS_URI" not in setting_names()


def test_ports_are_the_settings_defaults() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["api"]["port"] == Settings().api_port
    objs = objects()
    (api,) = containers(find(objs, "Deployment", "platform-api"))
    assert api["ports"][0]["containerPort"] == Settings().api_port
    compose = yaml.safe_load((INFRA / "compose" / "compose.yaml").read_text())
    published = compose["services"]["api"]["ports"][0]
    assert published.endswith(f":{Settings().api_port}")
    assert compose["services"]["migrate"]  # the same image as the API


def _probe_paths() -> set[str]:
    """The API's probe paths and the ServiceMonitor's (the other processes' /metrics ports
    answer every path: tests/infra/test_helm_processes.py)."""
    paths = set()
    for obj in objects(VARIANTS["monitoring-and-policies"]):
        api = obj["metadata"]["name"].endswith("-api")
        if obj["kind"] in ("Deployment", "StatefulSet") and api:
            for c in containers(obj):
                for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
                    if "httpGet" in c.get(probe, {}):
                        paths.add(c[probe]["httpGet"]["path"])
        if obj["kind"] == "ServiceMonitor":
            paths.update(e["path"] for e in obj["spec"]["endpoints"])
    return paths


def _routed(app: object, path: str) -> bool:
    scope = {"type": "http", "method": "GET", "path": path, "root_path": "", "headers": []}
    return any(r.matches(scope)[0] == Match.FULL for r in app.router.routes)  # type: ignore[attr-defined]


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory) -> object:
    # Built as the API process builds it; nothing is connected until a request comes.
    db = tmp_path_factory.mktemp("app") / "platform.db"
    return create_app(Settings(database_url=f"sqlite:///{db}"))


def test_probe_paths_are_routes_of_the_api(app: object) -> None:
    paths = _probe_paths()
    assert {"/healthz", "/readyz", "/metrics"} <= paths
    assert [p for p in paths if not _routed(app, p)] == []
    assert not _routed(app, "/no-such-probe")


def test_compose_healthcheck_and_docker_healthcheck_agree() -> None:
    text = (INFRA / "compose" / "compose.yaml").read_text()
    assert "/usr/local/bin/platform-healthcheck" in text
    dockerfile = (INFRA / "docker" / "control-plane.Dockerfile").read_text()
    assert "/usr/local/bin/platform-healthcheck" in dockerfile


def test_operations_doc_covers_each_failure() -> None:
    docs = (Path(__file__).resolve().parents[2] / "docs" / "operations.md").read_text()
    headings = {
        line.lstrip("#").strip().lower() for line in docs.splitlines() if line.startswith("#")
    }
    for failure in (
        "api pod dies",
        "reconciler leader dies",
        "celery worker dies",
        "redis restarts",
        "postgresql unavailable",
        "a worker pod dies",
        "a node is drained",
    ):
        assert failure in headings
