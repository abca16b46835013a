"""`platform login`: remember the platform's URL and API key for the SDK and the CLI."""

from __future__ import annotations

from typing import Annotated
from urllib.parse import urlsplit

import typer

from sdk._config import config_path, write_config
from sdk.cli._common import fail


def login(
    url: Annotated[str, typer.Option("--url", help="Base URL of the platform.")],
    api_key: Annotated[
        str,
        typer.Option(
            "--api-key", prompt=True, hide_input=True, help="API key (prompted when left out)."
        ),
    ],
) -> None:
    """Save the URL and API key for later calls.

    Writes them to the config file (mode 0600) that the CLI and Client() read:
    $PLATFORM_CONFIG, else ~/.config/platform/config.json. PLATFORM_URL and
    PLATFORM_API_KEY, when set, still take precedence over it.

    \b
    Example:
        platform login --url https://platform.example.com --api-key sk_live_...
    """
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        fail(f"--url: {url!r} is not an http(s) URL, e.g. http://127.0.0.1:8000")
    if not api_key.strip():
        fail("--api-key: must not be empty")
    path = config_path()
    try:
        write_config(path, url.rstrip("/"), api_key.strip())
    except OSError as e:
        fail(f"cannot write {path}: {e.strerror or e}")
    # NOTE: the key itself is never echoed.
    typer.echo(f"saved the URL and API key for {url.rstrip('/')} to {path}")
