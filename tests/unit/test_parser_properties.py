"""Hypothesis over the parsers of what clients write: a deployment manifest (`platform
deploy -f`), a batch's JSONL input (`POST /v1/batches`) and the SDK's reading of a JSONL
answer. Whatever the text, each gives a value or its own typed error — never another
exception, which the API would answer with a 500 and the CLI with a traceback."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from control_plane.api import batch_lines
from control_plane.errors import InvalidRequest
from sdk._base import parse_jsonl_line
from sdk._errors import PlatformError
from sdk.cli.manifest import ManifestError, check_fields, load_manifest

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# JSON values as a client might send them: nested, oddly typed, with the real field names
KEYS = st.sampled_from(
    ["prompt", "max_tokens", "temperature", "top_p", "stop", "seed", "name", "model",
     "min_workers", "max_workers", "defaults", "accelerator", "x"]
) | st.text(max_size=8)  # fmt: skip
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**12), max_value=10**12)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20)
)
JSON = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(KEYS, inner, max_size=5),
    max_leaves=20,
)


@SETTINGS
@given(text=st.text(max_size=300))
def test_any_text_is_a_manifest_or_a_manifest_error(text: str) -> None:
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "deploy.yaml"
        path.write_text(text, encoding="utf-8")
        try:
            manifest = load_manifest(path)
        except ManifestError as e:
            assert e.problems and all(p.message for p in e.problems)
            return
        assert all(isinstance(p.message, str) for p in check_fields(manifest.spec))


@SETTINGS
@given(spec=st.dictionaries(KEYS, JSON, max_size=8))
@example(spec={":": 0, "": 1, "a b": 2})  # found by a CI run: a key that is only punctuation
def test_any_yaml_mapping_is_checked_field_by_field(spec: dict[str, Any]) -> None:
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "deploy.yaml"
        path.write_text(yaml.safe_dump(spec), encoding="utf-8")
        try:
            manifest = load_manifest(path)
        except ManifestError:
            return  # e.g. keys that repeat once stringified
        for p in check_fields(manifest.spec):
            assert p.message and not str(p).startswith(":")  # a name, even for an empty key


def _batch_lines(text: str) -> None:
    batch_lines.parse(batch_lines.text_lines(text), "input_jsonl", max_lines=100, raw=True)
    batch_lines.parse(batch_lines.byte_lines(text.encode()), "input_uri", max_lines=100, raw=True)


@SETTINGS
@given(text=st.text(max_size=400))
def test_any_jsonl_text_is_inputs_or_a_422(text: str) -> None:
    try:
        _batch_lines(text)
    except InvalidRequest as e:
        assert str(e)


@SETTINGS
@given(values=st.lists(JSON, min_size=1, max_size=6), depth=st.integers(0, 3000))
def test_json_lines_of_any_shape_and_depth_are_inputs_or_a_422(
    values: list[Any], depth: int
) -> None:
    lines = [json.dumps(v) for v in values] + ["[" * depth + "]" * depth]
    try:
        _batch_lines("\n".join(lines))
    except InvalidRequest as e:
        assert str(e)


@SETTINGS
@given(line=st.text(max_size=200) | JSON.map(json.dumps))
def test_the_sdk_reads_any_jsonl_line_or_says_why_not(line: str) -> None:
    try:
        value = parse_jsonl_line(line, "results")
    except PlatformError as e:
        assert str(e).startswith("results: ")
        return
    assert value is None or isinstance(value, dict)
