"""`python -m control_plane.embedded up|down ...` (what `platform up` / `platform down` exec)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from pydantic import ValidationError

from common import logs
from control_plane.embedded.lifecycle import down, up


def default_state_dir() -> Path:
    env = os.environ.get("PLATFORM_STATE_DIR")
    return Path(env) if env else Path.home() / ".local" / "share" / "platform"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="platform")
    sub = p.add_subparsers(dest="cmd", required=True)
    pu = sub.add_parser("up", help="start the embedded platform")
    pu.add_argument("--port", type=int, default=8000)
    pu.add_argument("--state-dir", type=Path, default=None)
    pu.add_argument("--detach", action="store_true")
    pu.add_argument("--api-processes", type=int, default=None, help="PLATFORM_API_PROCESSES")
    pu.add_argument("--reconcilers", type=int, default=None, help="PLATFORM_RECONCILERS")
    pd = sub.add_parser("down", help="stop a detached embedded platform")
    pd.add_argument("--state-dir", type=Path, default=None)
    args = p.parse_args(argv)
    # Only the log settings: the others are the children's, checked where they are used
    # (a bad PLATFORM_API_PROCESSES gets the supervisor's own message, not a traceback).
    try:
        log_settings = logs.LogSettings()
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        print(f"platform: bad log settings (PLATFORM_LOG_*): {problems}", file=sys.stderr)
        return 2
    logs.configure("supervisor", log_settings)
    state_dir = args.state_dir or default_state_dir()
    if args.cmd == "up":
        if args.api_processes is not None:
            os.environ["PLATFORM_API_PROCESSES"] = str(args.api_processes)
        if args.reconcilers is not None:
            os.environ["PLATFORM_RECONCILERS"] = str(args.reconcilers)
        return up(state_dir, args.port, args.detach)
    return down(state_dir)


if __name__ == "__main__":
    sys.exit(main())
