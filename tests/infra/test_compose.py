"""infra/compose/compose.yaml against the Compose Specification's JSON schema (the copy that
check-jsonschema ships, Apache-2.0, from github.com/compose-spec/compose-spec), and what one GPU
host needs of it."""

from __future__ import annotations

import json
from importlib import resources
from typing import Any

import jsonschema
import pytest
import yaml

from tests.infra.chart import INFRA

COMPOSE = INFRA / "compose" / "compose.yaml"


def schema_validator() -> jsonschema.protocols.Validator:
    vendor = resources.files("check_jsonschema.builtin_schemas.vendor")
    schema = json.loads((vendor / "compose-spec.json").read_text())
    cls = jsonschema.validators.validator_for(schema)
    return cls(schema, format_checker=cls.FORMAT_CHECKER)


def compose() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())
    return data


def test_compose_file_matches_the_compose_spec() -> None:
    errors = [
        f"{list(e.absolute_path)}: {e.message}" for e in schema_validator().iter_errors(compose())
    ]
    assert errors == []


def test_the_schema_catches_a_misspelt_key() -> None:
    bad = compose()
    bad["services"]["api"]["enviroment"] = {}
    with pytest.raises(jsonschema.ValidationError):
        schema_validator().validate(bad)


def test_every_part_of_the_platform_is_there() -> None:
    services = compose()["services"]
    assert set(services) == {"redis", "postgres", "s3", "migrate", "api", "celery", "reconciler"}
    commands = {name: s.get("command") for name, s in services.items()}
    assert commands["api"] == ["api"] and commands["celery"] == ["celery"]
    assert commands["reconciler"][-1] == "reconciler"


def test_redis_keeps_an_append_only_file() -> None:
    redis = compose()["services"]["redis"]
    command = redis["command"]
    assert command[command.index("--appendonly") + 1] == "yes"
    assert any(v.endswith(":/data") for v in redis["volumes"])


def test_the_reconciler_holds_the_gpus_and_runs_local_workers() -> None:
    reconciler = compose()["services"]["reconciler"]
    (device,) = reconciler["deploy"]["resources"]["reservations"]["devices"]
    assert device["capabilities"] == ["gpu"] and device["driver"] == "nvidia"
    assert reconciler["environment"]["PLATFORM_PROVIDER"] == "local"
    # workers are its children: the image needs the worker stack and the server stack
    assert reconciler["build"]["dockerfile"] == "infra/docker/worker.Dockerfile"
    assert set(reconciler["build"]["args"]["EXTRAS"].split(",")) == {"server", "worker"}


def test_processes_start_after_the_migration() -> None:
    services = compose()["services"]
    for name in ("api", "celery", "reconciler"):
        assert services[name]["depends_on"]["migrate"]["condition"] == (
            "service_completed_successfully"
        )
    assert services["migrate"]["command"] == ["migrate"]


def test_the_reconciler_and_celery_serve_their_metrics_inside_the_project() -> None:
    from control_plane.settings import Settings

    services = compose()["services"]
    for name, port in (("reconciler", 9410), ("celery", 9411)):
        env = services[name]["environment"]
        settings = Settings(
            metrics_host=env["PLATFORM_METRICS_HOST"], metrics_port=env["PLATFORM_METRICS_PORT"]
        )
        assert (settings.metrics_host, settings.metrics_port) == ("0.0.0.0", port)
        # reachable by a scraper on the project's network, never published on the host
        assert services[name]["expose"] == [str(port)]
        assert "ports" not in services[name]
