"""What this machine's scheduler costs, measured beside a benchmark: a round trip between two
processes that wake each other (one byte each way over a socket pair).

A warm job crosses processes and threads some twenty times (client, API loop, its pool
threads, Redis, the worker's threads), and on a shared virtual machine the cost of a wake-up
moves from one hour to the next. Printed with the control-plane bench, it says in which phase
of the machine a run was made, which its single runs cannot (docs/benchmarks.md).
"""

from __future__ import annotations

import os
import socket
import time


def wake_round_trips_us(rounds: int = 4000) -> list[float]:
    """`rounds` round trips to a forked child that echoes each byte, in microseconds."""
    ours, theirs = socket.socketpair()
    pid = os.fork()
    if pid == 0:  # the child: echo until told to stop, then leave without Python's exit path
        ours.close()
        try:
            while (byte := theirs.recv(1)) not in (b"", b"q"):
                theirs.sendall(byte)
        finally:
            os._exit(0)
    theirs.close()
    times: list[float] = []
    try:
        for _ in range(rounds):
            t0 = time.perf_counter()
            ours.sendall(b"x")
            ours.recv(1)
            times.append((time.perf_counter() - t0) * 1e6)
        ours.sendall(b"q")
    finally:
        ours.close()
        os.waitpid(pid, 0)
    return times
