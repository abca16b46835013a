"""The admission load: `n` client threads calling back to back for a while, spread over forked
processes when one process's GIL would cap the load (a machine with many cores), with where
the machine's CPU went meanwhile.

    ids, refused, share = hammer(make_client, call, n=16, seconds=4.0, processes=1)
"""

from __future__ import annotations

import contextlib
import multiprocessing
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from bench.cpu_share import Sampler, Share


def hammer(
    make_client: Callable[[], Any],
    call: Callable[[Any, int], Any],
    n: int,
    seconds: float,
    processes: int = 1,
) -> tuple[list[str], dict[int, int], Share]:
    """`n` client threads calling `call(client, i)` back to back for `seconds`, spread over
    `processes` forked processes; the job ids of the admitted calls (200 or 202), the other
    answers by status, and where the machine's CPU went meanwhile. One process's GIL caps the
    load its threads make (about one core): on a machine with many cores the bench client,
    not the platform, would be what is measured."""
    processes = max(1, min(processes, n))
    barrier: Any
    if processes == 1:
        barrier = threading.Barrier(n + 1)
        out: list[tuple[list[str], dict[int, int], float]] = []
        t = threading.Thread(
            target=lambda: out.append(clients_loop(make_client, call, range(n), seconds, barrier))
        )
        t.start()
        with start_last(barrier, n) as sampler:
            t.join()
        admitted, others, _ = out[0]  # this process's CPU is in the sampler's reading
        return admitted, others, sampler.share
    # fork: the callables are closures over this process's clients and names, not picklable
    ctx = multiprocessing.get_context("fork")
    barrier = ctx.Barrier(n + 1)
    pipes, procs = [], []
    for p in range(processes):
        recv, send = ctx.Pipe(duplex=False)
        ks = range(p, n, processes)
        procs.append(
            ctx.Process(target=client_process, args=(make_client, call, ks, seconds, barrier, send))
        )
        procs[-1].start()
        send.close()
        pipes.append(recv)
    ids: list[str] = []
    refused: dict[int, int] = {}
    forked_cpu = 0.0
    with start_last(barrier, n) as sampler:
        for recv in pipes:
            got, no, cpu = recv.recv()  # EOFError if a client process failed
            ids += got
            forked_cpu += cpu
            for status, count in no.items():
                refused[status] = refused.get(status, 0) + count
        for proc in procs:
            proc.join()
    # the load processes are gone from /proc by the sampler's last reading: their threads
    # report their own CPU from the barrier on
    return ids, refused, sampler.share.plus("bench client", forked_cpu)


@contextlib.contextmanager
def start_last(barrier: Any, n: int) -> Iterator[Sampler]:
    """Once the `n` clients wait at `barrier`, sample the machine's CPU and let them go: the
    window holds all of their calls and none of their setting up."""
    while barrier.n_waiting < n:
        time.sleep(0.002)
    with Sampler() as sampler:
        barrier.wait()
        yield sampler


def client_process(
    make_client: Callable[[], Any],
    call: Callable[[Any, int], Any],
    ks: range,
    seconds: float,
    barrier: Any,
    conn: Any,
) -> None:
    """One forked load process: its clients' results and CPU seconds sent back over `conn`."""
    conn.send(clients_loop(make_client, call, ks, seconds, barrier))
    conn.close()


def clients_loop(
    make_client: Callable[[], Any],
    call: Callable[[Any, int], Any],
    ks: range,
    seconds: float,
    barrier: Any,
) -> tuple[list[str], dict[int, int], float]:
    """A thread per client k in `ks`: each connects, waits at `barrier` for every client
    (of every process) and the sampler, then calls for `seconds`. Returns the admitted ids,
    the other answers by status, and the CPU seconds the threads used past the barrier."""
    ids: list[str] = []
    refused: dict[int, int] = {}
    cpu = [0.0]
    lock = threading.Lock()

    def loop(k: int) -> None:
        client = make_client()
        barrier.wait()
        start = time.thread_time()
        end = time.monotonic() + seconds
        i = 0
        while time.monotonic() < end:
            r = call(client, k * 1_000_000 + i)
            i += 1
            with lock:
                if r.status_code in (200, 202):
                    ids.append(str(r.json()["id"]))
                else:
                    refused[r.status_code] = refused.get(r.status_code, 0) + 1
        used = time.thread_time() - start
        with lock:
            cpu[0] += used
        client.close()

    threads = [threading.Thread(target=loop, args=(k,)) for k in ks]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return ids, refused, cpu[0]
