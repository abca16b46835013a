"""`platform status`: deployments with their queues and the autoscaler's latest decision,
workers by state (and why)."""

from __future__ import annotations

from collections import Counter
from typing import Annotated, Any

import typer

from sdk.cli import _common

# Waiting jobs counted per state; a queue longer than this shows as "1000+".
MAX_COUNTED = 1000
# Jobs that wait for a worker: queued, or starting (a worker is booting for them).
WAITING = ("queued", "starting")


def status(as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False) -> None:
    """Show deployments with their queue depth and scaling, and live workers by state with
    reasons.

    Queue depth counts the jobs queued or starting (a worker is booting for them). Scaling is
    the autoscaler's latest decision: the workers it wants (desired), those that count now
    (actual: ready or booting), why (demand, keepalive, prewarm, idle, ...), and when it will
    next boot a worker ahead of traffic. "-": no recent decision.

    \b
    Example:
        platform status
    """
    with _common.client() as client:
        url = client.base_url
        deployments = client.deployments.list()
        workers = [w for w in client.workers.list() if w.get("state") != "stopped"]
        waiting = {
            state: Counter(j.deployment for j in client.jobs.list(status=state, limit=MAX_COUNTED))
            for state in WAITING
        }
    summary: list[dict[str, Any]] = [
        {
            "name": d.name,
            "version": d.version,
            "workers": d.workers,
            "queued": waiting["queued"].get(d.name, 0),
            "starting": waiting["starting"].get(d.name, 0),
            "scaling": d.scaling,
        }
        for d in deployments
    ]
    if as_json:
        _common.print_json({"url": url, "deployments": summary, "workers": workers})
        return
    queued = sum(s["queued"] + s["starting"] for s in summary)
    typer.echo(
        f"platform at {url}: {len(deployments)} deployment(s), {len(workers)} worker(s), "
        f"{queued} job(s) waiting"
    )
    if summary:
        typer.echo("")
        _common.print_table(
            (
                "deployment",
                "version",
                "workers",
                "queued",
                "starting",
                "desired",
                "actual",
                "scaling",
                "next pre-warm",
            ),
            [
                (
                    s["name"],
                    s["version"],
                    _common.workers_summary(s["workers"]),
                    _count(s["queued"]),
                    _count(s["starting"]),
                    *_scaling(s["scaling"]),
                )
                for s in summary
            ],
        )
    if workers:
        typer.echo("")
        _common.print_table(
            ("worker", "deployment", "version", "state", "reason", "started"),
            [
                (
                    w.get("id"),
                    w.get("deployment"),
                    w.get("deployment_version"),
                    w.get("state"),
                    w.get("reason"),
                    w.get("started_at"),
                )
                for w in workers
            ],
        )


def _count(n: int) -> str:
    return f"{n}+" if n >= MAX_COUNTED else str(n)


def _scaling(decision: dict[str, Any] | None) -> tuple[Any, ...]:
    """(desired, actual, reason, next pre-warm) of a decision; "-" where there is none."""
    if not decision:
        return ("-", "-", "-", "-")
    return (
        decision.get("desired", "-"),
        decision.get("actual", "-"),
        decision.get("reason") or "-",
        decision.get("next_prewarm_at") or "-",
    )
