"""The official Kubernetes JSON schemas (kubernetes_validate's bundled copies, strict: an
unknown field is an error) as the test API server's admission: what fails here, a real API
server refuses too."""

from __future__ import annotations

import functools
import re
from typing import Any

import jsonschema
import kubernetes_validate
from kubernetes_validate import utils as kv_utils

from tests.k8s.errors import ApiError

K8S_VERSION = "1.33"  # the schemas objects are checked against (a recent release)


@functools.cache
def _validator(api_version: str, kind: str) -> jsonschema.protocols.Validator:
    """The strict schema of one kind, built once (validating through kubernetes_validate's
    `validate` parses the definitions file on every call)."""
    from referencing import Registry, Resource

    version = [v for v in kv_utils.all_versions() if kv_utils.major_minor(v) == K8S_VERSION][-1]
    directory = f"kubernetes-json-schema/v{version}-local-strict"
    group = re.sub(r"^([^./]*)(?:\.[^/]*)?/", r"\1-", api_version)
    schema = kv_utils.schema_contents(f"{directory}/{kind.lower()}-{group}.json", version)
    definitions = kv_utils.schema_contents(f"{directory}/_definitions.json", version)
    registry = Resource.from_contents(definitions) @ (Resource.from_contents(schema) @ Registry())
    return jsonschema.validators.Draft202012Validator(schema, registry=registry)


def validate(obj: dict[str, Any]) -> None:
    """422 unless `obj` is a valid object of its kind (strict: no unknown fields)."""
    try:
        validator = _validator(obj["apiVersion"], obj["kind"])
    except (KeyError, FileNotFoundError, kubernetes_validate.SchemaNotFoundError) as exc:
        raise ApiError(400, "BadRequest", f"unknown kind: {exc}") from None
    errors = sorted(validator.iter_errors(obj), key=lambda e: list(e.absolute_path))
    if errors:
        where = ".".join(str(p) for p in errors[0].absolute_path)
        raise ApiError(
            422, "Invalid", f"{obj['kind']} is invalid: {where}: {errors[0].message}"
        ) from None
