"""`platform models create-demo|upload|verify`: make a small model, upload it, check it loads."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from sdk.cli import _common, model_files
from sdk.cli._format import human_bytes

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

app = typer.Typer(
    help="Model weights: a demo model, uploads to object storage.", no_args_is_help=True
)

WORKER_EXTRA_HINT = (
    "creating the demo model needs the worker extra: pip install 'platform-serverless[worker]'"
)


@app.command("create-demo")
def create_demo(
    directory: Annotated[
        Path, typer.Argument(help="Where to write the model.", show_default=False)
    ],
) -> None:
    """Write a tiny random Llama-family model (config.json, tokenizer, safetensors) to DIR.

    \b
    Example:
        platform models create-demo ./demo-model
    """
    if importlib.util.find_spec("torch") is None:
        _common.fail(WORKER_EXTRA_HINT)
    # NOTE: the CLI may not import the worker (tests/unit/test_layout.py): it says up front
    # what the worker's module does, which prints only when done.
    _common.info(
        f"creating the demo model in {directory} (about 10-20 s on a CPU): training a "
        "tokenizer on the bundled corpus, then a 2-layer Llama (250 steps), writing "
        "model.safetensors, config.json and the tokenizer, then generating a sample..."
    )
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, [sys.executable, "-m", "worker.model.demo", str(directory)])


@app.command("upload")
def upload(
    directory: Annotated[Path, typer.Argument(help="Local model directory.", show_default=False)],
    destination: Annotated[
        str,
        typer.Argument(
            help="store://prefix/ (or just prefix/): your namespace on the platform; or "
            "s3://bucket/prefix/: a bucket of yours.",
            show_default=False,
        ),
    ],
    endpoint_url: Annotated[
        str | None,
        typer.Option(
            help="S3-compatible endpoint [default: $PLATFORM_S3_ENDPOINT_URL, else AWS].",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Upload every file of DIR and print the model URI to deploy.

    Into your namespace on the platform (store://prefix/, through the API with your API
    key; no other tenant can read it), or into a bucket of yours (s3://bucket/prefix/, with
    the usual AWS variables; register its credentials with the platform to deploy from it).

    \b
    Examples:
        platform models upload ./demo-model models/demo/
        platform models upload ./demo-model s3://my-models/demo/ --endpoint-url https://...
    """
    if not directory.is_dir():
        _common.fail(f"{directory} is not a directory")
    files = sorted(p for p in directory.rglob("*") if p.is_file())
    if not files:
        _common.fail(f"{directory} holds no files")
    warning = model_files.weights_warning(files)
    if warning:
        _common.info(warning)
    if not destination.startswith("s3://"):
        _upload_to_store(directory, files, destination)
        return
    bucket, prefix = parse_s3_uri(destination)
    try:
        import boto3
        import botocore.config
        import botocore.exceptions
    except ImportError:
        _common.fail("uploading needs boto3: pip install boto3")

    s3: S3Client = boto3.client(
        "s3",
        endpoint_url=endpoint_url or os.environ.get("PLATFORM_S3_ENDPOINT_URL") or None,
        config=botocore.config.Config(
            s3={"addressing_style": "path"},
            # Plain S3-compatible servers reject the newer default checksum headers.
            request_checksum_calculation="when_required",
            response_checksum_validation="when_required",
        ),
    )
    try:
        _ensure_bucket(s3, bucket, botocore.exceptions.ClientError)
        for path in files:
            key = prefix + path.relative_to(directory).as_posix()
            s3.upload_file(str(path), bucket, key)
            typer.echo(f"uploaded {key} ({human_bytes(path.stat().st_size)})", err=True)
    except botocore.exceptions.NoCredentialsError:
        _common.fail("no AWS credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY")
    except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as e:
        _common.fail(f"upload to {destination} failed: {e}", _common.EXIT_PLATFORM)
    typer.echo(f"s3://{bucket}/{prefix}")


@app.command("verify", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def verify(
    ctx: typer.Context,
    uri: Annotated[
        str,
        typer.Argument(
            help="Weights: store://prefix/ (what `upload` printed), s3://bucket/prefix/, "
            "file:///path, hf://org/repo[@rev], /path.",
            show_default=False,
        ),
    ],
) -> None:
    """Load a model's weights the way a worker does (with a progress bar), and check them.

    Runs `python -m loader URI` (the loader package, from the worker extra); arguments
    after URI are passed on to it. Object storage credentials come from the usual AWS
    variables and PLATFORM_S3_ENDPOINT_URL. A store:// model (your namespace on the
    platform) is checked by the platform instead, as a deploy would: its files are listed,
    its config.json and safetensors headers read.

    Exit codes: 0 it loads, 1 it does not (or bad arguments), 2 the loader crashed.

    \b
    Examples:
        platform models verify store://models/demo/
        platform models verify s3://models/demo/
    """
    if uri.startswith("store://"):
        model_files.verify_in_store(uri)
        return
    if not _loader_main_exists():
        _common.fail(
            "`platform models verify` needs the loader's command line (python -m loader), "
            "which this installation lacks: pip install 'platform-serverless[worker]'"
        )
    code = model_files.run_loader([uri, *ctx.args])
    if code:
        raise typer.Exit(code)


def _upload_to_store(directory: Path, files: list[Path], destination: str) -> None:
    if "://" in destination and not destination.startswith("store://"):
        _common.fail(f"{destination!r}: give store://prefix/, prefix/ or s3://bucket/prefix/")
    prefix = destination.removeprefix("store://").strip("/")
    if not prefix:
        _common.fail("give a prefix to upload under, e.g. models/demo/")
    model_files.upload_to_store(directory, files, prefix)


def _loader_main_exists() -> bool:
    """Whether `python -m loader` would run; found without importing the loader (or torch)."""
    spec = importlib.util.find_spec("loader")
    if spec is None or not spec.submodule_search_locations:
        return False
    return any((Path(d) / "__main__.py").is_file() for d in spec.submodule_search_locations)


def parse_s3_uri(uri: str) -> tuple[str, str]:
    """("bucket", "prefix/") from s3://bucket/prefix; the prefix ends with '/' unless empty."""
    if not uri.startswith("s3://"):
        _common.fail(f"{uri!r} is not an s3:// URI, e.g. s3://models/demo/")
    bucket, _, prefix = uri.removeprefix("s3://").partition("/")
    if not bucket:
        _common.fail(f"{uri!r} names no bucket, e.g. s3://models/demo/")
    if prefix and not prefix.endswith("/"):
        prefix += "/"
    return bucket, prefix


def _ensure_bucket(s3: S3Client, bucket: str, client_error: type[Exception]) -> None:
    try:
        s3.head_bucket(Bucket=bucket)
    except client_error as e:
        code = str(getattr(e, "response", {}).get("Error", {}).get("Code", ""))
        if code not in ("404", "NoSuchBucket", "NotFound"):
            raise
        region = s3.meta.region_name
        if region and region != "us-east-1":  # AWS wants the region spelled out elsewhere
            # Any region name: boto3's stubs only list the regions they knew when released.
            config: Any = {"LocationConstraint": region}
            s3.create_bucket(Bucket=bucket, CreateBucketConfiguration=config)
        else:
            s3.create_bucket(Bucket=bucket)
        typer.echo(f"created bucket {bucket}", err=True)
