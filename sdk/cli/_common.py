"""What every command shares: the client, output (table / plain / JSON) and exit codes.

Exit codes: 0 ok; 1 the user's mistake (bad input or flags, a 4xx, a model error);
2 the platform's or the network's (5xx, connection refused, a job the platform failed).
No command exits with another code.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, NoReturn

import httpx
import typer

from sdk import Client
from sdk._base import is_missing_route
from sdk._errors import APIConnectionError, APIError, ModelError, PlatformError
from sdk.cli._format import problem_lines, short_time

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
        made = Client(base_url=st.url, api_key=st.api_key, **options)
    except PlatformError as e:  # an unreadable config file: the user's to fix
        fail(e.message)
    if options.get("transport") is None and not _proxy_configured():
        # Said at the first refused connection, not after the whole retry budget.
        notice = RetryNotice(httpx.HTTPTransport(), made.base_url, options["max_unavailable_s"])
        made.close()
        made = Client(base_url=st.url, api_key=st.api_key, **{**options, "transport": notice})
    return made


def _proxy_configured() -> bool:
    # NOTE: an explicit transport makes httpx ignore the *_PROXY variables; keep its own then.
    return any(k.lower() in ("http_proxy", "https_proxy", "all_proxy") for k in os.environ)


class RetryNotice(httpx.BaseTransport):
    """Says once on stderr that the platform is unreachable and is being retried."""

    def __init__(self, inner: httpx.BaseTransport, url: str, budget_s: float) -> None:
        self._inner, self._url, self._budget_s = inner, url, budget_s
        self.told = False

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        try:
            return self._inner.handle_request(request)
        except (httpx.ConnectError, httpx.ConnectTimeout) as e:
            if not self.told and self._budget_s > 0:
                self.told = True
                info(
                    f"cannot reach the platform at {self._url} ({e or type(e).__name__}); "
                    f"retrying for up to {self._budget_s:.0f} s..."
                )
            raise

    def close(self) -> None:
        self._inner.close()


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
    if isinstance(error, APIError):
        head, *items = problem_lines(error.status, error.title, error.detail, error.errors)
        typer.echo(f"error: {head}", err=True)
        if is_missing_route(error):
            path = error.problem.get("instance") or "this endpoint"
            info(f"  the platform does not serve {path}: it is older than this CLI")
        for item in items:
            typer.echo(item, err=True)
    else:
        typer.echo(f"error: {error.message}", err=True)
    if isinstance(error, APIConnectionError) and isinstance(
        error.__cause__, httpx.ConnectError | httpx.ConnectTimeout
    ):
        info(
            "  is the platform running? Start one here with `platform up`, or point the CLI "
            "at yours: PLATFORM_URL, --url or `platform login`"
        )
    if error.job_id:
        typer.echo(f"job: {error.job_id}", err=True)
    return exit_code(error)


# --- output ---------------------------------------------------------------------------------


def is_tty() -> bool:
    return sys.stdout.isatty()


def print_json(value: Any) -> None:
    typer.echo(json.dumps(value, indent=2, default=str))


# A column whose cells are all this narrow (numbers, states) is never wrapped in a table.
NO_WRAP_WIDTH = 12
# A wrapped column is given at least this many characters before a table gives up on columns
# (a time, "2024-05-01 12:00:00", wraps at its space into two lines of 10).
MIN_FOLD_WIDTH = 10


def print_table(columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    """A rich table on a terminal; tab-separated lines (header first) when piped."""
    cells = [[_cell(v) for v in row] for row in rows]
    if is_tty():
        _print_rich_table(columns, [[short_time(c) for c in row] for row in cells])
        return
    typer.echo("\t".join(columns))
    for row in cells:
        typer.echo("\t".join(row))


def _print_rich_table(columns: Sequence[str], cells: list[list[str]]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    widths = [
        max([len(column), *(len(row[i]) for row in cells)]) for i, column in enumerate(columns)
    ]
    # NOTE: ids (the first column) must stay whole to be copied, and short cells (numbers,
    # states, times) read badly broken: those keep their width; the long text of the other
    # columns wraps ("fold") to fit, never cut with "…".
    keep = [i == 0 or w <= NO_WRAP_WIDTH for i, w in enumerate(widths)]
    # two spaces between columns, none at the edges
    least = sum(w if k else min(w, MIN_FOLD_WIDTH) for w, k in zip(widths, keep, strict=True))
    least += 2 * (len(columns) - 1)
    if least > console.width:
        # Too many columns for this terminal: one block of `column: value` lines per row.
        for n, row in enumerate(cells):
            if n:
                typer.echo("")
            print_fields(list(zip(columns, row, strict=True)))
        return
    table = Table(box=None, header_style="bold", pad_edge=False)
    for column, width, kept in zip(columns, widths, keep, strict=True):
        table.add_column(column, overflow="fold", min_width=width if kept else None)
    for row in cells:
        table.add_row(*row)
    console.print(table)


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
