"""One scrape of the control plane: its event families plus the state families, as text.

With PROMETHEUS_MULTIPROC_DIR set, the event families are read from the files every
control-plane process of this host writes there (prometheus_client's multiprocess mode: counters
and histograms summed over processes, dead ones included); without it, from this process's
registry (with its process_* and python_* families). The state families (`snapshot.Fleet`) are
added once, by this process.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest
from prometheus_client.core import Metric
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

from control_plane.metrics.families import MULTIPROC_ENV

CONTENT_TYPE = CONTENT_TYPE_LATEST


def multiproc_dir() -> str | None:
    """The multiprocess directory of this process (None: single-process mode). It must be set
    before the process starts: prometheus_client picks its mode at import."""
    return os.environ.get(MULTIPROC_ENV) or None


class _ThisProcess(Collector):
    """The default registry's families (this process's own), inside another registry."""

    def collect(self) -> Iterable[Metric]:
        return REGISTRY.collect()


def events(multiproc: str | None) -> CollectorRegistry:
    """A registry of the event families: from `multiproc`'s files, or this process's own."""
    registry = CollectorRegistry(auto_describe=False)
    if multiproc:
        MultiProcessCollector(registry, path=multiproc)  # type: ignore[no-untyped-call]
    else:
        registry.register(_ThisProcess())
    return registry


def render(state: Collector, multiproc: str | None) -> bytes:
    """The exposition text of the event families (from `multiproc`'s files, or this process)
    and of `state`."""
    registry = events(multiproc)
    registry.register(state)
    return generate_latest(registry)
