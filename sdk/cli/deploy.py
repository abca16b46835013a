"""`platform deploy`: create or update a deployment from a manifest and/or flags."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer

from sdk import Client
from sdk._errors import NotFoundError
from sdk._models import Deployment
from sdk.cli import _common
from sdk.cli._progress import Progress
from sdk.cli.manifest import (
    ManifestError,
    Problem,
    check_complete,
    check_fields,
    diff_specs,
    load_manifest,
)

# Flag -> spec field, for flags that set one field each.
_FLAG_FIELDS = {
    "--name": "name",
    "--model": "model",
    "--accelerator": "accelerator",
    "--accelerator-count": "accelerator_count",
    "--engine": "engine",
    "--min-workers": "min_workers",
    "--max-workers": "max_workers",
    "--scaledown-window": "scaledown_window_s",
    "--max-boot": "max_boot_s",
    "--cold-penalty": "cold_penalty_s",
    "--queue-wait": "queue_wait_s",
    "--execution-timeout": "execution_timeout_s",
}


def deploy(
    manifest: Annotated[
        Path | None,
        typer.Argument(help="YAML manifest of DeploymentSpec fields.", show_default=False),
    ] = None,
    name: Annotated[str | None, typer.Option(help="Deployment name.")] = None,
    model: Annotated[
        str | None,
        typer.Option(
            help="Weights: s3://bucket/prefix/, file:///path, hf://org/repo[@rev], /path."
        ),
    ] = None,
    accelerator: Annotated[str | None, typer.Option(help="Hardware, e.g. cpu.")] = None,
    accelerator_count: Annotated[
        int | None,
        typer.Option(help="Accelerators per worker (above 1: vLLM's tensor parallelism)."),
    ] = None,
    engine: Annotated[
        str | None,
        typer.Option(
            help="auto (the built-in engine where it can, vLLM otherwise), builtin or vllm; "
            "`platform deployments get` shows the one chosen and why."
        ),
    ] = None,
    min_workers: Annotated[int | None, typer.Option(help="Workers kept warm.")] = None,
    max_workers: Annotated[int | None, typer.Option(help="Most workers at once.")] = None,
    scaledown_window: Annotated[
        float | None, typer.Option(help="Idle seconds before a worker stops.")
    ] = None,
    max_boot: Annotated[
        float | None, typer.Option(help="Seconds a worker may take to boot.")
    ] = None,
    cold_penalty: Annotated[
        float | None,
        typer.Option(
            help="Idle worker-seconds one cold start is worth sparing a caller (higher: warmer)."
        ),
    ] = None,
    queue_wait: Annotated[
        float | None,
        typer.Option(
            help="Seconds a job may wait for a busy worker before another starts (0: never)."
        ),
    ] = None,
    execution_timeout: Annotated[
        float | None, typer.Option(help="Seconds one job may run.")
    ] = None,
    max_tokens: Annotated[
        int | None, typer.Option(help="Default max_tokens for inputs that leave it out.")
    ] = None,
    dry_run: Annotated[
        bool,
        typer.Option(
            "--dry-run",
            help="Show what would change and have the platform check it; change nothing.",
        ),
    ] = False,
    wait: Annotated[
        bool,
        typer.Option(
            "--wait",
            help="Then wait until a worker of the new version is idle (needs min_workers >= 1).",
        ),
    ] = False,
    wait_timeout: Annotated[
        float, typer.Option(help="With --wait: give up after this many seconds.", min=1)
    ] = 600.0,
) -> None:
    """Create or update a deployment.

    Flags override the manifest; fields left out keep their current value. The changes are
    shown first; --dry-run stops there. --wait then follows a worker of the new version
    (booting, loading, warming, idle); with min_workers 0 no worker starts until a call
    arrives, so --wait only warns and returns.

    \b
    Examples:
        platform deploy deploy.yaml
        platform deploy --name demo --model store://models/demo/ --max-workers 2
        platform deploy deploy.yaml --max-workers 4 --dry-run
        platform deploy --name moe --model store://models/mixtral/ --engine vllm
        platform deploy deploy.yaml --min-workers 1 --wait
    """
    flags: dict[str, Any] = {
        "--name": name,
        "--model": model,
        "--accelerator": accelerator,
        "--accelerator-count": accelerator_count,
        "--engine": engine,
        "--min-workers": min_workers,
        "--max-workers": max_workers,
        "--scaledown-window": scaledown_window,
        "--max-boot": max_boot,
        "--cold-penalty": cold_penalty,
        "--queue-wait": queue_wait,
        "--execution-timeout": execution_timeout,
    }
    given, where = _given_spec(manifest, flags)
    if max_tokens is not None:
        where["defaults.max_tokens"] = "--max-tokens"
    problems = check_fields(given, where)
    if max_tokens is not None and max_tokens < 1:
        problems.append(Problem("defaults.max_tokens", "must be >= 1", "--max-tokens"))
    if "name" not in given:
        problems.append(Problem("name", "missing: give --name or a name in the manifest"))
    _stop_on(problems)

    deployment_name = str(given["name"])
    with _common.client() as client:
        try:
            existing: Deployment | None = client.deployments.get(deployment_name)
        except NotFoundError:
            existing = None
        old = existing.spec if existing else None
        new = {**(old or {}), **given}
        if max_tokens is not None:
            new["defaults"] = {**(new.get("defaults") or {}), "max_tokens": max_tokens}
        _stop_on(check_complete(new, creating=existing is None))

        changes = diff_specs(old, new)
        if existing is None:
            typer.echo(f"create deployment {deployment_name!r}:")
        elif changes:
            typer.echo(f"update deployment {deployment_name!r} (version {existing.version}):")
        else:
            typer.echo(f"deployment {deployment_name!r} is up to date (version {existing.version})")
        for line in changes:
            typer.echo(f"  {line}")
        if dry_run:
            # the platform's own checks (the model readable and supported, the name free):
            # a refusal is reported like a real deploy's, and nothing is written either way
            if existing is None:
                client.deployments.create(new, dry_run=True)
            elif changes:
                client.deployments.update(deployment_name, new, dry_run=True)
            typer.echo("dry run: the platform accepts it; nothing changed")
            return
        if existing is None:
            result = client.deployments.create(new)
            typer.echo(f"created deployment {result.name!r} (version {result.version})")
        elif changes:
            result = client.deployments.update(deployment_name, new)
            typer.echo(f"updated deployment {result.name!r} (version {result.version})")
        else:
            result = existing
        if wait:
            _wait_ready(client, result, wait_timeout)


# A new worker's states in order; the progress display counts them.
WORKER_STEPS = ("booting", "loading", "warming", "idle")


def _wait_ready(client: Client, deployment: Deployment, timeout_s: float) -> None:
    name, version = deployment.name, deployment.version
    if not deployment.raw.get("min_workers"):
        _common.info(
            f"--wait: {name!r} has min_workers 0, so no worker starts until a call arrives; "
            "not waiting (deploy with --min-workers 1 to keep a worker ready)"
        )
        return

    with Progress(total=len(WORKER_STEPS)) as progress:

        def on_update(workers: list[dict[str, Any]]) -> None:
            best = max(workers, key=_step, default=None)
            if best is None:
                progress.update(f"version {version}: waiting for a worker to start", 0)
            else:
                state = best.get("state")
                progress.update(
                    f"worker {best.get('id')} (version {version}): {state}", _step(best)
                )

        worker = client.deployments.wait_ready(
            name, version=version, timeout=timeout_s, on_update=on_update
        )
    typer.echo(f"ready: worker {worker.get('id')} serves {name!r} version {version}")


def _step(worker: dict[str, Any]) -> int:
    """How far along a worker is: booting 1 ... idle 4 (busy counts as idle)."""
    state = "idle" if worker.get("state") == "busy" else worker.get("state")
    return WORKER_STEPS.index(state) + 1 if state in WORKER_STEPS else 0


def _given_spec(
    manifest: Path | None, flags: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, str | None]]:
    """The fields the user gave and where each came from ("file:line" or "--flag")."""
    given: dict[str, Any] = {}
    where: dict[str, str | None] = {}
    if manifest is not None:
        try:
            loaded = load_manifest(manifest)
        except ManifestError as e:
            _abort(e.problems)
        given.update(loaded.spec)
        where.update({field: f"{loaded.path}:{line}" for field, line in loaded.lines.items()})
    for flag, value in flags.items():
        if value is not None:
            given[_FLAG_FIELDS[flag]] = value
            where[_FLAG_FIELDS[flag]] = flag
    return given, where


def _stop_on(problems: list[Problem]) -> None:
    if problems:
        _abort(problems)


def _abort(problems: list[Problem]) -> NoReturn:
    for problem in problems:
        typer.echo(f"error: {problem}", err=True)
    raise typer.Exit(_common.EXIT_USER)
