"""One timed cold request (a round) on a running platform, and the loader alone streaming
the same weights (`weight_stream_s`), in a fresh process."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from bench.coldstart.driver import Platform, Uploaded
from bench.coldstart.models import Model
from bench.coldstart.phases import phases, timeline
from bench.coldstart.report import Round
from bench.coldstart.scenarios import Scenario
from bench.coldstart.sse import sse_events
from bench.coldstart.worker_log import parse_load_log
from bench.loaderbench.contenders import run_child

ENTRY = Path(__file__).resolve().parent.parent / "cold_start.py"  # runs the loader child
TERMINAL = frozenset({"completed", "failed", "canceled", "expired", "timed_out"})
PROMPT = "The weather changed in the afternoon."  # never logged, nor the output
MAX_TOKENS = 8


def prepare(p: Platform, scenario: Scenario, model: Uploaded, engine: str) -> None:
    """Make the weights sit where `scenario` says, with its deployment created and none of
    its workers running; with a pool, until one idle pool worker waits and its heartbeat
    tells placement the truth about its host tier."""
    p.empty_tiers(scenario.empty)
    if scenario.needs_tier and scenario.needs_tier not in p.tiers_holding(model):
        raise SystemExit(
            f"{scenario.label}: the {scenario.needs_tier} tier lacks {model.weights_uri}, "
            "though the previous round's worker filled the tiers"
        )
    if scenario.pool:
        p.wait_pool_ready(model, host_hit="host" in p.tiers_holding(model), engine=engine)


def cold_round(p: Platform, model: Model, up: Uploaded, scenario: Scenario, i: int) -> Round:
    """One request at zero workers of a fresh deployment, timed to its first token; then,
    untimed, until the worker has filled the cache tiers (the next scenario's hit)."""
    name = f"cs-{model.key}-{scenario.key.replace('_', '-')}-{i}-{p.token}"
    p.wait_no_workers()
    spec = {
        "name": name,
        "model": up.store_uri,
        "min_workers": 0,
        "max_workers": 1,
        "accelerator": "cpu",
        "engine": model.engine,
        # kept up until the bench has seen its tier fill (a drain cancels one), then deleted
        "scaledown_window_s": 120,
    }
    p.http.post("/v1/deployments", json=spec).raise_for_status()
    try:
        edge_s = read_model_at_edge(p, name)
        prepare(p, scenario, up, model.engine)
        os.sync()  # no writeback of the last round's files during this one
        time.sleep(0.5)
        first: dict[str, float] = {}
        starting: list[str] = []
        worker_id = ""
        body = {"input": {"prompt": PROMPT, "max_tokens": MAX_TOKENS}, "stream": True}
        sent = time.time()
        with p.http.stream("POST", f"/v1/deployments/{name}/run", json=body) as resp:
            resp.raise_for_status()
            job_id = resp.headers["x-job-id"]
            for event, data in sse_events(resp.iter_lines()):
                first.setdefault(event, time.time())
                if event == "starting":
                    phase = json.loads(data).get("phase")
                    if phase and phase not in starting:
                        starting.append(str(phase))
                if event == "running":
                    worker_id = json.loads(data).get("worker_id", "")
                if event in TERMINAL:
                    break
        job = p.http.get(f"/v1/jobs/{job_id}").json()
        if job["status"] != "succeeded":
            raise SystemExit(f"{name}: job {job_id} {job['status']}: {job.get('error')}")
        if not worker_id:  # a stream that missed `running`: the usage record names it
            usage = p.http.get("/v1/usage", params={"deployment": name}).json()["data"]
            worker_id = usage[0]["workers"][0]
        p.worker_ids.add(worker_id)
        placed = p.placement(name) or {}
        # the latest placement is this worker's, unless something else started meanwhile
        choice = str(placed.get("choice")) if placed.get("worker_id") == worker_id else "?"
        first_event = "output" if "output" in first else "completed"
        t = timeline(sent, job, p.billing_records(worker_id), first[first_event])
        log_path = p.state_dir / "logs" / "workers" / f"{worker_id}.log"
        log_text = log_path.read_text(errors="replace") if log_path.exists() else ""
        load_log = parse_load_log(log_text)
        ttft = ((job.get("output") or {}).get("timings") or {}).get("ttft_s")
        p.wait_tiers_filled(up, load_log.source if load_log else "origin")
    finally:
        p.http.delete(f"/v1/deployments/{name}")
    return Round(
        scenario.key,
        model.key,
        phases(t),
        load_log.tier if load_log else "?",
        load_log,
        first_event,
        ttft,
        edge_s,
        choice,
        tuple(starting),
    )


def read_model_at_edge(p: Platform, name: str) -> float:
    """Have the API read the deployment's tokenizer and config (services/models/model_meta.py: on
    the first call of a deployment version, then kept), as for any deployment called before: a
    call whose max_tokens cannot fit the context is refused (422) after that read, before
    anything is written. Returns the seconds it took (what a first call pays on top)."""
    body = {"input": {"prompt": PROMPT, "max_tokens": 32_768}}
    t0 = time.perf_counter()
    refused = p.http.post(f"/v1/deployments/{name}/run", json=body)
    if refused.status_code != 422:
        raise SystemExit(f"{name}: the edge read expected a 422, got {refused.status_code}")
    return time.perf_counter() - t0


def stream_child(uri: str, endpoint_url: str) -> None:
    """In a fresh process: the loader alone streams `uri`; prints one RESULT line."""
    import torch  # noqa: F401  (import cost is not measured, as in bench/loader.py)

    import loader

    options = loader.LoadOptions(s3=loader.S3Options(endpoint_url=endpoint_url))
    t0 = time.perf_counter()
    result = loader.load(uri, options=options)
    seconds = time.perf_counter() - t0
    m = result.metrics
    print("RESULT " + json.dumps({"seconds": seconds, "bytes": m.bytes_total, "gbps": m.gbps}))


def weight_stream(p: Platform, up: Uploaded) -> float:
    """weight_stream_s: the loader alone (default options, no tiers) streaming the weights
    from the platform's store, in a fresh process (`--child-stream`)."""
    env = {k: v for k, v in p.env.items() if not k.startswith("PLATFORM_LOADER_")}
    env["AWS_EC2_METADATA_DISABLED"] = "true"
    argv = [str(ENTRY), "--child-stream", up.weights_uri, p.state["s3_endpoint_url"]]
    return float(run_child(argv, env, "weight stream")["seconds"])
