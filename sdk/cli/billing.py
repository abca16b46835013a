"""`platform billing records`: where every second of worker time went, and what it cost."""

from __future__ import annotations

from decimal import Decimal, InvalidOperation
from typing import Annotated, Any

import typer

from sdk.cli import _common
from sdk.cli._format import CURRENCY, money

app = typer.Typer(help="Billing: per-second records of worker time.", no_args_is_help=True)


@app.command("records")
def records(
    deployment: Annotated[str | None, typer.Option(help="Only this deployment.")] = None,
    worker: Annotated[str | None, typer.Option(help="Only this worker id.")] = None,
    phase: Annotated[
        str | None, typer.Option(help="Only this phase: boot, load, warm, busy, idle, drain.")
    ] = None,
    limit: Annotated[int, typer.Option(help="At most this many records.", min=1)] = 100,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """List billing records (one per worker phase) and their total.

    \b
    Example:
        platform billing records --deployment demo --phase busy
    """
    with _common.client() as client:
        rows = client.billing.records(
            deployment=deployment, worker_id=worker, phase=phase, limit=limit
        )
    if as_json:
        _common.print_json(rows)
        return
    keys = ("worker_id", "deployment", "phase", "start", "seconds", "rate_per_s", "amount")
    headers = ("worker", *keys[1:-2], f"rate_per_s ({CURRENCY})", f"amount ({CURRENCY})")
    _common.print_table(headers, [tuple(row.get(key) for key in keys) for row in rows])
    typer.echo(f"total: {money(total_amount(rows))} over {len(rows)} records")


@app.command("check")
def check(
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Check that the books balance: records tile every worker's life, job shares add up.

    Exits 1 when drift is found (each issue is listed).

    \b
    Example:
        platform billing check
    """
    with _common.client() as client:
        result = client.billing.check()
    if as_json:
        _common.print_json(result)
    elif result.get("ok"):
        typer.echo("ok: billing records, workers and job shares agree")
    else:
        for issue in result.get("issues", []):
            typer.echo(" ".join(f"{k}={v}" for k, v in issue.items()))
    if not result.get("ok"):
        raise typer.Exit(1)


def total_amount(rows: list[dict[str, Any]]) -> Decimal:
    """Sum of the `amount` decimal strings. NOTE: Decimal, never float, for money."""
    total = Decimal(0)
    for row in rows:
        try:
            total += Decimal(str(row.get("amount", "0")))
        except InvalidOperation:
            continue
    return total
