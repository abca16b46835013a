"""`platform logs <job-id | worker-id | deployment>`: the platform's log lines of a job, a
worker or a deployment, and with --follow new ones as they are written."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

from sdk.cli import _common

# The ids a line shows after its message, in this order (the platform's own log fields).
SHOWN_FIELDS = ("job_id", "attempt", "worker_id", "deployment_id", "status", "reason")


def logs(
    target: Annotated[
        str,
        typer.Argument(
            help="A job id (job_...), a worker id (wrk_...) or a deployment's name.",
            show_default=False,
        ),
    ],
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Keep printing new lines (Ctrl-C stops).")
    ] = False,
    since: Annotated[
        str | None,
        typer.Option(help="Lines from this time on: ISO 8601 (…Z) or an age (300, 15m, 2h, 1d)."),
    ] = None,
    limit: Annotated[
        int | None,
        typer.Option(help="At most this many lines (the last ones) [default: 1000].", min=1),
    ] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print each line as the platform wrote it (JSON).")
    ] = False,
) -> None:
    """Show the log lines of a job, a worker or a deployment, oldest first.

    A job's lines come from the workers that ran it and from the platform; a worker's log is
    whole (its crash output included); a deployment's covers its recent workers. Prompts and
    outputs are never in them.

    \b
    Examples:
        platform logs job_01HX...
        platform logs demo --since 15m --follow
        platform logs wrk_01HX... --json
    """
    with _common.client() as client:
        if not follow:
            for line in client.logs(target, since=since, limit=limit):
                typer.echo(render(line, as_json))
            return
        try:
            with client.logs.follow(target, since=since, limit=limit) as lines:
                for line in lines:
                    typer.echo(render(line, as_json))
        except KeyboardInterrupt:
            pass  # the way to stop a follow: not an error


def render(line: dict[str, Any], as_json: bool) -> str:
    """One line for a terminal: `time LEVEL component: message [ids]`, or its JSON."""
    if as_json:
        return json.dumps(line, separators=(",", ":"), default=str)
    if line.get("raw"):
        return f"{line.get('timestamp') or '-'} {'':5} output: {line.get('message', '')}"
    fields = " ".join(f"{k}={line[k]}" for k in SHOWN_FIELDS if line.get(k) is not None)
    text = (
        f"{line.get('timestamp', '-')} {line.get('level', ''):5} "
        f"{line.get('component', '')}: {line.get('message', '')}"
    )
    if fields:
        text += f" [{fields}]"
    if line.get("exc"):
        text += "\n" + str(line["exc"]).rstrip("\n")
    return text
