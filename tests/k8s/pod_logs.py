"""The test API server's `GET …/pods/{name}/log`: what the test kubelet wrote for the pod
(`<log_dir>/<pod>.log`, its container's stdout and stderr), as the real API serves it.

    sinceSeconds   lines written in the last N seconds: by the time the line carries (a
                   platform JSON line's `timestamp`; the real kubelet stamps each line as it
                   arrives), lines without one only when they follow a kept line
    follow=true    a chunked answer: the lines so far, then new ones as they are written, until
                   the pod is gone, the server stops or the client goes away
    404            no such pod; 400 while its container has not started (no log yet)
"""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from tests.k8s.errors import ApiError
from tests.k8s.objects import flag

POLL_S = 0.05


def _time_of(line: bytes) -> str | None:
    try:
        value = json.loads(line)
    except ValueError:
        return None
    stamp = value.get("timestamp") if isinstance(value, dict) else None
    return stamp if isinstance(stamp, str) else None


def serve(handler: Any, ns: str, name: str, query: dict[str, str]) -> None:
    """Answer the log request on `handler` (apiserver_http.Handler)."""
    api = handler.api
    if api.get("pods", ns, name) is None:
        raise ApiError(404, "NotFound", f'pods "{name}" not found')
    path: Path | None = api.log_dir / f"{name}.log" if api.log_dir is not None else None
    if path is None or not path.exists():
        raise ApiError(400, "BadRequest", f'container "worker" in pod "{name}" is waiting to start')
    cutoff = None
    if query.get("sinceSeconds"):
        since = datetime.now(UTC) - timedelta(seconds=int(query["sinceSeconds"]))
        cutoff = since.isoformat(timespec="milliseconds")[:-6] + "Z"
    follow = flag(query.get("follow"))
    handler.send_response(200)
    handler.send_header("Content-Type", "text/plain")
    handler.send_header("Transfer-Encoding", "chunked")
    handler.end_headers()
    keeping = cutoff is None

    def send(data: bytes) -> None:
        handler.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        handler.wfile.flush()

    try:
        with path.open("rb") as f:
            partial = b""
            while True:
                chunk = f.read(65536)
                if chunk:
                    *lines, partial = (partial + chunk).split(b"\n")
                    out = []
                    for line in lines:
                        stamp = _time_of(line)
                        if stamp is not None and cutoff is not None:
                            keeping = stamp >= cutoff
                        if keeping:
                            out.append(line + b"\n")
                    if out:
                        send(b"".join(out))
                    continue
                gone = api._stopping or api.get("pods", ns, name) is None
                if not follow or gone:
                    break
                time.sleep(POLL_S)
        handler.wfile.write(b"0\r\n\r\n")
        handler.wfile.flush()
    except OSError:
        handler.close_connection = True
