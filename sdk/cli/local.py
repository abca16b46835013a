"""`platform up` / `platform down`: the embedded platform on this machine.

The CLI never imports the server: it replaces itself (os.execv) with
`python -m control_plane.embedded up|down ...`, which needs the [server,worker] extras.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer

from sdk.cli._common import fail

SERVER_EXTRA_HINT = (
    "the embedded platform needs the server extra: pip install 'platform-serverless[server,worker]'"
)

STATE_FILE = "platform.json"  # what a running platform writes (control_plane/embedded/state.py)

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
    state_dir = state_dir or default_state_dir()
    running = running_platform(state_dir)
    if running is not None:
        # Not an error: what a person who forgot it was running wants is where it is.
        typer.echo(already_running(state_dir, running))
        raise typer.Exit(0)
    os.environ["PLATFORM_LOG_LEVELS"] = quiet_migrations(os.environ.get("PLATFORM_LOG_LEVELS", ""))
    args = ["up", "--port", str(port), "--state-dir", str(state_dir)]
    if detach:
        args.append("--detach")
    if api_processes is not None:
        args += ["--api-processes", str(api_processes)]
    if reconcilers is not None:
        args += ["--reconcilers", str(reconcilers)]
    _exec_embedded(args)


def quiet_migrations(levels: str) -> str:
    """PLATFORM_LOG_LEVELS with Alembic at WARNING (its INFO lines, one per migration, would
    bury why `up` failed), unless the user set Alembic's level there."""
    named = [item.partition("=")[0].strip() for item in levels.split(",")]
    if any(name == "alembic" or name.startswith("alembic.") for name in named):
        return levels
    return ",".join(p for p in (levels.strip(), "alembic=WARNING") if p)


def running_platform(state_dir: Path) -> dict[str, Any] | None:
    """The state file of a platform that runs from `state_dir`, if one does."""
    try:
        state = json.loads((state_dir / STATE_FILE).read_text())
        pid = int(state["pid"])
        os.kill(pid, 0)
    except PermissionError:
        return state if isinstance(state, dict) else None
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return state if isinstance(state, dict) else None


def already_running(state_dir: Path, state: dict[str, Any]) -> str:
    """What `up` says when the platform already runs: where, and where its admin key is."""
    return "\n".join(
        [
            f"The platform already runs from {state_dir} (pid {state.get('pid')})",
            f"  API:        {state.get('url')}",
            f'  Admin key:  in {state_dir / STATE_FILE} ("api_key")',
            f"  Stop it:    platform down --state-dir {state_dir}",
        ]
    )


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
