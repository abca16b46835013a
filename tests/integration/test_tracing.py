"""One job's trace, end to end: the API (served on loopback by uvicorn, in this process) admits
it; the worker runtime (its real queue consumer, control client, engine loop and the demo model
through the real loader and engine, in this process) claims, runs and reports it; every span
lands in one in-memory exporter. The spans share one trace id and chain API → worker → engine,
carry their attributes, and no prompt or output text. With tracing off, nothing is recorded.
"""

from __future__ import annotations

import io
import threading
from typing import Any

import httpx
import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from sqlalchemy import select

from common import tracing
from common.messages import Assignment
from common.protocol import deployment_queue
from control_plane.api.app import create_app
from control_plane.api.trace_requests import TraceRequests
from control_plane.db.models import Job
from control_plane.db.session import make_engine, make_sessionmaker
from control_plane.settings import Settings
from tests.helpers import wait_for
from tests.integration.api_helpers import SPEC, WORKER, WORKER_TOKEN, h, served
from tests.integration.conftest import SteppedClock, lines_of
from worker.engine.config import EngineConfig
from worker.engine.llm_engine import LLMEngine
from worker.runtime.consumer import consume
from worker.runtime.engine_loop import EngineLoop
from worker.runtime.lifecycle import WorkerRuntime
from worker.settings import WorkerSettings

PROMPT = "Zanzibar quokka marmalade, secret prompt 7781"
CALLER_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN = "00f067aa0ba902b7"


@pytest.fixture(scope="module")
def demo_engine(tmp_path_factory: pytest.TempPathFactory) -> LLMEngine:
    from worker.model.demo import create_demo_model
    from worker.runtime.loading import load_model

    demo_dir = create_demo_model(tmp_path_factory.mktemp("demo"), seed=0, train_steps=0)
    loaded = load_model(str(demo_dir), device="cpu")
    config = EngineConfig(block_size=16, max_num_seqs=4, kv_cache_bytes=4 << 20)
    return LLMEngine.from_model(loaded.model, loaded.tokenizer, (), config)


def run_worker_until(
    address: str, settings: Settings, engine: LLMEngine, dep_id: str, done: threading.Event
) -> WorkerRuntime:
    """The worker runtime's serving part on the deployment's queue, until `done` is set."""
    worker_settings = WorkerSettings(
        redis_url=settings.redis_url, internal_url=f"http://{address}", worker_token=WORKER_TOKEN
    )
    queue = deployment_queue(dep_id)
    rt = WorkerRuntime(worker_settings, "wrk_trace", "cpu", Assignment(dep_id, 1, "x", queue, 2))
    rt.engine = engine
    rt.loop = EngineLoop(engine, rt.redis, 0.05, rt.jobs.on_finished)
    rt.jobs.attach(engine, rt.loop)
    rt.loop.start()
    consume(settings.redis_url, queue, 2, rt.jobs.handle, done.is_set)
    rt.loop.stop(timeout_s=10)
    return rt


def strings_in(span: ReadableSpan) -> list[str]:
    """Every string a span records: its name, attribute values, events' names and values."""
    out = [span.name]
    for attrs in [span.attributes or {}, *[e.attributes or {} for e in span.events]]:
        for v in attrs.values():
            out.extend(str(x) for x in (v if isinstance(v, tuple) else (v,)))
    out.extend(e.name for e in span.events)
    return out


def test_one_jobs_trace_is_connected_from_the_api_through_the_worker_to_the_engine(
    settings: Settings,
    keys: dict[str, str],
    redis_client: Any,
    clock: SteppedClock,
    spans: InMemorySpanExporter,
    demo_engine: LLMEngine,
    log_lines: io.StringIO,
) -> None:
    app = create_app(settings, clock=clock)
    assert any(getattr(m, "cls", None) is TraceRequests for m in app.user_middleware)
    with served(app) as address, httpx.Client(base_url=f"http://{address}") as http:
        r = http.post("/v1/deployments", json=SPEC, headers=h(keys["a"]))
        assert r.status_code == 201, r.text
        dep_id = r.json()["id"]
        caller = {"traceparent": f"00-{CALLER_TRACE}-{CALLER_SPAN}-01", **h(keys["a"])}
        body = {"input": {"prompt": PROMPT, "max_tokens": 4}}
        r = http.post("/v1/deployments/demo/jobs", json=body, headers=caller)
        assert r.status_code == 202, r.text
        job_id = r.json()["id"]
        done = threading.Event()
        worker = threading.Thread(
            target=run_worker_until, args=(address, settings, demo_engine, dep_id, done)
        )
        worker.start()
        try:
            job = wait_for(
                lambda: (
                    j
                    if (j := http.get(f"/v1/jobs/{job_id}", headers=h(keys["a"])).json())["status"]
                    not in ("queued", "starting", "running")
                    else None
                ),
                timeout_s=60,
                what="the job's end",
            )
            wait_for(
                lambda: any(s.name == "job.run" for s in spans.get_finished_spans()),
                timeout_s=60,
                what="the job.run span",
            )
        finally:
            done.set()
            worker.join(30)
        assert job["status"] == "succeeded", job
        # a malformed traceparent is ignored: the request is served, in a trace of its own
        bad = {"traceparent": "00-not-a-trace-id-01", **h(keys["a"])}
        r = http.post("/v1/deployments/demo/jobs", json=body, headers=bad)
        assert r.status_code == 202, r.text
        other_job = r.json()["id"]
        # a batch's jobs store the batch request's span
        lines = {"deployment": "demo", "inputs": [{"prompt": PROMPT}] * 2, "max_in_flight": 1}
        r = http.post("/v1/batches", json=lines, headers=h(keys["a"]))
        assert r.status_code == 201, r.text
        batch_id = r.json()["id"]

    finished = spans.get_finished_spans()
    mine = [s for s in finished if s.context.trace_id == int(CALLER_TRACE, 16)]
    by_name = {s.name: s for s in mine}

    def parent_of(name: str) -> str:
        parent = by_name[name].parent
        assert parent is not None, name
        return next(s.name for s in mine if s.context.span_id == parent.span_id)

    request = by_name["POST /v1/deployments/{name}/jobs"]
    engine_span = by_name["text_completion demo"]
    report = by_name["POST /internal/jobs/{job_id}/complete"]
    # every span of this job shares the caller's trace, and nothing else is in it
    assert set(by_name) == {
        request.name,
        "job.admit",
        "job.queue",
        "job.run",
        "job.claim",
        engine_span.name,
        "prefill",
        "decode",
        "job.complete",
        report.name,
    }
    assert len(mine) == len(by_name)
    # the chain: the caller → API → admission → queue | worker → engine, report → API
    assert request.parent is not None and request.parent.span_id == int(CALLER_SPAN, 16)
    assert request.parent.is_remote and request.kind is SpanKind.SERVER
    assert parent_of("job.admit") == request.name
    assert parent_of("job.queue") == "job.admit"
    assert parent_of("job.run") == "job.admit"
    for child in ("job.claim", engine_span.name, "job.complete"):
        assert parent_of(child) == "job.run"
    assert parent_of("prefill") == parent_of("decode") == engine_span.name
    assert parent_of(report.name) == "job.complete"
    assert by_name["job.run"].kind is SpanKind.CONSUMER
    assert report.kind is SpanKind.SERVER and by_name["job.complete"].kind is SpanKind.CLIENT
    # the job stored the admission's traceparent (one INSERT), the claim handed it on
    engine = make_engine(settings.database_url)
    with make_sessionmaker(engine)() as session:
        stored = session.scalar(select(Job.traceparent).where(Job.id == job_id))
    engine.dispose()
    admit = by_name["job.admit"]
    assert stored == f"00-{CALLER_TRACE}-{admit.context.span_id:016x}-01"
    # the times nest: queue from admission to claim, the engine inside the run
    queue, run = by_name["job.queue"], by_name["job.run"]
    assert admit.start_time <= queue.start_time < queue.end_time  # type: ignore[operator]
    assert run.start_time <= engine_span.start_time  # type: ignore[operator]
    assert engine_span.end_time <= run.end_time  # type: ignore[operator]
    # attributes: GenAI conventions and the platform's ids
    a = dict(admit.attributes or {})
    assert a["gen_ai.operation.name"] == "text_completion"
    assert a["gen_ai.request.model"] == "demo"
    assert a["gen_ai.request.max_tokens"] == 4
    assert a["platform.job.id"] == job_id and a["platform.deployment.id"] == dep_id
    assert a["platform.job.kind"] == "async"
    assert [e.name for e in admit.events] == ["stored", "woken"]
    e = dict(engine_span.attributes or {})
    assert e["gen_ai.operation.name"] == "text_completion"
    assert e["gen_ai.request.model"] == "demo"
    assert e["gen_ai.request.max_tokens"] == 4
    assert e["gen_ai.usage.input_tokens"] == job["usage"]["prompt_tokens"] > 0
    assert e["gen_ai.usage.output_tokens"] == job["usage"]["generated_tokens"] == 4
    assert e["gen_ai.response.finish_reasons"] == ("length",)
    assert [ev.name for ev in engine_span.events] == ["first_token"]
    w = dict(run.attributes or {})
    assert w["platform.job.id"] == job_id and w["platform.worker.id"] == "wrk_trace"
    assert w["platform.deployment.id"] == dep_id and w["platform.job.status"] == "succeeded"
    assert w["platform.job.attempt"] == 1
    # the job's log lines name its trace: the API's under the request's span, the worker's
    # under `job.run` (the worker's report, written on another thread than the claim)
    job_lines = [line for line in lines_of(log_lines) if line.get("job_id") == job_id]
    api_line = next(line for line in job_lines if line.get("route") == request.name[5:])
    assert (api_line["trace_id"], api_line["span_id"]) == (
        CALLER_TRACE,
        f"{request.context.span_id:016x}",
    )
    reported = next(line for line in job_lines if line["logger"] == "worker.runtime.jobs")
    assert reported["status"] == "succeeded"
    assert (reported["trace_id"], reported["span_id"]) == (
        CALLER_TRACE,
        f"{run.context.span_id:016x}",
    )
    assert PROMPT not in log_lines.getvalue()
    r_attrs = dict(report.attributes or {})
    assert r_attrs["http.response.status_code"] == 200 and r_attrs["platform.job.id"] == job_id
    assert str(dict(request.attributes or {})["platform.request.id"]).startswith("req_")
    # never the prompt or the output, in any span of the test
    output_text = job["output"]["text"]
    for s in finished:
        for text in strings_in(s):
            assert PROMPT not in text and "quokka" not in text, s.name
            if len(output_text.strip()) >= 3:
                assert output_text not in text, s.name
    # the malformed header's request: a new trace, rooted at the API
    roots = [
        s
        for s in finished
        if s.name == "POST /v1/deployments/{name}/jobs"
        and s.context.trace_id != int(CALLER_TRACE, 16)
    ]
    assert len(roots) == 1 and roots[0].parent is None
    other_admit = [
        s
        for s in finished
        if s.name == "job.admit" and dict(s.attributes or {})["platform.job.id"] == other_job
    ]
    assert other_admit and other_admit[0].context.trace_id == roots[0].context.trace_id
    (batch_request,) = [s for s in finished if s.name == "POST /v1/batches"]
    engine = make_engine(settings.database_url)
    with make_sessionmaker(engine)() as session:
        batch_traces = session.scalars(select(Job.traceparent).where(Job.batch_id == batch_id))
        c = batch_request.context
        expected = f"00-{c.trace_id:032x}-{c.span_id:016x}-{int(c.trace_flags):02x}"
        assert set(batch_traces) == {expected}
    engine.dispose()


def test_with_tracing_off_nothing_is_recorded_or_stored(
    settings: Settings, keys: dict[str, str], redis_client: Any, clock: SteppedClock
) -> None:
    assert not tracing.enabled()
    app = create_app(settings, clock=clock)
    assert not any(getattr(m, "cls", None) is TraceRequests for m in app.user_middleware)
    from fastapi.testclient import TestClient

    with TestClient(app) as client:
        r = client.post("/v1/deployments", json=SPEC, headers=h(keys["a"]))
        assert r.status_code == 201, r.text
        headers = {"traceparent": f"00-{CALLER_TRACE}-{CALLER_SPAN}-01", **h(keys["a"])}
        r = client.post(
            "/v1/deployments/demo/jobs", json={"input": {"prompt": PROMPT}}, headers=headers
        )
        assert r.status_code == 202, r.text
        job_id = r.json()["id"]
        r = client.post(
            f"/internal/jobs/{job_id}/claim", json={"worker_id": "wrk_x"}, headers=WORKER
        )
        assert r.status_code == 200 and r.json()["traceparent"] is None
    engine = make_engine(settings.database_url)
    with make_sessionmaker(engine)() as session:
        assert session.scalar(select(Job.traceparent).where(Job.id == job_id)) is None
    engine.dispose()
