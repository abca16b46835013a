"""The typed deployment spec: defaults in one place, shared with the API's pydantic shape."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from control_plane.api.schemas import DeploymentSpec
from control_plane.domain.scaling.policy import ScalingPolicy
from control_plane.domain.spec import Spec, default_of
from sdk._models import SPEC_FIELDS
from sdk.cli.manifest import SPEC_TYPES


def test_missing_keys_take_the_defaults_and_unknown_keys_are_ignored() -> None:
    spec = Spec.from_doc(
        {"name": "d", "model": "store://m/", "future_knob": 1, "max_workers": None}
    )
    assert spec == Spec(name="d", model="store://m/")
    assert (spec.max_boot_s, spec.execution_timeout_s, spec.max_workers) == (600.0, 600.0, 1)


def test_values_are_coerced_to_their_types() -> None:
    spec = Spec.from_doc({"name": "d", "model": "m", "max_boot_s": 30, "min_workers": "2"})
    assert spec.max_boot_s == 30.0 and isinstance(spec.max_boot_s, float)
    assert spec.min_workers == 2


def test_the_api_shape_has_the_same_defaults() -> None:
    doc = DeploymentSpec(name="d", model="store://m/").model_dump()
    assert Spec.from_doc(doc) == Spec(name="d", model="store://m/", defaults=doc["defaults"])
    assert default_of("scaledown_window_s") == 60.0


def test_scaling_policy_comes_from_the_spec() -> None:
    policy = Spec.from_doc({"name": "d", "model": "m", "max_workers": 4}).scaling_policy()
    assert (policy.min_workers, policy.max_workers, policy.target_concurrency) == (0, 4, 1)
    assert (policy.scaledown_window_s, policy.max_boot_s) == (60, 600)
    assert policy.cold_penalty_s == ScalingPolicy().cold_penalty_s, "the autoscaler's default"
    assert policy.queue_wait_s == ScalingPolicy().queue_wait_s, "the autoscaler's default"
    doc = {
        "name": "d",
        "model": "m",
        "min_workers": 1,
        "max_workers": 3,
        "target_concurrency": 8,
        "scaledown_window_s": 120,
        "max_boot_s": 90,
        "cold_penalty_s": 5,
        "queue_wait_s": 7,
    }
    assert Spec.from_doc(doc).scaling_policy() == ScalingPolicy(
        min_workers=1,
        max_workers=3,
        target_concurrency=8,
        scaledown_window_s=120.0,
        max_boot_s=90.0,
        cold_penalty_s=5.0,
        queue_wait_s=7.0,
    )


def test_cold_penalty_is_a_non_negative_number_of_seconds() -> None:
    assert default_of("cold_penalty_s") == ScalingPolicy().cold_penalty_s
    assert DeploymentSpec(name="d", model="store://m/", cold_penalty_s=0).cold_penalty_s == 0
    with pytest.raises(ValidationError, match="cold_penalty_s"):
        DeploymentSpec(name="d", model="store://m/", cold_penalty_s=-1)
    spec = Spec.from_doc({"name": "d", "model": "m", "cold_penalty_s": 30})
    assert spec.cold_penalty_s == 30.0 and isinstance(spec.cold_penalty_s, float)


def test_queue_wait_is_a_non_negative_number_of_seconds() -> None:
    assert default_of("queue_wait_s") == ScalingPolicy().queue_wait_s
    assert DeploymentSpec(name="d", model="store://m/").queue_wait_s == ScalingPolicy().queue_wait_s
    assert DeploymentSpec(name="d", model="store://m/", queue_wait_s=0).queue_wait_s == 0
    assert DeploymentSpec(name="d", model="store://m/", queue_wait_s=3_600).queue_wait_s == 3_600
    for bad in (-1, 3_601):
        with pytest.raises(ValidationError, match="queue_wait_s"):
            DeploymentSpec(name="d", model="store://m/", queue_wait_s=bad)
    spec = Spec.from_doc({"name": "d", "model": "m", "queue_wait_s": 5})
    assert spec.queue_wait_s == 5.0 and isinstance(spec.queue_wait_s, float)
    assert spec.scaling_policy().queue_wait_s == 5.0
    off = Spec.from_doc({"name": "d", "model": "m", "queue_wait_s": 0})
    assert off.scaling_policy().queue_wait_s == 0.0, "0 is kept, not taken for unset"
    # a document written before the field existed takes the default
    assert Spec.from_doc({"name": "d", "model": "m"}).queue_wait_s == ScalingPolicy().queue_wait_s


def test_the_sdk_and_the_cli_know_every_spec_field() -> None:
    fields = set(DeploymentSpec.model_fields)
    assert set(SPEC_FIELDS) == fields, "sdk/_models.py::SPEC_FIELDS"
    assert set(SPEC_TYPES) == fields, "sdk/cli/manifest.py::SPEC_TYPES"
