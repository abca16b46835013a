"""`platform jobs get|list|cancel`: look at and cancel jobs."""

from __future__ import annotations

from typing import Annotated

import typer

from sdk._models import JobView
from sdk.cli import _common

app = typer.Typer(help="Look at and cancel jobs.", no_args_is_help=True)

JobId = Annotated[str, typer.Argument(help="Job id (job_...).", show_default=False)]
AsJson = Annotated[bool, typer.Option("--json", help="Print JSON (includes input and output).")]


@app.command("get")
def get(job_id: JobId, as_json: AsJson = False) -> None:
    """Show a job's state, usage and error (its input and output only with --json).

    \b
    Example:
        platform jobs get job_01HX...
    """
    with _common.client() as client:
        job = client.jobs.get(job_id)
    if as_json:
        _common.print_json(job.raw)
    else:
        _common.print_fields(describe(job))


@app.command("list")
def list_(
    deployment: Annotated[str | None, typer.Option(help="Only jobs of this deployment.")] = None,
    status: Annotated[str | None, typer.Option(help="Only jobs in this state.")] = None,
    limit: Annotated[int, typer.Option(help="At most this many jobs.", min=1)] = 20,
    as_json: AsJson = False,
) -> None:
    """List recent jobs, newest first.

    \b
    Example:
        platform jobs list --deployment demo --status failed --limit 50
    """
    with _common.client() as client:
        jobs = client.jobs.list(deployment=deployment, status=status, limit=limit)
    if as_json:
        _common.print_json([job.raw for job in jobs])
        return
    rows = [
        (j.id, j.deployment, j.status, j.status_reason, j.attempt, j.raw.get("created_at"))
        for j in jobs
    ]
    _common.print_table(("id", "deployment", "status", "reason", "attempt", "created"), rows)


@app.command("cancel")
def cancel(job_id: JobId, as_json: AsJson = False) -> None:
    """Cancel a job; a running one stops at its next step.

    \b
    Example:
        platform jobs cancel job_01HX...
    """
    with _common.client() as client:
        job = client.jobs.cancel(job_id)
    if as_json:
        _common.print_json(job.raw)
    else:
        typer.echo(f"job {job.id}: {job.status}")


def describe(job: JobView) -> list[tuple[str, object]]:
    """The fields worth a glance. NOTE: no input or output text: prompts stay private."""
    error = job.error or {}
    text = job.text
    return [
        ("id", job.id),
        ("deployment", job.deployment),
        ("status", job.status),
        ("reason", job.status_reason),
        ("attempt", job.attempt),
        ("error", f"{error.get('type')}: {error.get('message')}" if error else None),
        (
            "output",
            f"{len(text)} chars ({(job.output or {}).get('finish_reason')})" if text else None,
        ),
        ("usage", job.usage),
        ("webhook", job.webhook_status),
        ("created", job.raw.get("created_at")),
        ("started", job.raw.get("started_at")),
        ("completed", job.raw.get("completed_at")),
    ]
