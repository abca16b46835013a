"""Structured outputs through the live embedded platform (real worker, demo model with random
weights): with the `openai` client (`response_format` json_schema and json_object, vLLM's
`structured_outputs`), streamed and not, and on `/run`; every output parses and validates.
A schema or grammar that cannot compile is the caller's error before anything is queued."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import openai
import pytest

from sdk import Client
from tests.e2e.openai_helpers import deployed, openai_client

pytestmark = pytest.mark.e2e

MODEL = "structured"
MESSAGES: Any = [{"role": "user", "content": "Describe a pet as JSON."}]
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 10},
        "kind": {"enum": ["cat", "dog"]},
        "legs": {"type": "integer", "minimum": 0, "maximum": 8},
        "toys": {"type": "array", "items": {"type": "string", "maxLength": 6}, "maxItems": 2},
        "owner": {
            "type": "object",
            "properties": {"vip": {"type": "boolean"}},
            "required": ["vip"],
            "additionalProperties": False,
        },
    },
    "required": ["name", "kind", "legs", "toys", "owner"],
    "additionalProperties": False,
}
FORMAT: Any = {
    "type": "json_schema",
    "json_schema": {"name": "pet", "schema": SCHEMA, "strict": True},
}


@pytest.fixture(scope="module")
def api(platform: dict[str, Any], demo_model: Path) -> dict[str, Any]:
    return deployed(platform, demo_model, MODEL)


@pytest.fixture(scope="module")
def oai(api: dict[str, Any]) -> openai.OpenAI:
    return openai_client(api)


def test_json_schema_outputs_validate_plain_streamed_and_sampled(oai: openai.OpenAI) -> None:
    for seed in range(3):
        resp = oai.chat.completions.create(
            model=MODEL,
            messages=MESSAGES,
            max_tokens=300,
            temperature=1.0,
            seed=seed,
            response_format=FORMAT,
            n=2,
        )
        for choice in resp.choices:
            assert choice.finish_reason == "stop", choice
            jsonschema.validate(json.loads(choice.message.content or ""), SCHEMA)
    text = ""
    for chunk in oai.chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        max_tokens=300,
        temperature=0,
        response_format=FORMAT,
        stream=True,
    ):
        for c in chunk.choices:
            text += c.delta.content or ""
    jsonschema.validate(json.loads(text), SCHEMA)
    anything = oai.chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        max_tokens=300,
        temperature=0,
        response_format={"type": "json_object"},
    )
    if anything.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(anything.choices[0].message.content or ""), dict)


def test_regex_grammar_and_choice_through_structured_outputs(oai: openai.OpenAI) -> None:
    regex = oai.completions.create(
        model=MODEL,
        prompt="Code:",
        max_tokens=20,
        temperature=1.0,
        seed=1,
        extra_body={"structured_outputs": {"regex": "[A-Z]{3}-[0-9]{4}"}},
    )
    assert re.fullmatch(r"[A-Z]{3}-[0-9]{4}", regex.choices[0].text)
    choice = oai.chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        max_tokens=10,
        temperature=1.0,
        seed=2,
        extra_body={"structured_outputs": {"choice": ["sunny", "rainy"]}},
    )
    assert choice.choices[0].message.content in ("sunny", "rainy")
    # with log-probabilities: the alternatives the grammar masks out cannot be sampled, and
    # say so as OpenAI does (-9999.0: JSON has no -Infinity)
    masked = oai.completions.create(
        model=MODEL,
        prompt="Weather:",
        max_tokens=10,
        temperature=0.0,
        logprobs=3,
        extra_body={"structured_outputs": {"choice": ["sunny", "rainy"]}},
    )
    assert masked.choices[0].text in ("sunny", "rainy")
    assert masked.choices[0].logprobs is not None
    alternatives = [
        lp for top in masked.choices[0].logprobs.top_logprobs or [] for lp in top.values()
    ]
    assert alternatives and -9999.0 in alternatives
    assert all(-9999.0 <= lp <= 0 for lp in alternatives)
    grammar = 'start: "(" n ("," n)* ")"\nn: /[0-9]/\n'
    lark = oai.completions.create(
        model=MODEL,
        prompt="Tuple:",
        max_tokens=30,
        temperature=1.0,
        seed=3,
        extra_body={"structured_outputs": {"grammar": grammar}},
    )
    assert re.fullmatch(r"\(\d(,\d)*\)", lark.choices[0].text)


def test_run_takes_structured_and_bad_grammars_are_refused(api: dict[str, Any]) -> None:
    client = Client(base_url=api["url"], api_key=api["api_key"])
    text = client.run(
        MODEL, input={"prompt": "Pet:", "max_tokens": 300, "structured": {"json": SCHEMA}}
    )
    jsonschema.validate(json.loads(text), SCHEMA)
    headers = {"Authorization": f"Bearer {api['api_key']}"}
    bad = httpx.post(
        f"{api['url']}/v1/deployments/{MODEL}/run",
        json={"input": {"prompt": "x", "structured": {"regex": "[a-"}}},
        headers=headers,
    )
    assert bad.status_code == 422 and "input.structured" in bad.text
    before = httpx.get(f"{api['url']}/v1/jobs?deployment={MODEL}", headers=headers).json()
    client_oai = openai.OpenAI(base_url=api["url"] + "/v1", api_key=api["api_key"], max_retries=0)
    broken = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nope"}}}
    with pytest.raises(openai.BadRequestError) as refused:
        client_oai.chat.completions.create(
            model=MODEL,
            messages=MESSAGES,
            response_format=broken,  # type: ignore[arg-type]
        )
    assert refused.value.param == "response_format"
    after = httpx.get(f"{api['url']}/v1/jobs?deployment={MODEL}", headers=headers).json()
    assert len(after["data"]) == len(before["data"])  # nothing was queued
