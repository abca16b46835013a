"""Failure reasons as users read them: whole up to a generous bound (common/reasons.py), with
the tenant's own store:// paths instead of the platform's internal ones
(domain/user_paths.py)."""

from __future__ import annotations

from common.reasons import CUT_MARK, MAX_REASON_CHARS, bounded_reason
from control_plane.domain.user_paths import OTHER_TENANT, for_tenant, store_paths

BUCKET = "platform-store"


def test_a_long_reason_is_kept_whole_far_past_a_line() -> None:
    reason = "LoaderError: " + "tensor model.layers.31.mlp.down_proj.weight: " * 12
    assert len(reason) > 400
    assert bounded_reason(reason) == reason


def test_only_a_reason_past_the_bound_is_cut_and_says_so() -> None:
    reason = "x" * (MAX_REASON_CHARS + 50)
    cut = bounded_reason(reason)
    assert len(cut) == MAX_REASON_CHARS and cut.endswith(CUT_MARK)
    assert bounded_reason("x" * MAX_REASON_CHARS) == "x" * MAX_REASON_CHARS


def test_the_tenants_internal_paths_become_its_store_paths() -> None:
    reason = (
        "FileNotFoundError: s3://platform-store/tenants/ten_1/models/demo/model.safetensors: "
        "no such key (under s3://platform-store/tenants/ten_1/models/demo/)"
    )
    assert store_paths(reason, BUCKET, "ten_1") == (
        "FileNotFoundError: store://models/demo/model.safetensors: no such key "
        "(under store://models/demo/)"
    )


def test_another_tenants_path_is_hidden_and_other_buckets_are_left_alone() -> None:
    reason = "s3://platform-store/tenants/ten_2/x and s3://their-bucket/tenants/ten_2/y"
    shown = store_paths(reason, BUCKET, "ten_1")
    assert "ten_2/x" not in shown and shown.startswith(OTHER_TENANT + "x")
    assert "s3://their-bucket/tenants/ten_2/y" in shown


def test_for_tenant_maps_then_bounds() -> None:
    long = "s3://platform-store/tenants/ten_1/" + "a" * (MAX_REASON_CHARS * 2)
    shown = for_tenant(long, BUCKET, "ten_1")
    assert shown.startswith("store://a") and len(shown) == MAX_REASON_CHARS
