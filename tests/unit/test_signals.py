"""common/signals.py: a stop signal's action runs off the main thread, so it may take a lock
the main thread holds when the signal arrives (an Event's, inside `Event.wait`)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

from common.signals import on_signals

# The main thread holds the lock inside an Event (as `Event.wait` does for a few bytecodes on
# each call) when the signal arrives; the handler's action sets that Event.
SCENARIO = """
import os, signal, sys, threading, time
from common.signals import on_signals
stop = threading.Event()
if sys.argv[1] == "direct":
    signal.signal(signal.SIGUSR1, lambda *_: stop.set())
else:
    on_signals(lambda _signum: stop.set(), [signal.SIGUSR1])
with stop._cond:
    os.kill(os.getpid(), signal.SIGUSR1)
    time.sleep(0.2)  # the handler runs here, in this thread, the lock held
print("stopped" if stop.wait(5) else "not stopped", flush=True)
"""


def run_scenario(how: str) -> subprocess.CompletedProcess[str] | None:
    """The scenario's output, or None when it hung."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    try:
        return subprocess.run(
            [sys.executable, "-c", textwrap.dedent(SCENARIO), how],
            capture_output=True, text=True, timeout=5, cwd=root,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        return None


def test_an_event_set_in_the_handler_itself_waits_for_ever() -> None:
    """Why the module exists: the handler runs in the thread that holds the Event's lock."""
    assert run_scenario("direct") is None


def test_the_action_runs_although_the_main_thread_holds_the_lock_it_takes() -> None:
    done = run_scenario("relayed")
    assert done is not None, "hung"
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "stopped"


def test_each_signal_reaches_the_action_and_undo_restores_the_handler() -> None:
    before = signal.getsignal(signal.SIGUSR2)
    got: list[int] = []
    seen = threading.Semaphore(0)

    def action(signum: int) -> None:
        got.append(signum)
        seen.release()

    undo = on_signals(action, [signal.SIGUSR2])
    try:
        for _ in range(3):
            os.kill(os.getpid(), signal.SIGUSR2)
            assert seen.acquire(timeout=5)
        assert got == [signal.SIGUSR2] * 3
    finally:
        undo()
    assert signal.getsignal(signal.SIGUSR2) == before
    assert not any(t.name == "signals" for t in threading.enumerate())


def test_a_forked_child_gets_the_default_action_not_its_parents() -> None:
    got: list[int] = []
    undo = on_signals(got.append, [signal.SIGUSR2])
    try:
        pid = os.fork()
        if pid == 0:  # the child: SIGUSR2's default action ends it
            try:
                os.kill(os.getpid(), signal.SIGUSR2)
                time.sleep(5)
            finally:
                os._exit(3)
        _, status = os.waitpid(pid, 0)
        assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGUSR2
        time.sleep(0.1)
        assert got == []  # the parent did not act on its child's signal
    finally:
        undo()
