"""The console's actions and failure views in a real browser (Debian's chromium driven by
playwright) against the embedded platform, each checked through the REST API: scaling and
redeploying a deployment, cancelling a job, creating then revoking a key, the playground's
streamed answer; a refused action shows the API's detail, a key without the scope sees the
action disabled with the reason; a deployment whose model cannot load is red, its failed
workers open and its job's error whole; filters survive a reload; nothing scrolls sideways at
420 px. Screenshots go to `artifacts/console/` (or $CONSOLE_ARTIFACTS_DIR).

Skipped without /usr/bin/chromium, as tests/e2e/test_console_e2e.py (whose fixtures these are)."""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import pytest

from sdk import Client
from tests.e2e import test_console_e2e as console_e2e
from tests.e2e.test_console_e2e import WAIT_MS, sign_in

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Page

pytestmark = pytest.mark.e2e

browser = console_e2e.browser  # the same module-scoped chromium (skips without it)
DEP = "console-actions"
CARD = f'article[data-deployment="{DEP}"]'


@pytest.fixture
def artifacts() -> Path:
    out = Path(os.environ.get("CONSOLE_ARTIFACTS_DIR", console_e2e.REPO / "artifacts" / "console"))
    out.mkdir(parents=True, exist_ok=True)
    return out


@pytest.fixture(scope="module")
def deployed(platform: dict[str, Any], demo_model: Path) -> Iterator[Client]:
    client = Client(base_url=platform["url"], api_key=platform["api_key"], timeout=120)
    client.deployments.create(name=DEP, model=str(demo_model), scaledown_window_s=120)
    yield client
    client.deployments.delete(DEP)


def rest(platform: dict[str, Any], method: str, path: str, key: str | None = None) -> Any:
    r = httpx.request(
        method,
        platform["url"] + path,
        headers={"Authorization": f"Bearer {key or platform['api_key']}"},
    )
    assert r.status_code < 300, r.text
    return r.json() if r.content else None


def wait_until(check: Any, what: str, timeout: float = 90) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := check()):
        assert time.monotonic() < deadline, what
        time.sleep(0.2)
    return value


def no_sideways_scroll(page: Page) -> None:
    width = page.evaluate("document.documentElement.scrollWidth")
    assert width <= 420, f"{page.url}: the page is {width} px wide at 420"


def watch(page: Page) -> list[str]:
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
    return problems


def test_an_admin_scales_redeploys_streams_cancels_and_manages_keys(
    browser: Browser, platform: dict[str, Any], deployed: Client, artifacts: Path
) -> None:
    url = platform["url"]
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    problems = watch(page)
    try:
        sign_in(page, url, platform["api_key"])
        page.wait_for_selector(CARD, timeout=WAIT_MS)

        # scale: min workers 1, through PUT; the API's own answer shows
        page.fill(f"{CARD} .scale-form input[name=min_workers]", "1")
        page.click(f"{CARD} .scale-form button[type=submit]")
        page.wait_for_selector(f"{CARD} .scale-form .outcome.ok", timeout=WAIT_MS)
        assert "min 1" in (page.text_content(f"{CARD} .scale-form .outcome") or "")
        assert rest(platform, "GET", f"/v1/deployments/{DEP}")["min_workers"] == 1
        # a refused action: the problem+json detail, nothing changed
        page.fill(f"{CARD} .scale-form input[name=min_workers]", "3")
        page.click(f"{CARD} .scale-form button[type=submit]")
        page.wait_for_selector(f"{CARD} .scale-form .outcome.error", timeout=WAIT_MS)
        refused = page.text_content(f"{CARD} .scale-form .outcome") or ""
        assert "422" in refused and "min_workers (3) exceeds max_workers (1)" in refused
        before = rest(platform, "GET", f"/v1/deployments/{DEP}")
        assert before["min_workers"] == 1

        # redeploy: the spec edited in the page, a new version
        page.click(f"{CARD} details.redeploy summary")
        page.wait_for_function(
            f"""() => document.querySelector('{CARD} details.redeploy textarea')
                 ?.value.includes('"scaledown_window_s"')""",
            timeout=WAIT_MS,
        )
        spec = json.loads(page.input_value(f"{CARD} details.redeploy textarea"))
        assert "version" not in spec and "workers" not in spec
        spec["scaledown_window_s"] = 90
        page.fill(f"{CARD} details.redeploy textarea", json.dumps(spec))
        page.click(f"{CARD} details.redeploy button.primary")
        page.wait_for_selector(f"{CARD} details.redeploy .outcome.ok", timeout=WAIT_MS)
        after = rest(platform, "GET", f"/v1/deployments/{DEP}")
        assert after["version"] == before["version"] + 1
        assert after["scaledown_window_s"] == 90 and after["min_workers"] == 1
        page.screenshot(path=str(artifacts / "10-actions-deployment.png"), full_page=True)

        # the playground: a streamed answer, equal to the job's output
        page.goto(f"{url}/console#/playground?deployment={DEP}")
        page.wait_for_selector(
            f'#pg-deployment option[value="{DEP}"]', state="attached", timeout=WAIT_MS
        )
        assert page.input_value("#pg-deployment") == DEP
        page.fill("#pg-prompt", "The weather")
        page.fill("#pg-max-tokens", "24")
        page.click("#playground button[type=submit]")
        page.wait_for_selector("#pg-output[data-done]", timeout=WAIT_MS)
        assert page.get_attribute("#pg-output", "data-status") == "succeeded"
        streamed = page.text_content("#pg-output") or ""
        job_id = page.get_attribute("#pg-output", "data-job")
        assert streamed and job_id
        assert rest(platform, "GET", f"/v1/jobs/{job_id}")["output"]["text"] == streamed
        assert "The weather" not in page.url, "the prompt never goes into the URL"
        page.screenshot(path=str(artifacts / "11-playground.png"), full_page=True)

        # cancel: a job queued behind a long one on the only worker
        busy = deployed.submit(DEP, input={"prompt": "A long story", "max_tokens": 480})
        waiting = deployed.submit(DEP, input={"prompt": "Another one", "max_tokens": 480})
        page.goto(f"{url}/console#/jobs/{waiting.id}")
        page.wait_for_selector("#cancel-job:not([disabled])", timeout=WAIT_MS)
        page.click("#cancel-job")
        page.wait_for_selector(".job-actions .outcome.ok", timeout=WAIT_MS)
        assert deployed.jobs.get(waiting.id).status == "canceled"
        page.wait_for_selector("h1 .badge.st-canceled", timeout=WAIT_MS)
        deployed.jobs.cancel(busy.id)

        # filters in the URL: a reload shows the same list
        page.goto(f"{url}/console#/jobs?deployment={DEP}&status=canceled")
        page.wait_for_selector(f'tr[data-job="{waiting.id}"]', timeout=WAIT_MS)
        page.reload()
        page.wait_for_selector(f'tr[data-job="{waiting.id}"]', timeout=WAIT_MS)
        assert page.input_value("#filter-deployment") == DEP
        assert page.input_value("#filter-status") == "canceled"
        statuses = page.eval_on_selector_all(
            "table.jobs tbody tr .badge", "els => els.map(e => e.textContent)"
        )
        assert statuses and set(statuses) == {"canceled"}, statuses
        page.select_option("#filter-status", "succeeded")
        page.wait_for_selector(f'tr[data-job="{job_id}"]', timeout=WAIT_MS)
        assert "status=succeeded" in page.url and f"deployment={DEP}" in page.url

        # keys: one created with its scopes (the secret shown once), then revoked
        page.goto(f"{url}/console#/keys")
        page.wait_for_selector("#create-key fieldset:not([disabled])", timeout=WAIT_MS)
        page.fill("#create-key input[name=name]", "console-e2e")
        page.uncheck('#create-key input[value="run"]')
        page.click("#create-key button[type=submit]")
        secret = page.wait_for_selector("#new-key-secret", timeout=WAIT_MS).text_content() or ""
        keys = rest(platform, "GET", "/v1/keys")["data"]
        made = next(k for k in keys if k["name"] == "console-e2e")
        assert made["scopes"] == ["read"] and secret.startswith(made["prefix"] + "_")
        assert rest(platform, "GET", "/v1/deployments", key=secret)["data"] is not None
        row = f'tr[data-key="{made["id"]}"]'
        page.wait_for_selector(row, timeout=WAIT_MS)
        assert secret not in (page.text_content(row) or ""), "never in the list"
        page.click(f"{row} button.danger")
        page.click(f"{row} button.danger")  # the confirmation
        page.wait_for_selector(f'{row}[data-revoked="true"]', timeout=WAIT_MS)
        revoked = next(
            k for k in rest(platform, "GET", "/v1/keys")["data"] if k["id"] == made["id"]
        )
        assert revoked["revoked_at"] is not None
        gone = httpx.get(url + "/v1/deployments", headers={"Authorization": f"Bearer {secret}"})
        assert gone.status_code == 401
        page.screenshot(path=str(artifacts / "12-keys.png"), full_page=True)

        # a phone's width: no view scrolls sideways (tables scroll in their box)
        page.set_viewport_size({"width": 420, "height": 860})
        for view, ready in (
            ("deployments", CARD),
            (f"jobs?deployment={DEP}", "table.jobs"),
            (f"jobs/{job_id}", "svg.timeline"),
            ("keys", "#create-key"),
            ("playground", "#playground"),
            ("usage", "#usage-total"),
        ):
            page.goto(f"{url}/console#/{view}")
            page.wait_for_selector(ready, timeout=WAIT_MS)
            page.wait_for_timeout(300)
            no_sideways_scroll(page)
        page.goto(f"{url}/console#/deployments")
        page.wait_for_selector(CARD, timeout=WAIT_MS)
        page.screenshot(path=str(artifacts / "13-phone-deployments.png"), full_page=True)
    finally:
        print("browser errors:", problems)
        context.close()
    assert problems == [], problems


def test_a_key_without_the_scope_sees_each_action_disabled_with_the_reason(
    browser: Browser, platform: dict[str, Any], deployed: Client, artifacts: Path
) -> None:
    url = platform["url"]
    created = httpx.post(
        url + "/v1/keys",
        json={"name": "console-read-only", "scopes": ["read"]},
        headers={"Authorization": f"Bearer {platform['api_key']}"},
    )
    assert created.status_code == 201, created.text
    key = created.json()["key"]
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    try:
        sign_in(page, url, key)
        page.wait_for_selector(CARD, timeout=WAIT_MS)
        assert "(read)" in (page.text_content("#key-prefix") or "")
        assert page.is_disabled(f"{CARD} .scale-form input[name=min_workers]")
        assert page.is_disabled(f"{CARD} .scale-form button[type=submit]")
        why = page.text_content(f'{CARD} .scale-form .why[data-needs="deploy"]') or ""
        assert "needs the 'deploy' scope" in why and "read" in why
        page.screenshot(path=str(artifacts / "14-read-only.png"), full_page=True)

        page.goto(f"{url}/console#/playground?deployment={DEP}")
        page.wait_for_selector('#playground .why[data-needs="run"]', timeout=WAIT_MS)
        assert page.is_disabled("#playground button[type=submit]")
        assert page.is_disabled("#pg-prompt")

        page.goto(f"{url}/console#/keys")
        page.wait_for_selector('#create-key .why[data-needs="admin"]', timeout=WAIT_MS)
        assert page.is_disabled("#create-key button[type=submit]")
        page.wait_for_selector("text=may not list keys", timeout=WAIT_MS)
    finally:
        context.close()


def test_a_failing_deployment_is_red_with_its_failed_workers_and_error_in_full(
    browser: Browser, platform: dict[str, Any], demo_model: Path, tmp_path: Path, artifacts: Path
) -> None:
    url = platform["url"]
    client = Client(base_url=url, api_key=platform["api_key"], timeout=120)
    # a model whose weights disappear after the deploy: its workers fail to load it
    model = tmp_path / "weights-gone"
    shutil.copytree(demo_model, model)
    name = "console-broken"
    client.deployments.create(name=name, model=str(model))
    (model / "model.safetensors").unlink()
    job = client.submit(name, input={"prompt": "hi", "max_tokens": 2})
    final = wait_until(
        lambda: (j := client.jobs.get(job.id)).status in ("failed", "succeeded") and j,
        "the job did not end",
    )
    assert final.status == "failed" and final.error is not None
    message = f"{final.error['type']}: {final.error['message']}"

    card = f'article[data-deployment="{name}"]'
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    try:
        sign_in(page, url, platform["api_key"])
        page.wait_for_selector(f'{card}[data-health="failing"]', timeout=WAIT_MS)
        badge = f"{card} .badge.health"
        assert page.text_content(badge) == "failing"
        colour = page.eval_on_selector(badge, "e => getComputedStyle(e).backgroundColor")
        assert colour == "rgb(217, 45, 32)", colour  # --c-failed, not the blue of idle
        # the failed workers open, not folded, with why they failed
        page.wait_for_selector(f"{card} .failed-workers tbody tr", timeout=WAIT_MS)
        assert page.is_visible(f"{card} .failed-workers td.reason")
        assert page.locator(f"{card} details.workers-list[open]").count() == 0
        # the health filter, in the URL, survives a reload
        page.select_option("#filter-health", "failing")
        page.wait_for_function("() => location.hash.includes('health=failing')")
        page.reload()
        page.wait_for_selector(card, timeout=WAIT_MS)
        assert page.input_value("#filter-health") == "failing"
        assert page.locator(CARD).count() == 0 or page.get_attribute(CARD, "data-health") == (
            "failing"
        )
        page.screenshot(path=str(artifacts / "15-failing-deployment.png"), full_page=True)

        # the job's error, whole: in the list and on its page, not clipped
        page.goto(f"{url}/console#/jobs?deployment={name}&status=failed")
        cell = f'tr[data-job="{job.id}"] .error-text'
        page.wait_for_selector(cell, timeout=WAIT_MS)
        assert page.text_content(cell) == message
        clipped = "e => e.scrollHeight > e.clientHeight + 1 || e.scrollWidth > e.clientWidth + 1"
        assert not page.eval_on_selector(cell, clipped)
        page.goto(f"{url}/console#/jobs/{job.id}")
        page.wait_for_selector("pre.error-text", timeout=WAIT_MS)
        assert page.text_content("pre.error-text") == message
        assert not page.eval_on_selector("pre.error-text", clipped)
        page.screenshot(path=str(artifacts / "16-failed-job.png"), full_page=True)
    finally:
        context.close()
    client.deployments.delete(name)
