"""`platform up` / `platform down`: start a `Supervisor` in the foreground, or detached in a
new session (waiting for its `platform.json`), and stop the one a state directory names."""

from __future__ import annotations

import contextlib
import faulthandler
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from common.signals import on_signals
from control_plane.embedded.processes import StartError
from control_plane.embedded.state import STATE_FILE, pid_alive, platform_log_path, read_state
from control_plane.embedded.supervisor import Supervisor

# Asks a running supervisor for every thread's stack (faulthandler), written to its log.
DUMP_SIGNAL = signal.SIGUSR1


def banner(state: dict[str, Any]) -> str:
    return "\n".join(
        [
            "Platform ready",
            f"  API:        {state['url']}",
            f"  Admin key:  {state['api_key']}",
            f"  S3:         {state['s3_endpoint_url']}",
            f"  State:      {state['state_dir']}",
            "  Webhooks to loopback/private addresses are allowed (embedded default;"
            " set PLATFORM_WEBHOOK_ALLOW_PRIVATE=false to refuse them).",
            "  Use it:     export PLATFORM_URL="
            + state["url"]
            + " PLATFORM_API_KEY="
            + state["api_key"],
        ]
    )


def failure_text(exc: BaseException) -> str:
    """Why `up` failed, the actionable line last: a message that quotes a log (its first line
    says what failed and where the log is) shows the log first."""
    headline, _, quoted = str(exc).partition("\n")
    return (
        f"{quoted}\nplatform up failed: {headline}" if quoted else f"platform up failed: {headline}"
    )


def up(state_dir: Path, port: int, detach: bool) -> int:
    if detach:
        return _up_detached(state_dir, port)
    sup = Supervisor(state_dir, port)

    # not `stopping.set()` in the handler itself: common/signals.py says why
    on_signals(lambda _signum: sup.stopping.set())
    # every thread's stack to the log (platform.log when detached), from C: also when this
    # process's Python is stuck. `down` asks for it before it kills a platform that did not stop
    faulthandler.register(DUMP_SIGNAL, all_threads=True)
    try:
        state = sup.start()
    except (StartError, Exception) as exc:
        sup.stop()
        print(failure_text(exc), file=sys.stderr)
        return 1
    print(banner(state), flush=True)
    print("Press Ctrl-C to stop.", flush=True)
    rc = sup.watch()
    print("Platform stopped.", flush=True)
    return rc


def _up_detached(state_dir: Path, port: int, timeout_s: float = 120.0) -> int:
    state_dir = state_dir.resolve()
    (state_dir / "logs").mkdir(parents=True, exist_ok=True)
    existing = read_state(state_dir)
    if existing and pid_alive(int(existing.get("pid", 0))):
        print(
            f"the platform already runs from {state_dir} (pid {existing['pid']})", file=sys.stderr
        )
        return 1
    (state_dir / STATE_FILE).unlink(missing_ok=True)
    log_path = platform_log_path(state_dir)
    with log_path.open("ab") as out:
        # A new session and no death signal: this process exits right after `ready`.
        proc = subprocess.Popen(
            [sys.executable, "-m", "control_plane.embedded", "up", "--port", str(port),
             "--state-dir", str(state_dir)],
            stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        state = read_state(state_dir)
        if state and state.get("pid") == proc.pid:
            print(banner(state), flush=True)
            print(
                f"Running in the background (pid {proc.pid}); stop it with: "
                f"platform down --state-dir {state_dir}",
                flush=True,
            )
            return 0
        if proc.poll() is not None:
            print(f"platform up failed; log {log_path}:", file=sys.stderr)
            print(
                "\n".join(log_path.read_text(errors="replace").splitlines()[-30:]), file=sys.stderr
            )
            return 1
        time.sleep(0.1)
    proc.terminate()
    print(f"platform not ready after {timeout_s:.0f}s; log {log_path}", file=sys.stderr)
    return 1


def down(state_dir: Path, timeout_s: float = 90.0) -> int:
    state = read_state(state_dir.resolve())
    if not state:
        print(f"no platform runs from {state_dir}", file=sys.stderr)
        return 1
    pid = int(state["pid"])
    if not pid_alive(pid):
        (state_dir / STATE_FILE).unlink(missing_ok=True)
        print(f"the platform (pid {pid}) was not running; cleaned up its state file")
        return 0
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and pid_alive(pid):
        time.sleep(0.1)
        _reap_if_child(pid)
    if pid_alive(pid):
        os.kill(pid, DUMP_SIGNAL)  # where it was stuck, for whoever reads its log
        time.sleep(0.5)
        os.kill(pid, signal.SIGKILL)
        log_path = platform_log_path(state_dir)
        print(
            f"the platform did not stop in {timeout_s:.0f}s; killed it (the stacks of its "
            f"threads before that are at the end of {log_path})",
            file=sys.stderr,
        )
        return 2
    print("Platform stopped.")
    return 0


def _reap_if_child(pid: int) -> None:
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)
