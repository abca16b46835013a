"""What every command shares: the client, output (table / plain / JSON) and exit codes.

Exit codes: 0 ok; 1 the user's mistake (bad input or flags, a 4xx, a model error);
2 the platform's or the network's (5xx, connection refused, a job the platform failed).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, NoReturn

import typer

from sdk import Client
from sdk._base import is_missing_route
from sdk._errors import APIError, ModelError, PlatformError

EXIT_OK = 0
EXIT_USER = 1
EXIT_PLATFORM = 2


@dataclass
class CliState:
    """Options of the root command, handed to every subcommand through click's context."""

    url: str | None = None  # --url; else the SDK's PLATFORM_URL / config file / default
    api_key: str | None = None  # --api-key; likewise
    # Extra Client(...) arguments: tests inject `transport`, `sleep`, `max_retries` here.
    client_options: dict[str, Any] = field(default_factory=dict)


# Set by the root command's callback for the subcommand it runs. NOTE: a ContextVar rather
# than click's current context, because typer >= 0.29 vendors its own copy of click.
_state: ContextVar[CliState] = ContextVar("platform_cli_state")


def set_state(value: CliState) -> None:
    _state.set(value)


def state() -> CliState:
    return _state.get(CliState())


# A person at a terminal is told the platform is unreachable after this long, where a program
# using the SDK rides out a longer restart (its default: 30 s): an API restart on one machine
# takes a few seconds, and a platform that is not up at all should not cost half a minute.
CLI_MAX_UNAVAILABLE_S = 8.0


def client() -> Client:
    """A Client configured from the root options (use it in a `with` block)."""
    st = state()
    options = {"max_unavailable_s": CLI_MAX_UNAVAILABLE_S, **st.client_options}
    try:
        return Client(base_url=st.url, api_key=st.api_key, **options)
    except PlatformError as e:  # an unreadable config file: the user's to fix
        fail(e.message)


def fail(message: str, code: int = EXIT_USER) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def exit_code(error: PlatformError) -> int:
    """ModelError and 4xx are the user's; 5xx, connection failures, failed jobs the platform's."""
    if isinstance(error, ModelError):
        return EXIT_USER
    if isinstance(error, APIError) and error.status < 500:
        return EXIT_USER
    return EXIT_PLATFORM


def report(error: PlatformError) -> int:
    """Print an SDK error for a person (stderr) and return the exit code it means."""
    typer.echo(f"error: {error.message}", err=True)
    if isinstance(error, APIError) and is_missing_route(error):
        path = error.problem.get("instance") or "this endpoint"
        typer.echo(f"  the platform does not serve {path}: it is older than this CLI", err=True)
    if isinstance(error, APIError):
        for item in error.errors:
            typer.echo(f"  {item.get('field', '?')}: {item.get('message', '')}", err=True)
    if error.job_id:
        typer.echo(f"job: {error.job_id}", err=True)
    return exit_code(error)


# --- output ---------------------------------------------------------------------------------


def is_tty() -> bool:
    return sys.stdout.isatty()


def print_json(value: Any) -> None:
    typer.echo(json.dumps(value, indent=2, default=str))


def print_table(columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    """A rich table on a terminal; tab-separated lines (header first) when piped."""
    cells = [[_cell(v) for v in row] for row in rows]
    if is_tty():
        from rich.console import Console
        from rich.table import Table

        table = Table(box=None, header_style="bold")
        for column in columns:
            # NOTE: ids must stay whole to be copied: wrap a long cell, never cut it with "…".
            table.add_column(column, overflow="fold")
        for row in cells:
            table.add_row(*row)
        Console().print(table)
        return
    typer.echo("\t".join(columns))
    for row in cells:
        typer.echo("\t".join(row))


def print_csv(columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    """RFC 4180 CSV (header first) on stdout; None is an empty cell."""
    import csv
    import io

    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(columns)
    writer.writerows([["" if v is None else v for v in row] for row in rows])
    typer.echo(out.getvalue(), nl=False)


def info(message: str) -> None:
    """A note for the person at the terminal (stderr), never mixed into the data on stdout."""
    typer.echo(message, err=True)


def print_fields(pairs: Sequence[tuple[str, Any]]) -> None:
    """`key: value` lines, keys aligned."""
    width = max((len(k) for k, _ in pairs), default=0)
    for key, value in pairs:
        typer.echo(f"{key + ':':<{width + 1}} {_cell(value)}")


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, dict):
        return " ".join(f"{k}={v}" for k, v in value.items()) or "-"
    if isinstance(value, list):
        return ",".join(str(v) for v in value) or "-"
    return str(value)


def workers_summary(workers: dict[str, int]) -> str:
    return " ".join(f"{state}={n}" for state, n in sorted(workers.items()) if n) or "none"
