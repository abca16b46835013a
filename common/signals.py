"""Stop signals of every long-running platform process, acted on off the main thread.

Python runs a signal handler in the main thread, between two of its bytecodes, and so possibly
while that thread holds the lock inside a `threading.Event` it is waiting on (`Event.wait`
holds it for a few bytecodes on each call). A handler that takes the same lock, as
`Event.set()` does, then waits for itself for ever: the `signal` module's documentation warns
against locks in handlers. The supervisor, the reconciler and the worker all stopped through
`Event.set()` in their handlers; a rare `platform down` that waited 90 s for a supervisor whose
children were all still running is what that looks like.

So the handler installed here takes no lock: it writes the signal's number into a pipe, and a
daemon thread reading the pipe runs the action, where locks are safe. Shared by the control
plane's processes and the worker, like common/logs.py: standard library only.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable, Iterable
from types import FrameType

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def on_signals(
    action: Callable[[int], object], signums: Iterable[int] = STOP_SIGNALS
) -> Callable[[], None]:
    """Run `action(signum)` on a thread of its own each time one of `signums` arrives.
    Call from the main thread (Python's rule for `signal.signal`). Returns an undo: the
    previous handlers back, the thread ended."""
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)
    signums = tuple(signums)
    owner = os.getpid()

    def note(signum: int, _frame: FrameType | None) -> None:
        if os.getpid() != owner:  # a forked child: the pipe and its reader are the parent's
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        # a full pipe (64 KiB of signals not yet acted on) loses nothing that matters
        with contextlib.suppress(BlockingIOError):
            os.write(write_end, bytes([signum]))

    def relay() -> None:
        with open(read_end, "rb", buffering=0) as pipe:
            while data := pipe.read(64):  # b"" once the undo closed the write end
                for signum in data:
                    action(signum)

    thread = threading.Thread(target=relay, name="signals", daemon=True)
    thread.start()
    previous = {s: signal.signal(s, note) for s in signums}

    def undo() -> None:
        for s, handler in previous.items():
            signal.signal(s, handler)
        os.close(write_end)
        thread.join(5)

    return undo
