"""`platform batch submit|status|results|cancel|list`: many inputs, one job each, JSONL out."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Annotated, Any, TextIO

import typer

from sdk._batches import Batch
from sdk._models import BatchView
from sdk.cli import _common
from sdk.cli._progress import Progress

app = typer.Typer(
    help="Batches: run a JSONL file of inputs, one job per line; read the results.",
    no_args_is_help=True,
)

BatchId = Annotated[str, typer.Argument(help="Batch id (bat_...).", show_default=False)]
AsJson = Annotated[bool, typer.Option("--json", help="Print JSON.")]


@app.command("submit")
def submit(
    source: Annotated[
        str,
        typer.Argument(
            metavar="FILE.jsonl",
            help="A local JSONL file (one JobInput per line), or store://path.jsonl "
            "(your namespace) or s3://bucket/key.jsonl.",
            show_default=False,
        ),
    ],
    deployment: Annotated[
        str, typer.Option("--deployment", "-d", help="Deployment to run.", show_default=False)
    ],
    webhook: Annotated[
        str | None, typer.Option(help="URL to POST `batch.completed` to when all jobs end.")
    ] = None,
    max_in_flight: Annotated[
        int | None, typer.Option(help="Jobs of the batch running at once.", min=1)
    ] = None,
    wait: Annotated[
        bool, typer.Option("--wait", help="Show progress until every job finished.")
    ] = False,
    timeout: Annotated[
        float | None, typer.Option(help="With --wait: give up waiting after this many seconds.")
    ] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Print only the batch id.")] = False,
    as_json: AsJson = False,
) -> None:
    """Submit a batch: one job per input line, run a few at a time.

    Every line is checked before anything is created; a bad one is reported with its line
    number. With --wait: exit 0 once the batch completed, 1 if it was canceled.

    \b
    Examples:
        platform batch submit prompts.jsonl --deployment demo --wait
        BATCH=$(platform batch submit prompts.jsonl -d demo --quiet)
        platform batch submit store://in/prompts.jsonl -d demo --webhook https://example.com/hook
    """
    if not source.startswith(("s3://", "store://")) and not Path(source).is_file():
        _common.fail(f"{source}: no such file (give a .jsonl file, store:// or s3:// URI)")
    with _common.client() as client:
        batch = client.batches.create(
            source, deployment=deployment, webhook=webhook, max_in_flight=max_in_flight
        )
        if quiet:
            typer.echo(batch.id)
        elif not as_json:
            typer.echo(f"batch {batch.id}: {batch.total} jobs on {batch.deployment}")
        if wait:
            batch = _wait(batch, timeout, show=not (as_json or quiet))
    if as_json:
        _common.print_json(batch.raw)
    elif wait and not quiet:
        typer.echo(f"batch {batch.id} {batch.status}: {_counts(batch)}")
        typer.echo(f"results: platform batch results {batch.id}")
    if wait and batch.status != "completed":
        raise typer.Exit(_common.EXIT_USER)


@app.command("status")
def status(batch_id: BatchId, as_json: AsJson = False) -> None:
    """Show a batch's progress: its jobs by status.

    \b
    Example:
        platform batch status bat_01HX...
    """
    with _common.client() as client:
        batch = client.batches.get(batch_id)
    if as_json:
        _common.print_json(batch.raw)
        return
    _common.print_fields(
        [
            ("id", batch.id),
            ("deployment", batch.deployment),
            ("status", batch.status),
            ("finished", f"{batch.finished}/{batch.total}"),
            ("jobs", _counts(batch)),
            ("webhook", batch.webhook_status),
            ("results", batch.results_uri),
            ("created", batch.raw.get("created_at")),
            ("completed", batch.raw.get("completed_at")),
        ]
    )


@app.command("results")
def results(
    batch_id: BatchId,
    output: Annotated[
        Path | None,
        typer.Option("--output", "-o", help="Write the JSONL here instead of stdout."),
    ] = None,
) -> None:
    """Print the results as JSONL, one line per finished job, in input order.

    Each line: {"index", "job_id", "status", "output", "error"}. Before the batch completed,
    only the jobs finished so far have a line.

    \b
    Examples:
        platform batch results bat_01HX... --output results.jsonl
        platform batch results bat_01HX... | jq -r .output.text
    """
    with _common.client() as client, client.batches.results(batch_id) as lines:
        if output is None:
            count = _write_lines(lines, None)
        else:
            with output.open("w", encoding="utf-8") as f:
                count = _write_lines(lines, f)
        status = lines.status
    where = f" to {output}" if output is not None else ""
    partial = "" if status in (None, "completed") else f" (batch {status}: partial results)"
    _common.info(f"{count} results{where}{partial}")


@app.command("cancel")
def cancel(batch_id: BatchId, as_json: AsJson = False) -> None:
    """Cancel a batch: its unfinished jobs end; finished ones keep their results.

    \b
    Example:
        platform batch cancel bat_01HX...
    """
    with _common.client() as client:
        batch = client.batches.cancel(batch_id)
    if as_json:
        _common.print_json(batch.raw)
    else:
        typer.echo(f"batch {batch.id}: {batch.status} ({_counts(batch)})")


@app.command("list")
def list_(
    deployment: Annotated[str | None, typer.Option(help="Only batches of this deployment.")] = None,
    status: Annotated[
        str | None, typer.Option(help="Only batches in this state: running, completed, canceled.")
    ] = None,
    limit: Annotated[int, typer.Option(help="At most this many batches.", min=1)] = 20,
    as_json: AsJson = False,
) -> None:
    """List recent batches, newest first.

    \b
    Example:
        platform batch list --deployment demo --status running
    """
    with _common.client() as client:
        batches = client.batches.list(deployment=deployment, status=status, limit=limit)
    if as_json:
        _common.print_json([b.raw for b in batches])
        return
    _common.print_table(
        ("id", "deployment", "status", "finished", "created"),
        [
            (b.id, b.deployment, b.status, f"{b.finished}/{b.total}", b.raw.get("created_at"))
            for b in batches
        ],
    )


def _wait(batch: Batch, timeout_s: float | None, *, show: bool) -> Batch:
    if not show:
        return batch.wait(timeout=timeout_s)
    with Progress(total=max(batch.total, 1)) as progress:

        def on_update(b: Batch) -> None:
            progress.update(f"{b.id} {b.status}: {_counts(b)}", b.finished, max(b.total, 1))

        return batch.wait(timeout=timeout_s, on_update=on_update)


def _counts(batch: BatchView) -> str:
    return _common.workers_summary(batch.counts) if batch.counts else "no jobs"


def _write_lines(lines: Iterable[dict[str, Any]], out: TextIO | None) -> int:
    count = 0
    for line in lines:
        text = json.dumps(line, separators=(",", ":"))
        if out is None:
            typer.echo(text)
        else:
            out.write(text + "\n")
        count += 1
    return count
