"""Docker HEALTHCHECK of both images: probes what the container's main process serves.

The role is read from PID 1's command line (the entrypoint `exec`s into it), since a health check
runs as a separate process and sees none of the entrypoint's variables:
  control_plane.api  -> GET /healthz on PLATFORM_API_PORT (default 8000)
  worker             -> GET /metrics on PLATFORM_WORKER_METRICS_PORT (served from boot on)
  anything else      -> healthy (the reconciler and Celery serve no HTTP; their exit is the signal)
Standard library only: it must run in the worker image too, which has no httpx guarantee.
"""

from __future__ import annotations

import os
import sys
import urllib.request
from pathlib import Path


def target(cmdline: list[str], env: dict[str, str]) -> str | None:
    """The URL to probe for a main process with this command line, or None for none."""
    # `python -m MODULE ...`: the module after "-m" names the role.
    module = cmdline[cmdline.index("-m") + 1] if "-m" in cmdline[:-1] else ""
    if module == "control_plane.api":
        return f"http://127.0.0.1:{env.get('PLATFORM_API_PORT', '8000')}/healthz"
    if module == "worker":
        port = env.get("PLATFORM_WORKER_METRICS_PORT", "")
        if not port or port == "0":
            return None  # no fixed port: nothing to probe
        host = env.get("PLATFORM_WORKER_METRICS_HOST", "127.0.0.1")
        if host in ("", "0.0.0.0", "::"):
            host = "127.0.0.1"
        return f"http://{host}:{port}/metrics"
    return None


def main() -> int:
    try:
        raw = Path("/proc/1/cmdline").read_bytes()
    except OSError:
        return 0
    url = target([a.decode() for a in raw.split(b"\0") if a], dict(os.environ))
    if url is None:
        return 0
    try:
        with urllib.request.urlopen(url, timeout=3) as resp:
            return 0 if resp.status == 200 else 1
    except OSError as exc:
        print(f"unhealthy: {url}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
