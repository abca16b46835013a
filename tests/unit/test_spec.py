"""The typed deployment spec: defaults in one place, shared with the API's pydantic shape."""

from __future__ import annotations

from control_plane.api.schemas import DeploymentSpec
from control_plane.domain.spec import Spec, default_of


def test_missing_keys_take_the_defaults_and_unknown_keys_are_ignored() -> None:
    spec = Spec.from_doc({"name": "d", "model": "s3://m/", "future_knob": 1, "max_workers": None})
    assert spec == Spec(name="d", model="s3://m/")
    assert (spec.max_boot_s, spec.execution_timeout_s, spec.max_workers) == (600.0, 600.0, 1)


def test_values_are_coerced_to_their_types() -> None:
    spec = Spec.from_doc({"name": "d", "model": "m", "max_boot_s": 30, "min_workers": "2"})
    assert spec.max_boot_s == 30.0 and isinstance(spec.max_boot_s, float)
    assert spec.min_workers == 2


def test_the_api_shape_has_the_same_defaults() -> None:
    doc = DeploymentSpec(name="d", model="s3://m/").model_dump()
    assert Spec.from_doc(doc) == Spec(name="d", model="s3://m/", defaults=doc["defaults"])
    assert default_of("scaledown_window_s") == 60.0


def test_scaling_policy_comes_from_the_spec() -> None:
    policy = Spec.from_doc({"name": "d", "model": "m", "max_workers": 4}).scaling_policy()
    assert (policy.min_workers, policy.max_workers, policy.target_concurrency) == (0, 4, 1)
