"""Structured logs (common/logs.py): the JSON line, the ids it carries from the process, the
context and the call, the level settings, and the API's request ids (api/request_log.py)."""

from __future__ import annotations

import io
import json
import logging
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from common import logs
from control_plane.api.request_log import RequestLog, request_id
from control_plane.providers.local import worker_env
from control_plane.settings import Settings
from worker.settings import WorkerSettings

SECRET = "tangerine-zeppelin-4417"


class _Shape(BaseModel):
    max_tokens: int


def _record(msg: str = "hello %s", args: tuple[Any, ...] = ("world",), **extra: Any) -> Any:
    record = logging.LogRecord("a.b", logging.INFO, __file__, 1, msg, args, None)
    record.__dict__.update(extra)
    return record


def _line(record: logging.LogRecord, component: str = "api") -> dict[str, Any]:
    text = logs.JsonFormatter(component).format(record)
    assert "\n" not in text
    out: dict[str, Any] = json.loads(text)
    return out


@pytest.fixture
def clean_logging() -> Iterator[None]:
    """Put back what `configure` changes: root handlers and level, loggers' levels, hooks."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    names = [*logs.QUIET_LOGGERS, "sqlalchemy.engine", "loader"]
    levels = {n: logging.getLogger(n).level for n in names}
    hooks = sys.excepthook, threading.excepthook
    fields = dict(logs._process_fields)
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    for n, lv in levels.items():
        logging.getLogger(n).setLevel(lv)
    sys.excepthook, threading.excepthook = hooks
    logging.captureWarnings(False)
    logs._process_fields.clear()
    logs._process_fields.update(fields)


def test_a_line_has_the_fields_and_the_ids_of_process_context_and_call(
    clean_logging: None,
) -> None:
    logs.set_process_fields(worker_id="wrk_1", deployment_id="dep_1")
    with logs.log_context(request_id="req_1", job_id="job_ctx"):
        line = _line(_record(job_id="job_call", duration_s=0.25), component="worker")
    assert line["message"] == "hello world"
    assert line["level"] == "INFO" and line["logger"] == "a.b" and line["component"] == "worker"
    assert line["timestamp"].endswith("Z") and "T" in line["timestamp"]
    assert isinstance(line["pid"], int)
    assert line["worker_id"] == "wrk_1" and line["deployment_id"] == "dep_1"
    assert line["request_id"] == "req_1"
    assert line["job_id"] == "job_call", "the call's own id wins over the context's"
    assert line["duration_s"] == 0.25
    # outside the context: only the process's ids
    assert "request_id" not in _line(_record())


def test_only_known_fields_are_written() -> None:
    # Celery passes a task's arguments as `extra={"data": ...}`
    line = _line(_record(data={"kwargs": {"prompt": SECRET}}, password=SECRET))
    assert SECRET not in json.dumps(line)
    assert "data" not in line and "password" not in line


def test_a_multi_line_message_stays_on_one_line() -> None:
    assert _line(_record("two\nlines", ()))["message"] == "two\nlines"


def test_a_validation_error_is_logged_without_the_input_it_quotes() -> None:
    try:
        try:
            _Shape(max_tokens=SECRET)  # type: ignore[arg-type]
        except ValidationError as e:
            raise RuntimeError("could not start the job") from e
    except RuntimeError:
        record = _record()
        record.exc_info = sys.exc_info()
    line = _line(record)
    assert SECRET not in json.dumps(line)
    assert line["exc_type"] == "RuntimeError"
    assert "max_tokens: Input should be a valid integer" in line["exc"]
    assert "direct cause" in line["exc"] and line["exc"].index("ValidationError") < line[
        "exc"
    ].index("RuntimeError: could not start the job")
    text = logs.TextFormatter("api").format(record)
    assert SECRET not in text and "Traceback" in text


def test_other_exceptions_keep_their_text_and_context() -> None:
    try:
        try:
            raise KeyError("first")
        except KeyError:
            raise ValueError("second") from None
    except ValueError:
        record = _record()
        record.exc_info = sys.exc_info()
    exc = _line(record)["exc"]
    assert "ValueError: second" in exc and "first" not in exc  # `from None` hides the context


def test_a_group_shows_what_it_holds_without_input() -> None:
    try:
        _Shape(max_tokens=SECRET)  # type: ignore[arg-type]
    except ValidationError as e:
        inner: Exception = e
    record = _record()
    record.exc_info = (ExceptionGroup, ExceptionGroup("task group", [KeyError("k"), inner]), None)
    exc = _line(record)["exc"]
    assert "ExceptionGroup: task group" in exc and "KeyError: 'k'" in exc
    assert "max_tokens: Input should be a valid integer" in exc and SECRET not in exc


def test_text_format_for_a_terminal() -> None:
    with logs.log_context(job_id="job_1"):
        text = logs.TextFormatter("reconciler").format(_record(reason="scale_up"))
    assert " INFO reconciler a.b: hello world [" in text
    assert "job_id=job_1" in text and "reason=scale_up" in text


def test_bind_reaches_the_code_that_opened_the_context_through_threads() -> None:
    with logs.log_context(request_id="req_1"), ThreadPoolExecutor(1) as pool:
        import contextvars

        ctx = contextvars.copy_context()  # what asyncio.to_thread and anyio do
        pool.submit(ctx.run, logs.bind, job_id="job_1").result()
        assert logs.current_ids()["job_id"] == "job_1"
    assert "job_id" not in logs.current_ids()
    logs.bind(job_id="job_2")  # outside any context: nothing, rather than stick to the thread
    assert "job_id" not in logs.current_ids()


def test_bound_runs_a_function_with_ids_on_a_pool_thread() -> None:
    with ThreadPoolExecutor(1) as pool:
        seen = pool.submit(logs.bound(logs.current_ids, job_id="job_9")).result()
        after = pool.submit(logs.current_ids).result()
    assert seen.get("job_id") == "job_9" and "job_id" not in after


# --- levels --------------------------------------------------------------------------------------


def test_levels_parse_with_component_and_logger_overrides() -> None:
    assert logs.parse_level("debug") == logging.DEBUG
    assert logs.parse_levels(" reconciler=DEBUG , sqlalchemy.engine=info,") == {
        "reconciler": logging.DEBUG,
        "sqlalchemy.engine": logging.INFO,
    }
    spec = "reconciler=DEBUG,api=ERROR,loader=DEBUG,httpx=INFO"
    own, loggers = logs.levels_for("reconciler", "WARNING", spec)
    assert own == logging.DEBUG
    assert loggers == {
        **logs.QUIET_LOGGERS,
        "httpx": logging.INFO,  # named: as asked
        "loader": logging.DEBUG,
    }
    assert loggers["botocore"] == logging.INFO  # not named: kept from logging request bodies
    own, _ = logs.levels_for("worker", "WARNING", spec)
    assert own == logging.WARNING, "no entry for the worker: the global level"


@pytest.mark.parametrize("bad", ["LOUD", "api", "api=LOUD", "=DEBUG"])
def test_bad_levels_are_refused(bad: str) -> None:
    with pytest.raises(ValueError):
        logs.parse_levels(bad)


@pytest.mark.parametrize("settings_class", [Settings, WorkerSettings])
def test_both_settings_read_the_log_variables_and_fail_fast(
    settings_class: type[logs.LogSettings], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PLATFORM_LOG_LEVEL", "warning")
    monkeypatch.setenv("PLATFORM_LOG_LEVELS", "worker=DEBUG")
    monkeypatch.setenv("PLATFORM_LOG_FORMAT", "text")
    s = settings_class()
    assert (s.log_level, s.log_levels, s.log_format) == ("WARNING", "worker=DEBUG", "text")
    for name, value in [("LEVEL", "LOUD"), ("LEVELS", "api:DEBUG"), ("FORMAT", "xml")]:
        with monkeypatch.context() as m:
            m.setenv(f"PLATFORM_LOG_{name}", value)
            with pytest.raises(ValidationError, match=f"log_{name.lower()}"):
                settings_class()


def test_the_log_settings_reach_local_workers() -> None:
    base = {"PLATFORM_LOG_LEVEL": "DEBUG", "PLATFORM_LOG_FORMAT": "text", "PLATFORM_X": "no"}
    env = worker_env(base, {})
    assert env["PLATFORM_LOG_LEVEL"] == "DEBUG" and env["PLATFORM_LOG_FORMAT"] == "text"
    assert "PLATFORM_X" not in env


def test_configure_sets_levels_and_one_handler(clean_logging: None) -> None:
    settings = WorkerSettings(log_level="WARNING", log_levels="worker=INFO,loader=DEBUG")
    first, out = io.StringIO(), io.StringIO()
    logs.configure("worker", settings, first)
    logs.configure("worker", settings, out)  # again: replaces its handler, adds none
    root = logging.getLogger()
    assert root.level == logging.INFO and logging.getLogger("loader").level == logging.DEBUG
    assert logging.getLogger("httpx").level == logging.WARNING
    logging.getLogger("worker.x").info("ready in %.1fs", 1.5, extra={"duration_s": 1.5})
    logging.getLogger("worker.x").debug("not shown")
    assert first.getvalue() == ""
    (line,) = [json.loads(x) for x in out.getvalue().splitlines()]
    assert line["message"] == "ready in 1.5s" and line["component"] == "worker"
    # an uncaught exception in a thread becomes a line too
    t = threading.Thread(target=lambda: 1 / 0, name="boom")
    t.start()
    t.join()
    last = json.loads(out.getvalue().splitlines()[-1])
    assert last["level"] == "CRITICAL" and last["exc_type"] == "ZeroDivisionError"


# --- the API's request ids -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("sent", "kept"),
    [
        (b"abc-123", True),
        (b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", True),
        (b"x" * 65, False),
        (b"has space", False),
        (b'quote"inside', False),
        (b"", False),
        (b"-leading", False),
    ],
)
def test_a_callers_request_id_is_kept_only_when_short_and_plain(sent: bytes, kept: bool) -> None:
    rid = request_id([(b"x-request-id", sent)])
    assert (rid == sent.decode()) is kept
    if not kept:
        assert rid.startswith("req_")


def test_every_response_has_a_request_id_and_the_request_one_line(
    clean_logging: None,
) -> None:
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route
    from starlette.testclient import TestClient

    def create(request: Request) -> JSONResponse:
        logs.bind(job_id="job_7")
        logging.getLogger("route").info("creating")
        return JSONResponse({"ok": True}, status_code=201)

    app = Starlette(routes=[Route("/v1/things/{name}", create, methods=["POST"])])
    out = io.StringIO()
    logs.configure("api", Settings(), out)
    with TestClient(RequestLog(app)) as client:
        r1 = client.post(f"/v1/things/{SECRET}", headers={"x-request-id": "abc-1"})
        r2 = client.post("/nowhere", headers={"x-request-id": "bad id"})
    assert r1.status_code == 201 and r1.headers["x-request-id"] == "abc-1"
    assert r2.status_code == 404 and r2.headers["x-request-id"].startswith("req_")
    lines = [json.loads(x) for x in out.getvalue().splitlines()]
    inner, first, second = (
        x for x in lines if x["logger"] in ("route", "control_plane.api.request_log")
    )
    assert inner["request_id"] == "abc-1" and inner["job_id"] == "job_7"
    assert first["request_id"] == "abc-1" and first["job_id"] == "job_7", "bound in the route"
    assert first["route"] == "/v1/things/{name}" and SECRET not in json.dumps(first)
    assert (first["method"], first["status_code"]) == ("POST", 201)
    assert first["duration_s"] >= 0
    assert second["request_id"] == r2.headers["x-request-id"] and second["status_code"] == 404
