"""`platform up` / `platform down`: the embedded platform on this machine.

The CLI never imports the server: it replaces itself (os.execv) with
`python -m control_plane.embedded up|down ...`, which needs the [server,worker] extras.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from typing import Annotated, NoReturn

import typer

from sdk.cli._common import fail

SERVER_EXTRA_HINT = (
    "the embedded platform needs the server extra: pip install 'platform-serverless[server,worker]'"
)

StateDir = Annotated[
    Path | None,
    typer.Option(
        "--state-dir",
        help="Where the embedded platform keeps its database, queue and logs "
        "[default: $PLATFORM_STATE_DIR or ~/.local/share/platform].",
        show_default=False,
    ),
]


def default_state_dir() -> Path:
    explicit = os.environ.get("PLATFORM_STATE_DIR")
    return Path(explicit).expanduser() if explicit else Path("~/.local/share/platform").expanduser()


def up(
    port: Annotated[
        int, typer.Option("--port", help="Port of the REST API.", min=1, max=65535)
    ] = 8000,
    state_dir: StateDir = None,
    detach: Annotated[
        bool, typer.Option("--detach", help="Start in the background and return.")
    ] = False,
    api_processes: Annotated[
        int | None,
        typer.Option(
            "--api-processes",
            help="API processes sharing the port [default: $PLATFORM_API_PROCESSES, else 2 "
            "on a machine with two cores or more].",
            min=1,
            max=64,
            show_default=False,
        ),
    ] = None,
    reconcilers: Annotated[
        int | None,
        typer.Option(
            "--reconcilers",
            help="Reconciler processes; one leads, another takes over if it dies "
            "[default: $PLATFORM_RECONCILERS or 1].",
            min=1,
            max=8,
            show_default=False,
        ),
    ] = None,
) -> None:
    """Start the platform on this machine.

    Runs the API, queue, database, object store and workers as local processes.

    \b
    Example:
        platform up --port 8000 --detach
    """
    args = ["up", "--port", str(port), "--state-dir", str(state_dir or default_state_dir())]
    if detach:
        args.append("--detach")
    if api_processes is not None:
        args += ["--api-processes", str(api_processes)]
    if reconcilers is not None:
        args += ["--reconcilers", str(reconcilers)]
    _exec_embedded(args)


def down(state_dir: StateDir = None) -> None:
    """Stop the platform started by `platform up`.

    Workers drain first: jobs they hold finish.

    \b
    Example:
        platform down
    """
    _exec_embedded(["down", "--state-dir", str(state_dir or default_state_dir())])


def _exec_embedded(args: list[str]) -> NoReturn:
    if importlib.util.find_spec("fastapi") is None:
        fail(SERVER_EXTRA_HINT)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, [sys.executable, "-m", "control_plane.embedded", *args])
