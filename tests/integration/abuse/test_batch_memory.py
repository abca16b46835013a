"""A batch's memory is bounded by its line limit, not by what the client sends: a million lines
(inline JSONL, an `inputs` list, an `input_uri` object) are refused on reaching line
`batch_max_lines + 1`, the rest never parsed, and the request's peak memory stays a small
multiple of the body it received."""

from __future__ import annotations

import json
import tracemalloc
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from control_plane.api import batch_lines
from control_plane.errors import InvalidRequest
from control_plane.settings import Settings
from tests.integration.abuse.conftest import Rows
from tests.integration.api_helpers import deploy, h

MILLION = 1_000_000
LINE = {"prompt": "x"}
LIMIT = Settings().batch_max_lines  # the platform's default, which these settings keep


class Counted:
    """An iterable that counts how many of its items were taken."""

    def __init__(self, items: Iterable[Any]) -> None:
        self.items = items
        self.taken = 0

    def __iter__(self) -> Iterator[Any]:
        for item in self.items:
            self.taken += 1
            yield item


def _million_lines() -> str:
    return (json.dumps(LINE) + "\n") * MILLION


@pytest.mark.parametrize(
    ("lines", "raw"),
    [
        (lambda: batch_lines.text_lines(_million_lines()), True),
        (lambda: batch_lines.byte_lines(_million_lines().encode()), True),
        (lambda: iter([LINE] * MILLION), False),
    ],
    ids=["input_jsonl", "input_uri", "inputs"],
)
def test_the_parser_stops_reading_at_the_limit(lines: Callable[[], Any], raw: bool) -> None:
    counted = Counted(lines())
    with pytest.raises(InvalidRequest) as refused:
        batch_lines.parse(counted, "x", LIMIT, raw=raw)
    assert counted.taken == LIMIT + 1
    assert refused.value.extra["limit"] == LIMIT
    assert f"the limit is {LIMIT}" in refused.value.detail


def test_blank_lines_do_not_count_and_the_limit_itself_is_taken() -> None:
    text = ("\n" + json.dumps(LINE) + "\r\n") * LIMIT + "\n\n"
    assert len(batch_lines.parse(batch_lines.text_lines(text), "x", LIMIT, raw=True)) == LIMIT


def _peak_bytes(call: Callable[[], Any]) -> tuple[Any, int]:
    """`call()`'s result and the most memory Python held during it beyond what it held
    before (every thread: the app runs on the test client's)."""
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        result = call()
        return result, tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()


def _refused_at_the_limit(r: Any, field: str) -> None:
    assert r.status_code == 422, r.text[:500]
    problem = r.json()
    assert problem["limit"] == LIMIT and f"the limit is {LIMIT}" in problem["detail"]
    assert problem["errors"][0]["field"] == field


# Inline JSONL: the request holds the body as received, as JSON text, and twice more in the
# request's hash (an idempotency key's replay check): ~4x the body (3.9x measured). An object
# read from storage: its bytes and the lines up to the limit (1.4x). The parsed lines stop at
# the limit (10,000 small objects: ~3 MB). Before lines were counted as they were read, a
# million lines took 60-110x their size (the JSON depth guard alone 100x an inline body).
MAX_BODY_PEAK = 6
MAX_OBJECT_PEAK = 3


def test_a_million_inline_jsonl_lines_are_refused_within_a_few_times_the_body(
    client: TestClient, keys: dict[str, str], rows: Rows
) -> None:
    deploy(client, keys["a"])
    before = rows.counts()
    body = json.dumps({"deployment": "demo", "input_jsonl": _million_lines()}).encode()
    headers = {**h(keys["a"]), "Content-Type": "application/json"}
    r, peak = _peak_bytes(lambda: client.post("/v1/batches", content=body, headers=headers))
    _refused_at_the_limit(r, "input_jsonl")
    assert peak < MAX_BODY_PEAK * len(body), (peak, len(body))
    assert rows.counts() == before


def test_a_million_line_input_object_is_refused_within_a_few_times_its_size(
    client: TestClient, keys: dict[str, str], rows: Rows
) -> None:
    deploy(client, keys["a"])
    data = _million_lines().encode()
    r = client.put("/v1/files/big.jsonl", content=data, headers=h(keys["a"]))
    assert r.status_code == 201, r.text
    before = rows.counts()
    body = {"deployment": "demo", "input_uri": "store://big.jsonl"}
    r, peak = _peak_bytes(lambda: client.post("/v1/batches", json=body, headers=h(keys["a"])))
    _refused_at_the_limit(r, "input_uri")
    # the object is read whole (within PLATFORM_BATCH_MAX_INPUT_BYTES), its lines one by one
    assert peak < MAX_OBJECT_PEAK * len(data), (peak, len(data))
    assert rows.counts() == before


def test_a_million_element_inputs_list_costs_no_more_than_its_json(
    client: TestClient, keys: dict[str, str], rows: Rows
) -> None:
    """The JSON body is parsed whole by the framework (bounded by the body limit); nothing
    after that may copy or validate the million elements."""
    deploy(client, keys["a"])
    before = rows.counts()
    body = json.dumps({"deployment": "demo", "inputs": [LINE] * MILLION}).encode()
    _, parsing = _peak_bytes(lambda: json.loads(body))
    headers = {**h(keys["a"]), "Content-Type": "application/json"}
    r, peak = _peak_bytes(lambda: client.post("/v1/batches", content=body, headers=headers))
    _refused_at_the_limit(r, "inputs")
    # the body as received and its parse; before, the list was copied twice more and a
    # (line, value) pair built per element: over twice the parse alone
    assert peak < parsing + 2 * len(body), (peak, parsing, len(body))
    assert rows.counts() == before
