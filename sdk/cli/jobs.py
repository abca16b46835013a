"""`platform jobs get|list|watch|cancel`: look at, follow and cancel jobs."""

from __future__ import annotations

import json
import time
from typing import Annotated

import typer

from sdk._jobs import Job
from sdk._models import JobView
from sdk.cli import _common

app = typer.Typer(help="Look at, follow and cancel jobs.", no_args_is_help=True)

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


@app.command("watch")
def watch(
    job_id: JobId,
    timeout: Annotated[
        float | None, typer.Option(help="Stop watching after this many seconds.")
    ] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print each new state as one JSON line.")
    ] = False,
) -> None:
    """Follow a job until it ends, printing every change of state and why it waits.

    Exit code: 0 succeeded, 1 the model or input failed, 2 any other end (or a timeout).

    \b
    Example:
        platform jobs watch job_01HX...
    """
    started_s = time.monotonic()
    seen: list[tuple[object, ...]] = []

    def on_update(job: Job) -> None:
        change = (job.status, job.status_reason, job.attempt, job.raw.get("queue_position"))
        if seen and seen[-1] == change:
            return
        seen.append(change)
        if as_json:
            typer.echo(json.dumps(job.raw, separators=(",", ":"), default=str))
        else:
            typer.echo(f"{time.monotonic() - started_s:7.1f}s  {state_line(job)}")

    with _common.client() as client:
        client.jobs.get(job_id).wait(timeout=timeout, on_update=on_update)


def state_line(job: JobView) -> str:
    """One line for a job's state: "queued (position 2, eta 3s)", "starting (no_capacity)"."""
    raw = job.raw
    if job.status == "queued" and raw.get("queue_position") is not None:
        eta = raw.get("eta_s")
        eta_text = f", eta {eta:.0f}s" if isinstance(eta, int | float) else ""
        return f"queued (position {raw['queue_position']}{eta_text})"
    if job.status == "running":
        return f"running (attempt {job.attempt})"
    if job.status == "succeeded":
        text = job.text or ""
        return f"succeeded: {len(text)} chars ({(job.output or {}).get('finish_reason')})"
    if job.error:
        return f"{job.status}: {job.error.get('type')}: {job.error.get('message')}"
    return f"{job.status} ({job.status_reason})" if job.status_reason else job.status


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
