"""The reconciler's and Celery's own /metrics (control_plane/metrics/server.py): what a process
records is scraped from its port over real HTTP and read with prometheus_client's parser, in
both modes (its own registry; a multiprocess directory), and the reconciler process serves it
from PLATFORM_METRICS_PORT. Celery's, after a real delivery: tests/integration/webhooks."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from control_plane.db.migrate import upgrade
from control_plane.embedded.processes import free_port
from control_plane.metrics import families, server
from tests.helpers import wait_for

REPO = Path(__file__).resolve().parents[2]


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample at 127.0.0.1:`port`/metrics: (name, sorted labels) → value."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def _families(port: int) -> set[str]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        return {f.name for f in text_string_to_metric_families(resp.read().decode())}


DELIVERED = ("platform_webhook_deliveries_total", (("event", "job.test"), ("outcome", "delivered")))


def test_a_process_serves_what_it_records() -> None:
    metrics = server.serve("127.0.0.1", 0, None)
    try:
        before = scrape(metrics.port).get(DELIVERED, 0.0)
        families.webhook_attempt("job.test", "delivered")
        assert scrape(metrics.port)[DELIVERED] == before + 1
    finally:
        metrics.close()


def test_a_multiprocess_directory_is_served_summed(tmp_path: Path) -> None:
    """Two processes that recorded into one directory and exited: their sums, from the files."""
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    record = (
        "from control_plane.metrics import families; "
        "families.billed('running', 'h100', 12.5); families.cold_start('h100', 'warm_pool')"
    )
    for _ in range(2):
        subprocess.run([sys.executable, "-c", record], cwd=REPO, env=env, check=True, timeout=60)
    metrics = server.serve("127.0.0.1", 0, str(tmp_path))
    try:
        samples = scrape(metrics.port)
    finally:
        metrics.close()
    billed = ("platform_billed_seconds_total", (("accelerator", "h100"), ("phase", "running")))
    cold = ("platform_cold_starts_total", (("accelerator", "h100"), ("tier", "warm_pool")))
    assert samples[billed] == 25.0
    assert samples[cold] == 2.0


def test_no_port_no_server() -> None:
    from control_plane.settings import Settings

    assert server.serve_from(Settings(metrics_port=None)) is None


def test_a_taken_port_fails_the_process() -> None:
    metrics = server.serve("127.0.0.1", 0, None)
    try:
        with pytest.raises(OSError):
            server.serve("127.0.0.1", metrics.port, None)
    finally:
        metrics.close()


@pytest.fixture
def reconciler(tmp_path: Path, redis_url: str) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    database_url = f"sqlite:///{tmp_path / 'platform.db'}"
    upgrade(database_url)
    port = free_port()
    env = {
        **os.environ,
        "PLATFORM_DATABASE_URL": database_url,
        "PLATFORM_REDIS_URL": redis_url,
        "PLATFORM_STATE_DIR": str(tmp_path / "state"),
        "PLATFORM_WORKER_TOKEN": "w" * 32,
        "PLATFORM_METRICS_PORT": str(port),
    }
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    with (tmp_path / "reconciler.log").open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "control_plane.reconcile"],
            cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    try:
        yield proc, port
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_the_reconciler_serves_its_families_on_its_port(
    reconciler: tuple[subprocess.Popen[bytes], int], tmp_path: Path
) -> None:
    proc, port = reconciler

    def answered() -> set[str] | None:
        assert proc.poll() is None, (tmp_path / "reconciler.log").read_text()[-3000:]
        try:
            return _families(port)
        except OSError:
            return None

    names = wait_for(answered, 60, what="the reconciler's /metrics")
    # the families it observes (cold starts, billing), and its own process's
    assert {"platform_cold_starts", "platform_billed_seconds", "process_start_time_seconds"} <= (
        names
    )
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=20) == 0
