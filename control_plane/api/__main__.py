"""`python -m control_plane.api`: serve the API with uvicorn using settings from the env.

With PLATFORM_API_PROCESSES above 1, several of these processes serve one port: each binds its
own listening socket with SO_REUSEPORT and the kernel spreads new connections among them (by a
hash of the connection's addresses, so keep-alive clients spread too). They keep nothing in
memory that must agree: the database and Redis are the truth, and the edge caches follow the
generation counter in Redis.
"""

from __future__ import annotations

import socket

import uvicorn

from common import heap, logs, tracing
from control_plane.api import server
from control_plane.api.app import create_app
from control_plane.settings import Settings


def shared_socket(host: str, port: int) -> socket.socket:
    """A listening socket on (host, port) that the other API processes bind too."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    return sock


def main() -> None:
    settings = Settings()
    logs.configure("api", settings)
    tracing.configure("api", settings)
    app = create_app(settings)
    # Imports are done: a full collection walked them all (~0.2 s with the event loop stopped,
    # a few times a minute under load) before they were frozen.
    heap.settle()
    config = server.config(
        app,
        settings,
        log_config=None,  # uvicorn's records go to the handler above, at the API's level
        access_log=False,
    )
    serving = uvicorn.Server(config)
    if settings.api_processes > 1:
        serving.run(sockets=[shared_socket(settings.api_host, settings.api_port)])
    else:
        serving.run()


if __name__ == "__main__":
    main()
