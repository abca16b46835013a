"""Control characters where a single line is expected (a URL, a name, a region, a key) are
refused with 422 before anything is stored: a NUL or CRLF in a webhook URL used to be stored
and fail every delivery, and a trailing newline passed `re.match(...$)`. A file path whose
percent-escapes are not UTF-8 is refused instead of stored under U+FFFD."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.integration.abuse.conftest import Rows, send
from tests.integration.api_helpers import SPEC, deploy, h

REPO = Path(__file__).resolve().parents[3]
CONTROLS = ["\x00", "\r\n", "\n", "\t", "\x1b", "\x7f"]
CREDENTIAL = {"bucket": "tenant-bucket", "access_key_id": "AKIA1", "secret_access_key": "s"}
URL = "https://hooks.example.com/a"


def _cases() -> list[tuple[str, str, dict[str, Any], str]]:
    cases = []
    for c in CONTROLS:
        bad = URL + c + "b"
        cases += [
            ("POST", "/v1/deployments/demo/jobs", {"input": {"prompt": "x"}, "webhook": bad},
             "webhook"),
            ("POST", "/v1/batches", {"deployment": "demo", "inputs": [{"prompt": "x"}],
                                     "webhook": bad}, "webhook"),
            ("POST", "/v1/webhooks/endpoints", {"url": bad}, "url"),
            ("POST", "/v1/storage-credentials", {**CREDENTIAL, "endpoint_url": bad},
             "endpoint_url"),
        ]  # fmt: skip
    return cases


TRAILING_NEWLINE = [
    ("POST", "/v1/deployments", {**SPEC, "name": "other\n"}, "name"),
    ("POST", "/v1/storage-credentials", {**CREDENTIAL, "region": "eu-west-1\n"}, "region"),
    ("POST", "/v1/storage-credentials", {**CREDENTIAL, "bucket": "tenant-bucket\n"}, "bucket"),
    ("POST", "/v1/storage-credentials", {**CREDENTIAL, "access_key_id": "AKIA1\n"},
     "access_key_id"),
    ("POST", "/v1/keys", {"name": "ci\n"}, "name"),
    ("POST", "/v1/tenants", {"name": "t\r\nX-Injected: 1"}, "name"),
    ("POST", "/v1/batches", {"deployment": "demo\n", "inputs": [{"prompt": "x"}]}, "deployment"),
]  # fmt: skip


@pytest.mark.parametrize(("method", "path", "body", "field"), _cases() + TRAILING_NEWLINE)
def test_a_control_character_in_a_single_line_field_is_refused(
    client: TestClient,
    keys: dict[str, str],
    rows: Rows,
    method: str,
    path: str,
    body: dict[str, Any],
    field: str,
) -> None:
    deploy(client, keys["a"])
    before = rows.counts()
    r = send(client, method, path, body, keys["a"])
    assert r.status_code == 422, r.text
    problem = r.json()
    assert [e["field"] for e in problem["errors"]] == [field], problem
    assert "control character" in problem["detail"]
    assert rows.counts() == before


def test_text_fields_keep_their_newlines(client: TestClient, keys: dict[str, str]) -> None:
    """Prompts and stop sequences are text, not single lines: newlines and tabs stay."""
    deploy(client, keys["a"], defaults={"stop": ["\n\n"]})
    body = {"input": {"prompt": "a\tb\r\nc", "stop": ["\n"]}}
    r = client.post("/v1/deployments/demo/jobs", json=body, headers=h(keys["a"]))
    assert r.status_code == 202, r.text


def test_a_file_path_that_is_not_utf8_is_refused(
    client: TestClient, keys: dict[str, str], rows: Rows
) -> None:
    before = rows.counts()
    for method in ("PUT", "DELETE"):
        r = client.request(method, "/v1/files/a%ff", content=b"x", headers=h(keys["a"]))
        assert r.status_code == 422, (method, r.text)
        assert r.json()["errors"] == [
            {"field": "path", "message": "percent-escapes must spell UTF-8"}
        ]
    listed = client.get("/v1/files", headers=h(keys["a"])).json()["data"]
    assert listed == []
    assert rows.counts() == before
    # an escape that is UTF-8 (U+00E9) is a file name like any other
    assert client.put("/v1/files/caf%C3%A9", content=b"x", headers=h(keys["a"])).status_code == 201


def _match_with_dollar(path: Path, root: Path = REPO) -> list[str]:
    """Calls `P.match(...)` on a pattern `P = re.compile("...$")`, or `re.match("...$", ...)`:
    `$` also matches before a trailing newline, so `"name\\n"` passes such a check."""
    tree = ast.parse(path.read_text())
    dollar = {
        t.id
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)
        for t in node.targets
        if isinstance(t, ast.Name) and _compiles_dollar(node.value)
    }
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        target = node.func.value
        if node.func.attr != "match" or not isinstance(target, ast.Name):
            continue
        if target.id in dollar or (target.id == "re" and _ends_with_dollar(node)):
            found.append(f"{path.relative_to(root)}:{node.lineno}")
    return found


def _compiles_dollar(call: ast.Call) -> bool:
    f = call.func
    is_compile = isinstance(f, ast.Attribute) and f.attr == "compile"
    return is_compile and _ends_with_dollar(call)


def _ends_with_dollar(call: ast.Call) -> bool:
    first = call.args[0] if call.args else None
    pattern = first.value if isinstance(first, ast.Constant) else None
    if isinstance(pattern, bytes):
        return pattern.endswith(b"$")
    return isinstance(pattern, str) and pattern.endswith("$")


def test_no_pattern_is_anchored_with_match_and_dollar() -> None:
    sources = [p for d in ("control_plane", "common", "sdk", "worker", "loader")
               for p in (REPO / d).rglob("*.py")]  # fmt: skip
    assert len(sources) > 100
    assert [hit for p in sources for hit in _match_with_dollar(p)] == []


def test_the_check_finds_match_with_dollar(tmp_path: Path) -> None:
    bad = tmp_path / "probe.py"
    bad.write_text('import re\nP = re.compile(r"^[a-z]+$")\nok = P.match(x)\nre.match("a$", y)\n')
    assert _match_with_dollar(bad, tmp_path) == ["probe.py:3", "probe.py:4"]
