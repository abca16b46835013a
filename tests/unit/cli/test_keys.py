"""`platform keys`: create (the secret alone on stdout), list, and revoke by id, key or prefix."""

from __future__ import annotations

import json

import httpx

from tests.unit.cli.mock_api import Routes, invoke, ok

KEY_ROW = {"id": "key_1", "name": "ci", "prefix": "pk_ab", "scopes": ["run"], "revoked_at": None}


def test_keys_create_prints_only_the_secret_on_stdout() -> None:
    routes = Routes({"POST /v1/keys": ok({**KEY_ROW, "key": "pk_ab_secret"}, 201)})
    result = invoke(["keys", "create", "--name", "ci", "--scope", "run"], routes)
    assert result.exit_code == 0, result.output
    assert result.stdout == "pk_ab_secret\n"
    assert "key_1" in result.stderr and "not shown again" in result.stderr
    assert routes.body("POST /v1/keys") == {"name": "ci", "scopes": ["run"]}

    result = invoke(["keys", "create", "--json"], routes)
    assert json.loads(result.stdout)["key"] == "pk_ab_secret"


def test_keys_create_refuses_an_unknown_scope_locally() -> None:
    routes = Routes({})
    result = invoke(["keys", "create", "--scope", "root"], routes)
    assert result.exit_code == 1 and "unknown root" in result.stderr
    assert routes.requests == []


def test_keys_list_and_revoke() -> None:
    routes = Routes(
        {"GET /v1/keys": ok({"data": [KEY_ROW]}), "DELETE /v1/keys/key_1": httpx.Response(204)}
    )
    result = invoke(["keys", "list"], routes)
    assert result.exit_code == 0 and "key_1\tci\tpk_ab\trun" in result.stdout
    assert json.loads(invoke(["keys", "list", "--json"], routes).stdout) == [KEY_ROW]
    result = invoke(["keys", "revoke", "key_1"], routes)
    assert result.exit_code == 0 and "revoked key key_1" in result.stdout
    result = invoke(["keys", "revoke", "key_2"], routes)
    assert result.exit_code == 1, "a 404 is the user's error"


def test_keys_revoke_by_the_key_or_its_prefix() -> None:
    other = {**KEY_ROW, "id": "key_2", "prefix": "pk_cd"}
    routes = Routes(
        {
            "GET /v1/keys": ok({"data": [other, KEY_ROW]}),
            "DELETE /v1/keys/key_1": httpx.Response(204),
        }
    )
    assert "revoked key key_1" in invoke(["keys", "revoke", "pk_ab_se_cr_et"], routes).stdout
    assert "revoked key key_1" in invoke(["keys", "revoke", "pk_ab"], routes).stdout
    result = invoke(["keys", "revoke", "pk_zz_secret"], routes)
    assert result.exit_code == 1 and "no API key" in result.stderr
