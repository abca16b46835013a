"""What `platform models upload` and `verify` do with a model's files beside the S3 path:
progress of an upload, and checking a model in the platform's store (`store://`)."""

from __future__ import annotations

import secrets
import subprocess
import sys
from pathlib import Path

import typer

from sdk.cli import _common
from sdk.cli._format import human_bytes
from sdk.cli._progress import Progress

# `python -m loader` exits 2 for bad arguments and 3 for a checkpoint it cannot load (the
# user's to fix); anything else is a crash or a signal.
LOADER_USER_CODES = frozenset({2, 3})


def weights_warning(files: list[Path]) -> str | None:
    """The warning for a model directory without safetensors weights (a worker loads only
    those), or None."""
    if any(p.name.endswith(".safetensors") for p in files):
        return None
    return (
        "warning: no .safetensors file here: a worker loads only safetensors weights "
        "(convert .bin/.pt checkpoints first); uploading anyway"
    )


def upload_to_store(directory: Path, files: list[Path], prefix: str) -> None:
    """Upload `files` under `store://prefix/`: a byte-count bar on a terminal, a line per
    file otherwise."""
    from sdk import PlatformError

    total = sum(p.stat().st_size for p in files)
    done = 0
    with _common.client() as client, Progress(total=total, counts=False) as bar:
        try:
            for path in files:
                name = f"{prefix}/{path.relative_to(directory).as_posix()}"
                size = path.stat().st_size
                plain = f"uploading {name} ({human_bytes(size)})"  # a log's one line
                label = f"uploading {path.name} ({{}}/{human_bytes(total)})"
                bar.update(label.format(human_bytes(done)), done, plain=plain)

                def sent(n: int, at: int = done, label: str = label, plain: str = plain) -> None:
                    # the bar moves within a file too (a large safetensors shard)
                    bar.update(label.format(human_bytes(at + n)), at + n, plain=plain)

                stored = client.files.upload(name, path, progress=sent)
                done += stored.bytes or size
            summary = f"uploaded {len(files)} file(s), {human_bytes(total)}"
            bar.update(summary, total, plain=summary)
        except PlatformError as e:
            raise typer.Exit(_common.report(e)) from None
    typer.echo(f"store://{prefix}/")


def verify_in_store(uri: str) -> None:
    """Check a model of the tenant's store as a deploy does: list its files, then have the
    platform read its config.json and safetensors headers (a dry-run deployment, nothing
    created). The store is read through the API, so no storage credentials are needed."""
    prefix = uri.removeprefix("store://").strip("/")
    if not prefix:
        _common.fail("give the model's prefix, e.g. store://models/demo/")
    with _common.client() as client:
        files = client.files.list(prefix + "/")
        if not files:
            _common.fail(f"{uri}: no files there (upload with: platform models upload DIR {uri})")
        for f in files:
            typer.echo(f"  {f.path}  {human_bytes(f.bytes or 0)}")
        # a name no deployment has: the dry run only checks, and must not meet a real one
        name = f"verify-{secrets.token_hex(4)}"
        client.deployments.create(name=name, model=f"store://{prefix}/", dry_run=True)
    typer.echo(f"ok: the platform can load store://{prefix}/ (config and weights checked)")


def run_loader(args: list[str]) -> int:
    """`python -m loader ARGS`, its exit code mapped onto the CLI's (0, 1, 2)."""
    sys.stdout.flush()
    sys.stderr.flush()
    code = subprocess.call([sys.executable, "-m", "loader", *args])
    if code == 0:
        return _common.EXIT_OK
    return _common.EXIT_USER if code in LOADER_USER_CODES else _common.EXIT_PLATFORM
