"""`platform deployments list|get|delete`: look at and remove deployments."""

from __future__ import annotations

from typing import Annotated

import typer

from sdk._models import Deployment
from sdk.cli import _common

app = typer.Typer(
    help="List, show and delete deployments.",
    no_args_is_help=True,
)

Name = Annotated[str, typer.Argument(help="Deployment name.", show_default=False)]
AsJson = Annotated[bool, typer.Option("--json", help="Print JSON.")]


@app.command("list")
def list_(as_json: AsJson = False) -> None:
    """List deployments with their version and live workers.

    \b
    Example:
        platform deployments list --json
    """
    with _common.client() as client:
        deployments = client.deployments.list()
    if as_json:
        _common.print_json([d.raw for d in deployments])
        return
    _common.print_table(
        ("name", "version", "model", "accelerator", "min", "max", "workers"),
        [_row(d) for d in deployments],
    )


@app.command("get")
def get(name: Name, as_json: AsJson = False) -> None:
    """Show one deployment's spec, version and workers.

    \b
    Example:
        platform deployments get demo
    """
    with _common.client() as client:
        deployment = client.deployments.get(name)
    if as_json:
        _common.print_json(deployment.raw)
        return
    pairs: list[tuple[str, object]] = [(k, v) for k, v in deployment.spec.items()]
    pairs += [
        ("engine_resolved", deployment.engine_resolved),
        ("engine_reason", deployment.engine_reason),
        ("version", deployment.version),
        ("workers", _common.workers_summary(deployment.workers)),
        ("updated", deployment.raw.get("updated_at")),
    ]
    _common.print_fields(pairs)


@app.command("delete")
def delete(name: Name) -> None:
    """Delete a deployment; its workers drain and stop.

    \b
    Example:
        platform deployments delete demo
    """
    with _common.client() as client:
        client.deployments.delete(name)
    typer.echo(f"deleted deployment {name!r}")


def _row(d: Deployment) -> tuple[object, ...]:
    spec = d.spec
    return (
        d.name,
        d.version,
        d.model,
        d.accelerator,
        spec.get("min_workers"),
        spec.get("max_workers"),
        _common.workers_summary(d.workers),
    )
