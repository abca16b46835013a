from control_plane.api.body_limit import MAX_JSON_DEPTH, json_depth


def test_depth_counts_arrays_and_objects_and_skips_strings() -> None:
    assert json_depth(b'"plain"') == 0
    assert json_depth(b"{}") == 1
    assert json_depth(b'{"a": [1, {"b": 2}]}') == 3
    # brackets inside strings, escaped quotes included, do not count
    assert json_depth(b'{"s": "[[[[\\" {{{{", "t": ["]]]"]}') == 2
    assert json_depth(b"[" * (MAX_JSON_DEPTH + 1) + b"]" * (MAX_JSON_DEPTH + 1)) > MAX_JSON_DEPTH
