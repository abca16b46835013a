"""`platform run`: parsing `--input key=value`, the text, `--json` and `--stream` output, the
cold-start lines on stderr, `--detach`, and the exit code of a job that failed."""

from __future__ import annotations

import json

import httpx
import pytest

from sdk.cli.run import parse_inputs
from tests.unit.cli.mock_api import Routes, invoke, job, ok


def test_parse_inputs_reads_json_values_and_keeps_prompts_as_text() -> None:
    parsed = parse_inputs(
        ["prompt=42", "max_tokens=16", "temperature=0.5", 'stop=["\\n"]', "seed=null", "x=a=b"]
    )
    assert parsed == {
        "prompt": "42",
        "max_tokens": 16,
        "temperature": 0.5,
        "stop": ["\n"],
        "seed": None,
        "x": "a=b",
    }
    assert parse_inputs(["note=not json {"]) == {"note": "not json {"}
    for bad in (["prompt"], ["=x"], ["a=1", "a=2"]):
        with pytest.raises(ValueError):
            parse_inputs(bad)


def test_run_sends_the_parsed_input_and_prints_the_text() -> None:
    job = {"id": "job_1", "status": "succeeded", "output": {"text": "Hello!"}}
    routes = Routes({"POST /v1/deployments/demo/run": httpx.Response(200, json=job)})
    result = invoke(["run", "demo", "--input", "prompt=Hi there", "-i", "max_tokens=8"], routes)
    assert result.exit_code == 0, result.output
    assert result.stdout == "Hello!\n"
    body = routes.body("POST /v1/deployments/demo/run")
    assert body["input"] == {"prompt": "Hi there", "max_tokens": 8}
    assert body["stream"] is False


def test_run_json_prints_the_job() -> None:
    job = {"id": "job_1", "status": "succeeded", "output": {"text": "Hello!"}}
    routes = Routes({"POST /v1/deployments/demo/run": httpx.Response(200, json=job)})
    result = invoke(["run", "demo", "-i", "prompt=Hi", "--json"], routes)
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == job


def test_run_stream_prints_deltas() -> None:
    final = {"id": "job_1", "status": "succeeded", "output": {"text": "Hello!"}}
    events = (
        'event: output\ndata: {"delta": "Hel"}\n\n'
        'event: output\ndata: {"delta": "lo!"}\n\n'
        f"event: completed\ndata: {json.dumps(final)}\n\n"
    )
    answer = httpx.Response(200, text=events, headers={"content-type": "text/event-stream"})
    routes = Routes({"POST /v1/deployments/demo/run": answer})
    result = invoke(["run", "demo", "-i", "prompt=Hi", "--stream"], routes)
    assert result.exit_code == 0, result.output
    assert result.stdout == "Hello!\n"
    assert routes.body("POST /v1/deployments/demo/run")["stream"] is True


def test_run_stream_says_when_the_job_restarted_and_prints_its_output() -> None:
    """Printed text cannot be taken back: a job run again whose text departs from it gets a
    notice on stderr and its whole output after it; the exit code is the job's (succeeded)."""
    final = {"id": "job_1", "status": "succeeded", "attempt": 2, "output": {"text": "Bye."}}
    events = (
        'event: output\ndata: {"delta": "Hel"}\n\n'
        'event: restarted\ndata: {"job_id": "job_1", "attempt": 2, "reason": "new_attempt"}\n\n'
        'event: output\ndata: {"delta": "Bye."}\n\n'
        f"event: completed\ndata: {json.dumps(final)}\n\n"
    )
    answer = httpx.Response(200, text=events, headers={"content-type": "text/event-stream"})
    routes = Routes({"POST /v1/deployments/demo/run": answer})
    result = invoke(["run", "demo", "-i", "prompt=Hi", "--stream"], routes)
    assert result.exit_code == 0, result.output
    assert result.stdout == "Hel\nBye.\n"
    assert "job job_1 was run again" in result.stderr


def test_run_input_mistakes_exit_1() -> None:
    assert invoke(["run", "demo"], Routes({})).exit_code == 1
    result = invoke(["run", "demo", "--input", "prompt"], Routes({}))
    assert result.exit_code == 1
    assert "expected key=value" in result.stderr
    assert invoke(["run", "demo", "-i", "prompt=x", "--stream", "--json"]).exit_code == 1


def test_a_model_error_exits_1_and_a_platform_failure_exits_2() -> None:
    failed = {"id": "job_1", "status": "failed", "error": {"type": "model_error", "message": "x"}}
    routes = Routes({"POST /v1/deployments/demo/run": httpx.Response(200, json=failed)})
    result = invoke(["run", "demo", "-i", "prompt=Hi"], routes)
    assert result.exit_code == 1
    assert "job: job_1" in result.stderr

    lost = {**failed, "error": {"type": "worker_lost", "message": "no heartbeat"}}
    routes = Routes({"POST /v1/deployments/demo/run": httpx.Response(200, json=lost)})
    assert invoke(["run", "demo", "-i", "prompt=Hi"], routes).exit_code == 2


def test_run_stream_shows_the_cold_start_then_prints_the_text() -> None:
    final = {"id": "job_1", "status": "succeeded", "output": {"text": "Hello!"}}
    starting = [
        {"reason": "no_capacity", "phase": "booting", "eta_s": 9.0},
        {"reason": "loading_weights", "phase": "loading_weights", "eta_s": 4.0}
        | {"bytes_done": 300_000_000, "bytes_total": 1_200_000_000},
        {"reason": "loading_weights", "phase": "loading_weights", "eta_s": 2.0}
        | {"bytes_done": 900_000_000, "bytes_total": 1_200_000_000},
        {"reason": "warming", "phase": "warming", "eta_s": None},
    ]
    events = "".join(f"event: starting\ndata: {json.dumps(s)}\n\n" for s in starting) + (
        'event: running\ndata: {"attempt": 1}\n\n'
        'event: output\ndata: {"delta": "Hello!"}\n\n'
        f"event: completed\ndata: {json.dumps(final)}\n\n"
    )
    answer = httpx.Response(200, text=events, headers={"content-type": "text/event-stream"})
    result = invoke(
        ["run", "demo", "-i", "prompt=Hi", "--stream"],
        Routes({"POST /v1/deployments/demo/run": answer}),
    )
    assert result.exit_code == 0, result.output
    assert result.stdout == "Hello!\n"
    # not a terminal: one line per phase on stderr (a log gets each step once)
    assert result.stderr.splitlines() == [
        "Cold start: booting a worker",
        "Cold start: loading weights (1.20 GB)",
        "Cold start: warming up",
    ]


def test_the_cold_start_bar_says_what_is_left() -> None:
    from sdk import RunStatus
    from sdk.cli.run import describe

    loading = RunStatus(
        "starting", "loading_weights", "loading_weights", 2.4, 6 * 10**8, 12 * 10**8
    )
    assert describe(loading)[0] == "Cold start: loading weights 0.60/1.20 GB, ready in ~2 s"
    booting = RunStatus("starting", "no_capacity", "booting", 0.2)
    assert describe(booting)[0] == "Cold start: booting a worker, ready in ~1 s"
    assert describe(RunStatus("starting", "warming", "warming"))[0] == "Cold start: warming up"
    assigned = RunStatus("starting", "assigning_warm_worker", "assigning_warm_worker", 0.8)
    assert describe(assigned)[0] == "Cold start: taking a warm worker, ready in ~1 s"


def test_run_detach_queues_a_job_and_prints_its_id() -> None:
    routes = Routes({"POST /v1/deployments/demo/jobs": ok(job("queued"), 202)})
    result = invoke(["run", "demo", "-i", "prompt=Hi", "--detach"], routes)
    assert result.exit_code == 0 and result.stdout == "job_1\n"
    assert routes.body("POST /v1/deployments/demo/jobs") == {"input": {"prompt": "Hi"}}
    assert invoke(["run", "demo", "-i", "prompt=Hi", "--detach", "--stream"], routes).exit_code == 1
