"""`platform usage`: what was spent, grouped by deployment, day, hour, API key or phase.

The data comes from `GET /v1/usage/summary`. The billing records (`GET /v1/billing/records`)
are summed here instead, by the same groups, where the summary cannot answer: for one
deployment (the summary has no such filter), or on a platform older than the summary.
Either way a small bar chart shows the cost by phase.
"""

from __future__ import annotations

from collections.abc import Sequence
from decimal import Decimal, InvalidOperation
from typing import Annotated, Any

import typer

from sdk import Client
from sdk._base import is_missing_route
from sdk._errors import NotFoundError
from sdk._routes import GROUP_BY
from sdk.cli import _common
from sdk.cli._format import CURRENCY, money

# Billing phases in the order a worker lives them.
PHASES = ("boot", "load", "warm", "busy", "idle", "drain")
BAR_WIDTH = 30


def usage(
    by: Annotated[
        str,
        typer.Option("--by", help=f"Group by: {', '.join(GROUP_BY)}.", show_default=True),
    ] = "deployment",
    deployment: Annotated[str | None, typer.Option(help="Only this deployment.")] = None,
    since: Annotated[
        str | None, typer.Option(help="From this time on (ISO 8601, e.g. 2024-05-01T00:00:00Z).")
    ] = None,
    until: Annotated[str | None, typer.Option(help="Before this time (ISO 8601).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    as_csv: Annotated[bool, typer.Option("--csv", help="Print CSV.")] = False,
) -> None:
    """Show billed seconds and cost, grouped, with a bar chart of cost by phase.

    Money and seconds are exact decimals; a segment of worker time counts for the day and
    hour it started.

    \b
    Examples:
        platform usage
        platform usage --by day --since 2024-05-01T00:00:00Z --deployment demo
        platform usage --by phase --csv > cost.csv
    """
    if by not in GROUP_BY:
        _common.fail(f"--by: {by!r} is not one of {', '.join(GROUP_BY)}")
    if as_json and as_csv:
        _common.fail("--json and --csv cannot be combined")
    chart = not (as_json or as_csv)
    with _common.client() as client:
        source, rows, by_phase = collect(client, by, deployment, since, until, with_phases=chart)
    columns = _columns(by, rows)
    if as_json:
        _common.print_json({"group_by": by, "source": source, "data": rows, "total": total(rows)})
        return
    if as_csv:
        _common.print_csv(columns, [[row.get(c) for c in columns] for row in _named(rows, by)])
        return
    headers = [f"amount ({CURRENCY})" if c == "amount" else c for c in columns]
    _common.print_table(headers, [[row.get(c) for c in columns] for row in _named(rows, by)])
    sums = total(rows)
    typer.echo(f"total: {money(sums['amount'])} for {sums['seconds']} s")
    if by_phase:
        typer.echo("")
        typer.echo(f"cost by phase ({CURRENCY})")
        for line in bar_chart(by_phase, tty=_common.is_tty()):
            typer.echo(line)


def collect(
    client: Client,
    by: str,
    deployment: str | None,
    since: str | None,
    until: str | None,
    *,
    with_phases: bool,
) -> tuple[str, list[dict[str, Any]], list[dict[str, Any]] | None]:
    """(source, rows grouped `by`, rows by phase or None); rows carry "key", "seconds", "amount"."""
    if deployment is None:
        try:
            rows = client.usage.summary(by, since, until)
            by_phase = None
            if with_phases:
                by_phase = rows if by == "phase" else client.usage.summary("phase", since, until)
            return "usage_summary", rows, by_phase
        except NotFoundError as e:
            if not is_missing_route(e):
                raise
            _common.info("(this platform has no /v1/usage/summary: summing its billing records)")
    if by == "api_key":
        _common.fail("--by api_key needs the usage summary: leave out --deployment")
    records = client.billing.records(deployment=deployment, since=since, until=until)
    by_phase = summarize(records, "phase") if with_phases else None
    return "billing_records", summarize(records, by), by_phase


def summarize(records: Sequence[dict[str, Any]], by: str) -> list[dict[str, Any]]:
    """Billing records summed per group. NOTE: Decimal throughout: money is never a float."""
    groups: dict[str, dict[str, Any]] = {}
    for record in records:
        key = _group_of(record, by)
        row = groups.setdefault(
            key, {"key": key, "seconds": Decimal(0), "amount": Decimal(0), "records": 0}
        )
        # Billed seconds (boot and load stop at max_boot_s), as the summary counts them.
        row["seconds"] += decimal(record.get("billed_seconds", record.get("seconds")))
        row["amount"] += decimal(record.get("amount"))
        row["records"] += 1
    return [
        {
            **groups[k],
            "seconds": _fixed(groups[k]["seconds"]),
            "amount": _fixed(groups[k]["amount"]),
        }
        for k in sorted(groups, key=_phase_order)
    ]


def total(rows: Sequence[dict[str, Any]]) -> dict[str, str]:
    seconds = sum((decimal(r.get("seconds")) for r in rows), Decimal(0))
    amount = sum((decimal(r.get("amount")) for r in rows), Decimal(0))
    return {"seconds": _fixed(seconds), "amount": _fixed(amount)}


def bar_chart(rows: Sequence[dict[str, Any]], *, tty: bool) -> list[str]:
    """One line per group: label, a bar proportional to the amount, the amount."""
    ordered = sorted(rows, key=lambda r: _phase_order(str(r.get("key"))))
    amounts = [(str(r.get("key")), decimal(r.get("amount"))) for r in ordered]
    top = max((a for _, a in amounts), default=Decimal(0))
    if top <= 0:
        return ["  (nothing billed yet)"]
    label_width = max(len(k) for k, _ in amounts)
    block = "█" if tty else "#"
    lines = []
    for key, amount in amounts:
        cells = int((amount / top * BAR_WIDTH).to_integral_value()) if amount > 0 else 0
        bar = block * max(cells, 1 if amount > 0 else 0)
        lines.append(f"  {key:<{label_width}}  {bar:<{BAR_WIDTH}}  {_fixed(amount)}")
    return lines


def decimal(value: object) -> Decimal:
    try:
        return Decimal(str(value)) if value is not None else Decimal(0)
    except InvalidOperation:
        return Decimal(0)


def _fixed(value: Decimal) -> str:
    """Fixed-point text, never "7.8E-7"."""
    return f"{value:f}"


def _phase_order(key: str) -> tuple[int, str]:
    """Phases in the order a worker lives them; any other key after them, alphabetically."""
    return (PHASES.index(key), key) if key in PHASES else (len(PHASES), key)


def _group_of(record: dict[str, Any], by: str) -> str:
    start = str(record.get("start") or "")
    if by == "day":
        return start[:10] or "?"
    if by == "hour":
        return f"{start[:13]}:00Z" if start else "?"
    return str(record.get(by) or "?")


def _columns(by: str, rows: Sequence[dict[str, Any]]) -> list[str]:
    extra = sorted({k for r in rows for k in r} - {"key", "group", by, "seconds", "amount"})
    return [by, "seconds", "amount", *extra]


def _named(rows: Sequence[dict[str, Any]], by: str) -> list[dict[str, Any]]:
    """Rows with their group under the column's name (`deployment`, `day`, ...)."""
    return [{**r, by: r.get("key")} for r in rows]
