"""`platform status`: every deployment with its workers by state."""

from __future__ import annotations

from typing import Annotated

import typer

from sdk.cli import _common


def status(as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False) -> None:
    """Show deployments and their workers by state.

    \b
    Example:
        platform status
    """
    with _common.client() as client:
        url = client.base_url
        deployments = client.deployments.list()
    if as_json:
        _common.print_json(
            {
                "url": url,
                "deployments": [
                    {"name": d.name, "version": d.version, "workers": d.workers}
                    for d in deployments
                ],
            }
        )
        return
    typer.echo(f"platform at {url}: {len(deployments)} deployment(s)")
    if deployments:
        rows = [
            (d.name, d.version, sum(d.workers.values()), _common.workers_summary(d.workers))
            for d in deployments
        ]
        _common.print_table(("deployment", "version", "workers", "by state"), rows)
