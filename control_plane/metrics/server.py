"""The reconciler's and the Celery worker's own /metrics: their event families over HTTP.

The API's `/metrics` adds up the multiprocess files of every control-plane process of its host
(`exposition.render`). In a cluster or under compose the reconciler and Celery run in pods or
containers of their own, so their files (or their registries) are out of the API's reach; each
serves them itself, on PLATFORM_METRICS_HOST:PLATFORM_METRICS_PORT, and Prometheus scrapes
every process (docs/observability.md). The state families stay with the API: read from SQL and
Redis, once per scrape.

NOTE: no authentication, as on workers' /metrics: labels name deployments and tenant ids, so
the port is for the in-cluster scraper only (the chart's NetworkPolicy admits nothing else).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from wsgiref.simple_server import WSGIServer

from prometheus_client import start_http_server

from control_plane.metrics import exposition
from control_plane.settings import Settings

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class MetricsServer:
    """A running /metrics (a daemon thread); `close` stops it."""

    server: WSGIServer  # prometheus_client's, serving every path with the families

    @property
    def port(self) -> int:
        return self.server.server_port

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def serve(host: str, port: int, multiproc: str | None) -> MetricsServer:
    """Serve this process's event families (from `multiproc`'s files when set: every process
    writing there) on `host`:`port` (0: any free port). OSError when it cannot bind: a probe
    and a scrape target depend on this port, so the process must not run without it."""
    server, _ = start_http_server(port, host, registry=exposition.events(multiproc))
    log.info("metrics on %s:%d/metrics", host, server.server_port)
    return MetricsServer(server)


def serve_from(settings: Settings) -> MetricsServer | None:
    """`serve` at the settings' address; None when PLATFORM_METRICS_PORT is unset."""
    if settings.metrics_port is None:
        return None
    return serve(settings.metrics_host, settings.metrics_port, exposition.multiproc_dir())
