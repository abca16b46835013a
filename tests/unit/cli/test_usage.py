"""`platform usage`: the usage summary, or billing records summed when the platform has no summary
(or one deployment is asked for), as a table, CSV or JSON, with a bar chart by phase."""

from __future__ import annotations

import csv
import io
import json

import httpx

from sdk.cli.usage import bar_chart, summarize
from tests.unit.cli.mock_api import Routes, invoke, ok

RECORDS = [
    {
        "deployment": "demo",
        "phase": "boot",
        "start": "2024-05-01T10:00:00Z",
        "seconds": "2.000",
        "amount": "0.000200000",
    },
    {
        "deployment": "demo",
        "phase": "busy",
        "start": "2024-05-01T10:00:02Z",
        "seconds": "4.000",
        "amount": "0.000400000",
    },
    {
        "deployment": "chat",
        "phase": "busy",
        "start": "2024-05-02T09:00:00Z",
        "seconds": "1.000",
        "amount": "0.000100000",
    },
]


def test_usage_falls_back_to_billing_records_when_the_summary_is_missing() -> None:
    # An older platform: the route itself is missing (FastAPI's bare "Not Found").
    no_route = ok({"title": "Not Found", "status": 404, "detail": "Not Found"}, 404)
    routes = Routes(
        {
            "GET /v1/usage/summary": no_route,
            "GET /v1/billing/records": ok({"data": RECORDS, "next_cursor": None}),
        }
    )
    result = invoke(["usage"], routes)
    assert result.exit_code == 0, result.output
    assert "demo\t6.000\t0.000600000\t2" in result.stdout
    assert "chat\t1.000\t0.000100000\t1" in result.stdout
    assert "total: 0.000700000 USD for 7.000 s" in result.stdout
    assert "cost by phase" in result.stdout
    bars = [line for line in result.stdout.splitlines() if "#" in line]
    assert [b.split()[0] for b in bars] == ["boot", "busy"]
    assert bars[1].count("#") == 30 and bars[0].count("#") == 12
    assert "summing its billing records" in result.stderr

    by_day = json.loads(invoke(["usage", "--by", "day", "--json"], routes).stdout)
    assert by_day["source"] == "billing_records"
    assert [(r["key"], r["amount"]) for r in by_day["data"]] == [
        ("2024-05-01", "0.000600000"),
        ("2024-05-02", "0.000100000"),
    ]
    assert invoke(["usage", "--by", "api_key"], routes).exit_code == 1


def test_usage_reads_the_summary_when_the_platform_has_it() -> None:
    by_dep = {"data": [{"group": "demo", "seconds": "6.000", "amount": "0.0006", "jobs": 3}]}
    by_phase = {"data": [{"group": "busy", "seconds": "4", "amount": "0.0004"}]}

    def summary(request: httpx.Request) -> httpx.Response:
        group = request.url.params["group_by"]
        return ok(by_phase if group == "phase" else by_dep)

    transport = httpx.MockTransport(summary)
    result = invoke(["usage", "--csv"], transport=transport)
    assert result.exit_code == 0, result.output
    rows = list(csv.reader(io.StringIO(result.stdout)))
    assert rows == [["deployment", "seconds", "amount", "jobs"], ["demo", "6.000", "0.0006", "3"]]
    result = invoke(["usage"], transport=transport)
    assert "busy" in result.stdout.split("cost by phase")[1]


def test_usage_of_one_deployment_sums_its_billing_records() -> None:
    routes = Routes({"GET /v1/billing/records": ok({"data": RECORDS[:2], "next_cursor": None})})
    args = ["usage", "--by", "hour", "--deployment", "demo", "--since", "2024-05-01T00:00:00Z"]
    result = invoke([*args, "--json"], routes)
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["data"][0]["key"] == "2024-05-01T10:00Z"
    params = routes.requests[0].url.params
    assert params["deployment"] == "demo" and params["since"] == "2024-05-01T00:00:00Z"
    assert routes.called() == ["GET /v1/billing/records"], "the summary has no deployment filter"


def test_summarize_and_bar_chart_are_exact() -> None:
    rows = summarize(RECORDS * 3, "phase")
    assert rows == [
        {"key": "boot", "seconds": "6.000", "amount": "0.000600000", "records": 3},
        {"key": "busy", "seconds": "15.000", "amount": "0.001500000", "records": 6},
    ]
    assert bar_chart([{"key": "idle", "amount": "0"}], tty=False) == ["  (nothing billed yet)"]
    tiny = bar_chart([{"key": "a", "amount": "1"}, {"key": "b", "amount": "0.0001"}], tty=True)
    assert tiny[1].count("█") == 1, "a non-zero amount always shows"
