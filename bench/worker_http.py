"""What one of a worker's requests to the control plane costs the client, by HTTP client.

    .venv/bin/python bench/worker_http.py             # seconds
    .venv/bin/python bench/worker_http.py --requests 5000 --rounds 5

A worker claims each job and reports its end with a JSON POST (worker/runtime/json_http.py).
This sends report-sized POSTs over one kept-alive connection to a local HTTP/1.1 server
that answers each at once with a fixed JSON body (its thread reads the request and writes
the answer: the same for every client), through httpx (what the worker used before), the
standard library's http.client, and JsonHttp, in alternating rounds, and prints µs per request.
The last line is `{"bench": "worker_http", "us_per_request": {client: median}}`.
"""

from __future__ import annotations

import argparse
import http.client
import json
import socket
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from worker.runtime.json_http import JsonHttp

ANSWER = json.dumps({"job_id": "job_01a20ed6098873317d3729", "claimed": True, "attempt": 1})
RESPONSE = (
    f"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
    f"content-length: {len(ANSWER)}\r\n\r\n{ANSWER}"
).encode()
BODY = {
    "worker_id": "wrk_01a20ed6098873317d3729",
    "attempt": 1,
    "status": "succeeded",
    "output": {"text": "x" * 64},
    "prompt_tokens": 2,
    "generated_tokens": 1,
}
PATH = "/internal/jobs/job_01a20ed6098873317d3729/complete"


def _serve(conn: socket.socket) -> None:
    buf = b""
    with conn:
        while True:
            data = conn.recv(65536)
            if not data:
                return
            buf += data
            while b"\r\n\r\n" in buf:
                head, rest = buf.split(b"\r\n\r\n", 1)
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":", 1)[1])
                if len(rest) < length:
                    break
                buf = rest[length:]
                conn.sendall(RESPONSE)


def server() -> socket.socket:
    listener = socket.create_server(("127.0.0.1", 0))

    def accept() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:  # closed: the bench is over
                return
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            threading.Thread(target=_serve, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    return listener


def clients(port: int) -> dict[str, Callable[[], object]]:
    import httpx

    url = f"http://127.0.0.1:{port}"
    headers = {"Authorization": "Bearer t"}
    hx = httpx.Client(base_url=url, headers=headers, timeout=30)
    hc = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    jh = JsonHttp(url, headers, timeout_s=30)

    def with_httpx() -> object:
        return hx.post(PATH, json=BODY).json()

    def with_http_client() -> object:
        hc.request(
            "POST", PATH, body=json.dumps(BODY).encode(),
            headers={**headers, "Content-Type": "application/json"},
        )  # fmt: skip
        return json.loads(hc.getresponse().read())

    def with_json_http() -> object:
        return jh.post(PATH, BODY).json()

    return {"httpx": with_httpx, "http.client": with_http_client, "JsonHttp": with_json_http}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--requests", type=int, default=3000, help="per client and round")
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    listener = server()
    calls = clients(listener.getsockname()[1])
    per: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(args.rounds):
        for name, call in calls.items():
            for _ in range(200):  # warm: connection open, code paths taken
                call()
            start = time.perf_counter()
            for _ in range(args.requests):
                call()
            per[name].append((time.perf_counter() - start) / args.requests * 1e6)
    listener.close()
    print("| client | µs per request, each round | median |")
    print("|---|---|--:|")
    for name, values in per.items():
        rounds = ", ".join(f"{v:.0f}" for v in values)
        print(f"| {name} | {rounds} | {statistics.median(values):.0f} |")
    medians = {name: round(statistics.median(v), 1) for name, v in per.items()}
    print(json.dumps({"bench": "worker_http", "us_per_request": medians}))


if __name__ == "__main__":
    main()
