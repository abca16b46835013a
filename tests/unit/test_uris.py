"""Storage URIs a tenant supplies: one meaning each, no way out of a prefix (domain/uris.py)."""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from control_plane.domain import uris
from control_plane.domain.uris import Location, UriError, parse


@pytest.mark.parametrize(
    ("uri", "expected"),
    [
        ("store://models/demo/", Location("store", "", "models/demo/")),
        ("store://in/batch.jsonl", Location("store", "", "in/batch.jsonl")),
        ("s3://my-bucket/ckpt/", Location("s3", "my-bucket", "ckpt/")),
        ("s3://b.example/a/b.safetensors", Location("s3", "b.example", "a/b.safetensors")),
        ("file:///srv/models/x", Location("host", "", "/srv/models/x")),
        ("/srv/models/x/", Location("host", "", "/srv/models/x/")),
        ("hf://org/repo", Location("hf", "org/repo", "")),
        ("hf://org/repo@v1.0", Location("hf", "org/repo", "v1.0")),
        # a literal '%' that hides nothing is a legal key character
        ("store://a/100%-done.txt", Location("store", "", "a/100%-done.txt")),
    ],
)
def test_parse_valid(uri: str, expected: Location) -> None:
    assert parse(uri) == expected


@pytest.mark.parametrize(
    ("uri", "reason"),
    [
        ("store://../other/x", "'..'"),
        ("store://a/../../x", "'..'"),
        ("store://a/./x", "'.'"),
        ("store://a//x", "empty segment"),
        ("store://", "names no key"),
        ("store://a/%2e%2e/x", "percent-encoded"),
        ("store://a/%2E%2e/x", "percent-encoded"),
        ("store://a%2fb", "percent-encoded"),
        ("store://a/%252e%252e/x", "percent-encoded"),
        ("store://a\\..\\x", "backslash"),
        ("store://a/\x00x", "control"),
        ("s3://bkt/a/../x", "'..'"),
        ("s3://Bad_Bucket/x", "bucket name"),
        ("s3://ab/x", "bucket name"),
        ("s3://bucket", "names no key"),
        ("s3://a..b/x", "bucket name"),
        ("file://relative/x", "absolute path"),
        ("file:///etc/../etc/passwd", "'..'"),
        ("/srv/../etc/passwd", "'..'"),
        ("hf://justone", "hf://org/repo"),
        ("hf://org/../repo", "hf://org/repo"),
        ("hf://org/repo@../main", "revision"),
        ("gs://bucket/x", "expected store://"),
        ("models/demo", "expected store://"),
        ("store://" + "a" * 3000, "longer than"),
    ],
)
def test_parse_refuses(uri: str, reason: str) -> None:
    with pytest.raises(UriError) as caught:
        parse(uri)
    assert reason in caught.value.reason


def test_store_key_is_under_the_tenant_prefix() -> None:
    assert uris.store_key("ten_1", "models/demo/") == "tenants/ten_1/models/demo/"


segment = st.text(
    alphabet=st.characters(codec="utf-8", categories=("L", "N", "P", "S", "Zs")), max_size=12
)


@given(st.lists(segment, min_size=1, max_size=6), st.booleans())
def test_a_parsed_store_key_never_climbs_out(parts: list[str], prefix: bool) -> None:
    """Whatever a client sends, an accepted key has no dot or empty segment and no hidden
    separator, so `tenants/<id>/` + key stays under `tenants/<id>/`."""
    uri = "store://" + "/".join(parts) + ("/" if prefix else "")
    try:
        loc = parse(uri)
    except UriError:
        return
    inner = loc.key.rstrip("/").split("/")
    assert all(s not in ("", ".", "..") for s in inner)
    assert "\\" not in loc.key
    assert "%2e" not in loc.key.lower() and "%2f" not in loc.key.lower()
    assert parse(loc.uri) == loc  # the canonical spelling means the same place


@given(st.text(max_size=60))
def test_parse_raises_only_uri_error(text: str) -> None:
    for uri in (text, "store://" + text, "s3://bucket/" + text, "/" + text, "hf://" + text):
        with contextlib.suppress(UriError):  # anything else propagates and fails the test
            parse(uri)
