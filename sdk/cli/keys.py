"""`platform keys create|list|revoke`: this tenant's API keys (needs an admin key)."""

from __future__ import annotations

from typing import Annotated

import typer

from sdk._routes import SCOPES
from sdk.cli import _common

app = typer.Typer(help="API keys: create, list and revoke.", no_args_is_help=True)

AsJson = Annotated[bool, typer.Option("--json", help="Print JSON.")]


@app.command("create")
def create(
    name: Annotated[str, typer.Option(help="A label to recognise the key by.")] = "",
    scopes: Annotated[
        list[str] | None,
        typer.Option(
            "--scope",
            help=f"A scope of the key (repeatable): {', '.join(SCOPES)} [default: run, read].",
            show_default=False,
        ),
    ] = None,
    as_json: AsJson = False,
) -> None:
    """Create an API key and print its secret (shown this once; the platform keeps a hash).

    The secret alone goes to stdout, so it can be captured; the rest goes to stderr.

    \b
    Examples:
        platform keys create --name ci --scope run --scope read
        KEY=$(platform keys create --name ci)
        platform keys create --name deployer --scope deploy --json
    """
    unknown = sorted(set(scopes or ()) - set(SCOPES))
    if unknown:
        _common.fail(f"--scope: unknown {', '.join(unknown)}; use {', '.join(SCOPES)}")
    with _common.client() as client:
        key = client.keys.create(name=name, scopes=scopes)
    if as_json:
        _common.print_json(key.raw)
        return
    _common.info(f"created key {key.id} ({key.prefix}) with scopes {', '.join(key.scopes)}")
    _common.info("store the secret now: it is not shown again")
    typer.echo(key.key)


@app.command("list")
def list_(as_json: AsJson = False) -> None:
    """List the tenant's API keys (never their secrets), revoked ones included.

    \b
    Example:
        platform keys list --json
    """
    with _common.client() as client:
        keys = client.keys.list()
    if as_json:
        _common.print_json([k.raw for k in keys])
        return
    _common.print_table(
        ("id", "name", "prefix", "scopes", "created", "revoked"),
        [
            (k.id, k.name, k.prefix, k.scopes, k.raw.get("created_at"), k.raw.get("revoked_at"))
            for k in keys
        ],
    )


@app.command("revoke")
def revoke(
    key: Annotated[
        str,
        typer.Argument(
            metavar="KEY",
            help="The key's id (key_...), its prefix (pk_...), or the key itself.",
            show_default=False,
        ),
    ],
) -> None:
    """Revoke an API key: it is refused from the next request on.

    \b
    Examples:
        platform keys revoke key_01HX...
        platform keys revoke pk_3f2a9c1b7d4e
        platform keys revoke "$KEY"
    """
    with _common.client() as client:
        key_id = key
        if key.startswith("pk_"):
            prefix = "_".join(key.split("_", 2)[:2])  # pk_<prefix>_<secret> -> pk_<prefix>
            matches = [k.id for k in client.keys.list() if k.prefix == prefix]
            if not matches:
                _common.fail(f"no API key of this tenant has the prefix {prefix}")
            key_id = matches[0]
        client.keys.revoke(key_id)
    typer.echo(f"revoked key {key_id}")
