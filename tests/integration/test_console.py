"""The web console's server side (real Redis and SQL, the app in process): its files and their
Content-Security-Policy, and the read endpoints it added — a job's timeline and the warm pool —
scoped to the caller's tenant (two tenants, each with its own worker and job).

The console in a real browser against the embedded platform: tests/e2e/test_console_e2e.py."""

from __future__ import annotations

import re
import time
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from html.parser import HTMLParser
from typing import Any

from fastapi.testclient import TestClient

from control_plane.api.routes.console import ASSETS, STATIC_DIR
from control_plane.db.session import make_engine, make_sessionmaker
from control_plane.reconcile.driver import Reconciler
from control_plane.services.workers import worker_records
from control_plane.settings import Settings
from tests.integration.api_helpers import WORKER, deploy, h, submit
from tests.integration.conftest import SteppedClock, provider


def report(client: TestClient, wid: str, state: str, at: datetime) -> None:
    body = {"state": state, "at": at.timestamp()}
    r = client.post(f"/internal/workers/{wid}/state", json=body, headers=WORKER)
    assert r.status_code == 200, r.text


def run_one_job(
    client: TestClient, key: str, loop: Reconciler, clock: SteppedClock
) -> tuple[str, float]:
    """A job on `demo` that waits for a worker booting for it (1 s boot, 2 s load, 0.5 s warm),
    runs 1.5 s and succeeds; the worker then drains and its busy time is shared out. Returns
    the job's id and the real seconds from its claim to its completion (the clock moves on its
    own too: the run took 1.5 s plus at most that)."""
    jid = submit(client, key)
    loop.tick(clock())
    wid = provider(loop).started[-1].worker_id
    for state, after_s in (("loading", 1.0), ("warming", 2.0), ("idle", 0.5)):
        report(client, wid, state, clock.advance(after_s))
    report(client, wid, "busy", clock())
    claimed = time.monotonic()
    r = client.post(f"/internal/jobs/{jid}/claim", json={"worker_id": wid}, headers=WORKER)
    assert r.status_code == 200, r.text
    attempt = r.json()["attempt"]
    clock.advance(1.5)
    body = {
        "worker_id": wid,
        "attempt": attempt,
        "status": "succeeded",
        "output": {"text": "t", "finish_reason": "length"},
        "prompt_tokens": 3,
        "generated_tokens": 4,
    }
    r = client.post(f"/internal/jobs/{jid}/complete", json=body, headers=WORKER)
    assert r.status_code == 200, r.text
    real_s = time.monotonic() - claimed
    for state in ("idle", "draining", "stopped"):
        report(client, wid, state, clock())
    loop.tick(clock())  # shares the closed busy segment out among its jobs
    return jid, real_s


# ------------------------------------------------------------------ the page and its files


class _Page(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.scripts: list[dict[str, str | None]] = []
        self.inline_script = False
        self.handlers: list[str] = []  # on*= attributes (inline script)
        self.styles: list[str] = []  # style= attributes (inline style)
        self.forms: list[dict[str, str | None]] = []
        self._in_script = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        self.handlers += [k for k in a if k.startswith("on")]
        self.styles += [k for k in a if k == "style"]
        if tag == "script":
            self.scripts.append(a)
            self._in_script = True
        if tag == "form":
            self.forms.append(a)

    def handle_endtag(self, tag: str) -> None:
        if tag == "script":
            self._in_script = False

    def handle_data(self, data: str) -> None:
        if self._in_script and data.strip():
            self.inline_script = True


def test_the_console_is_one_page_a_script_and_a_stylesheet_under_a_strict_csp(
    client: TestClient,
) -> None:
    for path in ("/console", "/console/"):
        r = client.get(path)
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
        csp = r.headers["content-security-policy"]
        assert "script-src 'self'" in csp and "default-src 'none'" in csp
        assert "unsafe-inline" not in csp and "unsafe-eval" not in csp
        assert "frame-ancestors 'none'" in csp and "form-action 'none'" in csp
        assert r.headers["x-content-type-options"] == "nosniff"
    page = _Page()
    page.feed(client.get("/console").text)
    assert [s.get("src") for s in page.scripts] == ["/console/static/console.js"]
    assert [s.get("type") for s in page.scripts] == ["module"]
    assert not page.inline_script and not page.handlers and not page.styles
    # a key typed into the form never goes into a URL, even with the script blocked
    assert [f.get("method") for f in page.forms] == ["post"]

    for name, media_type in ASSETS.items():
        r = client.get(f"/console/static/{name}")
        assert r.status_code == 200, name
        assert r.headers["content-type"] == media_type
        assert (
            r.headers["content-security-policy"]
            == client.get("/console").headers["content-security-policy"]
        )
    for bad in ("index.py", "..%2F..%2Fsettings.py", "console.js.map"):
        r = client.get(f"/console/static/{bad}")
        assert r.status_code == 404, bad
        assert r.headers["content-type"] == "application/problem+json"
    # the console is not part of the API's schema
    assert not any(p.startswith("/console") for p in client.get("/openapi.json").json()["paths"])


def test_the_scripts_never_parse_api_values_as_html_nor_keep_the_key_beyond_the_tab() -> None:
    served = {name for name in ASSETS if name.endswith(".js")}
    assert served == {p.name for p in STATIC_DIR.glob("*.js")}, "every module is served"
    js = "\n".join((STATIC_DIR / name).read_text() for name in sorted(served))
    for forbidden in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval("):
        assert forbidden not in js, forbidden
    assert "new Function" not in js and "localStorage" not in js and "cookie" not in js
    # nothing goes to the browser's log (a playground prompt, an answer, a new key's secret)
    assert not re.search(r"console\.(log|debug|info|warn|error|trace)\(", js)
    assert "sessionStorage" in js and "Authorization: `Bearer ${state.key}`" in js
    # the key is never put in a URL: no query parameter or hash is built from it
    assert not re.search(r"(searchParams\.set|location\.hash\s*=)[^\n]*state\.key", js)
    # modules import each other by path under /console/static only
    imports = re.findall(r'^import .* from "(.*)";$|^\} from "(.*)";$', js, flags=re.M)
    assert {a or b for a, b in imports} <= {f"./{name}" for name in served}


# ------------------------------------------------------------------ a job's timeline


def test_a_jobs_timeline_shows_its_wait_on_the_boot_the_run_and_its_cost(
    client: TestClient, keys: dict[str, str], loop: Reconciler, clock: SteppedClock
) -> None:
    key = keys["a"]
    deploy(client, key)
    jid, real_s = run_one_job(client, key, loop, clock)
    r = client.get(f"/v1/jobs/{jid}/timeline", headers=h(key))
    assert r.status_code == 200, r.text
    tl = r.json()
    assert tl["job_id"] == jid and tl["status"] == "succeeded" and tl["completed_at"]
    phases = {p["phase"]: p for p in tl["phases"]}
    assert [p["phase"] for p in tl["phases"]] == ["queue", "boot", "load", "warm", "run"]
    assert phases["queue"]["start"] == tl["created_at"]
    # the boot, load and warm-up of the worker started for it are the queue time, in order
    assert phases["queue"]["end"] == phases["run"]["start"] >= phases["warm"]["end"]
    assert phases["boot"]["end"] == phases["load"]["start"]
    assert phases["run"]["attempt"] == 1 and phases["run"]["outcome"] == "succeeded"
    assert 1.5 <= phases["run"]["seconds"] <= 1.5 + real_s + 0.001  # (ms rounding)
    wid = phases["run"]["worker_id"]
    assert {phases[p]["worker_id"] for p in ("boot", "load", "warm")} == {wid}
    records = client.get("/v1/billing/records", params={"worker_id": wid}, headers=h(key)).json()
    billed = {rec["phase"]: rec for rec in records["data"]}
    for phase, at_least_s in (("load", 2.0), ("warm", 0.5)):
        # the whole segment: the job waited through all of it
        assert phases[phase]["seconds"] == float(billed[phase]["seconds"]) >= at_least_s
        assert phases[phase]["amount"] == billed[phase]["amount"], "the worker's, as billed"
    # its cost is its share of the busy time, as /v1/usage says
    usage = next(
        u for u in client.get("/v1/usage", headers=h(key)).json()["data"] if u["job_id"] == jid
    )
    assert tl["cost"]["allocated"] is True
    assert Decimal(tl["cost"]["amount"]) == Decimal(usage["cost"]) > 0
    assert Decimal(phases["run"]["amount"]) == Decimal(usage["cost"])
    assert phases["run"]["billable"] is True
    # a read key sees it too; a job that does not exist is a 404 problem
    assert client.get(f"/v1/jobs/{jid}/timeline", headers=h(keys["ro"])).status_code == 200
    r = client.get("/v1/jobs/job_nope/timeline", headers=h(key))
    assert r.status_code == 404 and r.headers["content-type"] == "application/problem+json"


def test_a_waiting_job_has_an_open_queue_phase(
    client: TestClient, keys: dict[str, str], clock: SteppedClock
) -> None:
    deploy(client, keys["a"])
    jid = submit(client, keys["a"])
    clock.advance(3)
    tl = client.get(f"/v1/jobs/{jid}/timeline", headers=h(keys["a"])).json()
    (queue,) = tl["phases"]
    assert queue["phase"] == "queue" and queue["end"] is None
    assert queue["seconds"] >= 3
    assert tl["cost"] == {"billed_seconds": "0", "amount": "0.000000000", "allocated": False}


# ------------------------------------------------------------------ two tenants


def test_another_tenants_jobs_workers_and_the_pool_never_appear(
    client: TestClient,
    keys: dict[str, str],
    loop: Reconciler,
    clock: SteppedClock,
    settings: Settings,
) -> None:
    """Tenants A (the operator) and B each run a job on a deployment named `demo`: everything
    the console reads answers each tenant its own, and 404 / 403 for the rest."""
    ka, kb = keys["a"], keys["b"]
    deploy(client, ka)
    deploy(client, kb)
    job_a, _ = run_one_job(client, ka, loop, clock)
    job_b, _ = run_one_job(client, kb, loop, clock)
    engine = make_engine(settings.database_url)
    with make_sessionmaker(engine)() as s:  # a warm-pool worker: the platform's
        pool_worker = worker_records.create(
            s, None, "cpu", worker_records.POOL_REASON, datetime.now(UTC)
        )
        s.commit()
        pool_id = pool_worker.id
    engine.dispose()

    def read(key: str) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name, path in (
            ("deployments", "/v1/deployments"),
            ("workers", "/v1/workers"),
            ("jobs", "/v1/jobs"),
            ("usage", "/v1/usage"),
            ("records", "/v1/billing/records"),
            ("batches", "/v1/batches"),
        ):
            r = client.get(path, headers=h(key))
            assert r.status_code == 200, (path, r.text)
            out[name] = r.json()["data"]
        since = (datetime.now(UTC) - timedelta(days=7)).isoformat()
        for group in ("day", "phase", "deployment"):
            r = client.get(
                "/v1/usage/summary", params={"group_by": group, "since": since}, headers=h(key)
            )
            assert r.status_code == 200, r.text
            out[f"summary_{group}"] = r.json()
        return out

    a, b = read(ka), read(kb)
    assert [j["id"] for j in a["jobs"]] == [job_a] and [j["id"] for j in b["jobs"]] == [job_b]
    assert [u["job_id"] for u in a["usage"]] == [job_a]
    assert [u["job_id"] for u in b["usage"]] == [job_b]
    workers_a = {w["id"] for w in a["workers"]}
    workers_b = {w["id"] for w in b["workers"]}
    assert len(workers_a) == len(workers_b) == 1 and not workers_a & workers_b
    assert pool_id not in workers_a | workers_b
    assert {r["worker_id"] for r in a["records"]} == workers_a
    assert {r["worker_id"] for r in b["records"]} == workers_b
    assert [d["id"] for d in a["deployments"]] != [d["id"] for d in b["deployments"]]
    # each tenant's totals are its own records' sums
    for mine in (a, b):
        own = sum((Decimal(r["amount"]) for r in mine["records"]), Decimal(0))
        assert Decimal(mine["summary_day"]["total_amount"]) == own
        assert Decimal(mine["summary_phase"]["total_amount"]) == own

    # timelines: each its own; the other's answers 404 (as if it did not exist)
    for key, mine, other, own_workers in (
        (ka, job_a, job_b, workers_a),
        (kb, job_b, job_a, workers_b),
    ):
        tl = client.get(f"/v1/jobs/{mine}/timeline", headers=h(key)).json()
        assert {p["worker_id"] for p in tl["phases"]} - {None} == own_workers
        r = client.get(f"/v1/jobs/{other}/timeline", headers=h(key))
        assert r.status_code == 404
        assert client.get(f"/v1/jobs/{other}", headers=h(key)).status_code == 404
        r = client.get(f"/v1/jobs/{other}/webhook/deliveries", headers=h(key))
        assert r.status_code == 404

    # the warm pool is the platform's: the operator reads it, a tenant gets 403
    r = client.get("/v1/pool", headers=h(ka))
    assert r.status_code == 200, r.text
    assert [w["id"] for w in r.json()["data"]] == [pool_id]
    assert r.json()["counts"] == {"cpu": {"booting": 1}}
    assert client.get("/v1/pool", headers=h(keys["ro"])).status_code == 200
    r = client.get("/v1/pool", headers=h(kb))
    assert r.status_code == 403 and r.headers["content-type"] == "application/problem+json"
    assert client.get("/v1/pool").status_code == 401


def test_the_deploy_actions_strip_every_field_get_adds_to_the_spec() -> None:
    """The console PUTs a deployment back as its spec (PUT refuses unknown fields): the fields
    it strips are exactly those the answer adds to the spec."""
    from control_plane.api.responses import DeploymentPublic
    from control_plane.api.schemas import DeploymentSpec

    source = (STATIC_DIR / "deploy_actions.js").read_text()
    listed = re.search(r"const SERVER_FIELDS = \[(.*?)\];", source, re.S)
    assert listed is not None
    stripped = set(re.findall(r'"(\w+)"', listed.group(1)))
    added = set(DeploymentPublic.model_fields) - set(DeploymentSpec.model_fields)
    assert stripped == added
