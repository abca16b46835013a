import json

from hypothesis import given, settings
from hypothesis import strategies as st

from control_plane.api.body_limit import MAX_JSON_DEPTH, json_depth


def test_depth_counts_arrays_and_objects_and_skips_strings() -> None:
    assert json_depth(b'"plain"') == 0
    assert json_depth(b"{}") == 1
    assert json_depth(b'{"a": [1, {"b": 2}]}') == 3
    # brackets inside strings, escaped quotes included, do not count
    assert json_depth(b'{"s": "[[[[\\" {{{{", "t": ["]]]"]}') == 2
    assert json_depth(b"[" * (MAX_JSON_DEPTH + 1) + b"]" * (MAX_JSON_DEPTH + 1)) > MAX_JSON_DEPTH


def _depth(value: object) -> int:
    if isinstance(value, list):
        return 1 + max((_depth(v) for v in value), default=0)
    if isinstance(value, dict):
        return 1 + max((_depth(v) for v in value.values()), default=0)
    return 0


TEXT = st.text(alphabet='[]{}"\\ab\n', max_size=6)
VALUES = st.recursive(
    st.none() | st.integers() | TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3),
    max_leaves=25,
)


@settings(max_examples=300, deadline=None)
@given(value=VALUES, ensure_ascii=st.booleans())
def test_depth_is_the_parsed_depth_of_any_json(value: object, ensure_ascii: bool) -> None:
    """Strings full of brackets, quotes and backslashes never shift the count."""
    assert json_depth(json.dumps(value, ensure_ascii=ensure_ascii).encode()) == _depth(value)
