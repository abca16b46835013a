"""The web console in a real browser (Debian's chromium driven by playwright) against the
embedded platform as real processes: sign in with the key, watch a deployment scale from zero
while a call runs, open the job's timeline, see the cost charts; another tenant's key sees
none of it. Screenshots go to `artifacts/console/` (or $CONSOLE_ARTIFACTS_DIR), printed at the
start; look at them.

No browser is ever downloaded: the test skips without /usr/bin/chromium (fails on CI, where
.ci/run installs it), like the PostgreSQL tests."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import pytest

from sdk import Client
from tests.e2e.conftest import cli

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Page

pytestmark = pytest.mark.e2e

CHROMIUM = os.environ.get("PLATFORM_TEST_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
REPO = Path(__file__).resolve().parents[2]
WAIT_MS = 90_000


def _missing(reason: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"{reason} on CI: .ci/run should have installed it")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    """Debian's chromium under playwright (requested before the platform: a machine without
    chromium skips before anything starts).

    NOTE: module-scoped, never longer: while `sync_playwright` is open its event loop counts as
    running in the main thread, and every later test that calls asyncio.run() would fail."""
    if not os.access(CHROMIUM, os.X_OK):
        _missing(f"chromium is not installed at {CHROMIUM} (apt-get install chromium)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _missing("playwright is not installed (pip install -e '.[dev]')")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS, headless=True)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture
def artifacts(request: pytest.FixtureRequest) -> Path:
    out = Path(os.environ.get("CONSOLE_ARTIFACTS_DIR", REPO / "artifacts" / "console"))
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("*.png"):
        old.unlink()
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(f"\nconsole screenshots: {out}")
    return out


class Receiver:
    """A webhook receiver on loopback, answering 200."""

    def __init__(self) -> None:
        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers["content-length"]))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = HTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)


def sign_in(page: Page, url: str, key: str, screenshot: Path | None = None) -> None:
    response = page.goto(url + "/console")
    assert response is not None and response.status == 200
    csp = response.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "unsafe-inline" not in csp
    page.fill("#api-key", key)
    if screenshot is not None:
        page.screenshot(path=str(screenshot))
    page.click("#login-form button[type=submit]")
    page.wait_for_selector("#view:not([hidden])", timeout=WAIT_MS)
    assert key not in page.url, "the key never goes into a URL"
    assert page.evaluate("sessionStorage.getItem('platform-console-key')") == key
    assert key not in page.content(), "nor into the page"


def workers_total(page: Page, deployment: str) -> int:
    value = page.get_attribute(
        f'article[data-deployment="{deployment}"] .workers', "data-workers-total"
    )
    return int(value or 0)


def test_console_shows_a_cold_start_its_timeline_and_cost(
    browser: Browser, platform: dict[str, Any], demo_model: Path, artifacts: Path
) -> None:
    env, url, key = platform["env"], platform["url"], platform["api_key"]
    up = cli("models", "upload", str(demo_model), "models/console/", env=env)
    assert up.returncode == 0, up.stdout + up.stderr
    dep = cli(
        "deploy", "--name", "console", "--model", "store://models/console/",
        "--scaledown-window", "30", env=env,
    )  # fmt: skip
    assert dep.returncode == 0, dep.stdout + dep.stderr

    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    problems: list[str] = []
    page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    page.on(
        "console",
        lambda m: (
            problems.append(m.text)
            if m.type == "error" and "Failed to load resource" not in m.text
            else None
        ),
    )
    receiver = Receiver()
    client = Client(base_url=url, api_key=key, timeout=120)
    try:
        sign_in(page, url, key, artifacts / "00-sign-in.png")
        card = 'article[data-deployment="console"]'
        page.wait_for_selector(card, timeout=WAIT_MS)
        assert workers_total(page, "console") == 0, "nothing runs while nobody calls"
        assert "scaled to zero" in (page.text_content(card) or "")
        page.screenshot(path=str(artifacts / "01-deployments-at-zero.png"), full_page=True)

        # a call: the deployment scales from zero while the console watches
        job = client.submit(
            "console", input={"prompt": "The weather", "max_tokens": 48}, webhook=receiver.url
        )
        page.wait_for_function(
            """() => Number(document.querySelector('article[data-deployment="console"] .workers')
                 ?.dataset.workersTotal || 0) > 0""",
            timeout=WAIT_MS,
            polling=250,
        )
        page.screenshot(path=str(artifacts / "02-scaling-from-zero.png"), full_page=True)
        final = job.wait(timeout=120)
        assert final.status == "succeeded"
        # the autoscaler's decision and reason, and a queue-depth chart with its series
        page.wait_for_selector(f"{card} .badge.reason[data-reason]", timeout=WAIT_MS)
        assert page.locator(f"{card} svg.chart path.line").count() >= 1
        # the worker serving (the page polls every 2 s: it may still show the boot)
        page.wait_for_selector(
            f'{card} .chip[data-state="idle"], {card} .chip[data-state="busy"]', timeout=WAIT_MS
        )
        # its workers, unfolded: the list stays open across the page's redraws
        page.click(f"{card} details.workers-list summary")
        page.wait_for_timeout(2500)
        assert page.get_attribute(f"{card} details.workers-list", "open") is not None
        assert page.locator(f"{card} details.workers-list tbody tr").count() >= 1
        page.screenshot(path=str(artifacts / "03-deployment-serving.png"), full_page=True)

        # the jobs list, then the job's timeline: queue (with the worker's load), run, cost
        page.click('#nav a[data-view="jobs"]')
        row = f'tr[data-job="{job.id}"]'
        page.wait_for_selector(row, timeout=WAIT_MS)
        assert "succeeded" in (page.text_content(row) or "")
        page.screenshot(path=str(artifacts / "04-jobs.png"), full_page=True)
        page.click(f"{row} a")
        page.wait_for_selector('svg.timeline rect[data-phase="run"]', timeout=WAIT_MS)
        phases = page.eval_on_selector_all(
            "svg.timeline rect[data-phase]", "els => els.map(e => e.dataset.phase)"
        )
        assert phases[0] == "queue" and "run" in phases and "load" in phases, phases
        # the job's cost once its busy time is shared out; the webhook's delivery
        page.wait_for_selector('.amount[data-allocated="true"]', timeout=WAIT_MS)
        amount = page.text_content('.amount[data-allocated="true"]') or ""
        assert amount.startswith("$") and amount != "$0.00", amount
        page.wait_for_selector("text=job.completed", timeout=WAIT_MS)
        # its log lines: the platform's and its worker's, never its prompt
        page.wait_for_selector("table.logs tbody tr", timeout=WAIT_MS)
        logged = page.text_content("table.logs") or ""
        assert "api" in logged and "worker" in logged, logged[:500]
        assert "The weather" not in logged
        page.screenshot(path=str(artifacts / "05-job-timeline.png"), full_page=True)

        # usage and cost: by day and by phase, drawn as SVG bars
        page.click('#nav a[data-view="usage"]')
        page.wait_for_selector('svg[aria-label="cost by phase"] rect.bar', timeout=WAIT_MS)
        heights = page.eval_on_selector_all(
            'svg[aria-label="cost by day"] rect.bar',
            "els => els.map(e => Number(e.getAttribute('height')))",
        )
        assert max(heights) > 0, heights
        assert (page.text_content("#usage-total") or "$0.00") != "$0.00"
        billed = page.eval_on_selector_all(
            'svg[aria-label="cost by phase"] rect.bar',
            "els => els.map(e => e.getAttribute('class'))",
        )
        assert any("ph-busy" in c for c in billed), billed
        page.screenshot(path=str(artifacts / "06-usage.png"), full_page=True)

        page.click("#sign-out")
        page.wait_for_selector("#login:not([hidden])")
        assert page.evaluate("sessionStorage.getItem('platform-console-key')") is None
    finally:
        print("browser errors:", problems)  # shown with the failure's captured output
        context.close()
        receiver.close()

    # another tenant's key: none of the operator's deployments, jobs or costs, no pool
    created = httpx.post(
        url + "/v1/tenants",
        json={"name": "console-other"},
        headers={"Authorization": f"Bearer {key}"},
    )
    assert created.status_code == 201, created.text
    other_key = created.json()["admin_key"]["key"]
    context = browser.new_context(viewport={"width": 1280, "height": 700})
    page = context.new_page()
    try:
        sign_in(page, url, other_key)
        page.wait_for_selector("text=No deployments yet", timeout=WAIT_MS)
        assert page.locator("article[data-deployment]").count() == 0
        assert "Warm pool" not in (page.text_content("#view") or "")
        page.screenshot(path=str(artifacts / "07-other-tenant.png"), full_page=True)
        page.goto(url + f"/console#/jobs/{job.id}")
        page.wait_for_selector("text=does not exist", timeout=WAIT_MS)
        page.click('#nav a[data-view="jobs"]')
        page.wait_for_selector("text=No jobs match", timeout=WAIT_MS)
        page.click('#nav a[data-view="usage"]')
        page.wait_for_selector("#usage-total", timeout=WAIT_MS)
        assert page.text_content("#usage-total") == "$0.00"
        assert "console" not in (page.text_content("#view") or "").replace("console-other", "")
    finally:
        context.close()
    assert problems == [], problems
    client.deployments.delete("console")
