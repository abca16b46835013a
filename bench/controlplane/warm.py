"""The warm path, one request at a time: sequential 1-token sync runs (the platform's overhead
and its stages, as three kinds of client see them) and streamed runs (the first SSE event and
the first output)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

# Warm runs per client connection. With two API processes (the embedded default) the kernel
# places each connection on one of them by a hash of its addresses, and a caller whose
# connection shares a process with the worker's is answered in process, the others through
# Redis: 0.6-0.9 ms apart at the p50 (docs/benchmarks.md, Control plane). One connection for
# the whole run measured one placement or the other by chance; a new one every 25 runs
# measures the mix that many callers see.
RUNS_PER_CONNECTION = 25


def warm_path(
    plat: Any, name: str, body: dict[str, Any], runs: int
) -> tuple[list[float], dict[str, list[float]], list[float], list[float]]:
    """Sequential 1-token sync runs: overhead (latency - execution) and the platform's stages,
    as httpx (the SDK's client) sees them; and, interleaved, the overhead as a client of the
    standard library sees it (the worker's `JsonHttp`: ~0.3 ms less of its own per request
    each way), and as a caller of the SDK sees it (`Client.run`: httpx, with a new
    Idempotency-Key on every call, which the platform looks up and stores). Each client takes
    a new connection every RUNS_PER_CONNECTION runs (its first run there is not counted: it
    opens the connection)."""
    import httpx

    from bench.coldstart.phases import parse_iso
    from sdk import Client
    from worker.runtime.json_http import JsonHttp

    url, key = plat.state["url"], plat.state["api_key"]
    auth = {"Authorization": f"Bearer {key}"}
    path = f"/v1/deployments/{name}/run"

    def connected() -> tuple[list[Any], list[Callable[[], dict[str, Any]]]]:
        plain = httpx.Client(base_url=url, headers=auth, timeout=120.0)
        lean = JsonHttp(url, auth, 120.0)
        sdk = Client(base_url=url, api_key=key, timeout=120.0)
        calls: list[Callable[[], dict[str, Any]]] = [
            lambda: plain.post(path, json=body).json(),
            lambda: lean.post(path, body).json(),
            lambda: sdk.run(name, body["input"], wait=False).raw,
        ]
        for call in calls:
            call()  # opens its connection
        return [plain, lean, sdk], calls

    overheads: tuple[list[float], ...] = ([], [], [])
    stages: dict[str, list[float]] = {"accept": [], "claim": [], "answer": []}
    opened: list[Any] = []
    calls: list[Callable[[], dict[str, Any]]] = []
    for i in range(3 * runs):
        if i % (3 * RUNS_PER_CONNECTION) == 0:
            for client in opened:
                client.close()
            opened, calls = connected()
        t0 = time.time()
        job = calls[i % 3]()
        t1 = time.time()
        if job.get("status") != "succeeded":
            raise SystemExit(f"a warm run did not succeed: {job.get('status')}")
        created, started, done = (
            parse_iso(job[k]) for k in ("created_at", "started_at", "completed_at")
        )
        overheads[i % 3].append((t1 - t0 - (done - started)) * 1000)
        if i % 3 == 0:
            stages["accept"].append((created - t0) * 1000)  # sent -> stored
            stages["claim"].append((started - created) * 1000)  # stored -> a worker claimed it
            stages["answer"].append((t1 - done) * 1000)  # completed -> the client has it
    for client in opened:
        client.close()
    return overheads[0], stages, overheads[1], overheads[2]


def sse(
    base: str, key: str, name: str, body: dict[str, Any], runs: int, httpx: Any, *, leave: bool
) -> tuple[list[float], list[float]]:
    """Sequential streamed runs: request sent -> first SSE event, and -> first `output` event.

    Each stream is read to its end (`completed`), as the SDK does; with `leave`, the client
    leaves it at its first output instead: the platform then cancels the job (its client is
    gone) while the next request is admitted."""
    first_event: list[float] = []
    first_output: list[float] = []
    with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {key}"}) as c:
        for _ in range(runs):
            t0 = time.perf_counter()
            seen_any = seen_output = None
            with c.stream(
                "POST", f"/v1/deployments/{name}/run", json={**body, "stream": True}
            ) as resp:
                for line in resp.iter_lines():
                    if not line.startswith("event:"):
                        continue
                    now = time.perf_counter()
                    if seen_any is None:
                        seen_any = now
                        first_event.append((now - t0) * 1000)
                    if seen_output is None and line.split(":", 1)[1].strip() == "output":
                        seen_output = now
                        first_output.append((now - t0) * 1000)
                        if leave:
                            break
    return first_event, first_output
