"""Logs of every platform process: JSON lines, a level per component, ids from the context.

Shared by the API, the Celery worker, the reconciler, the embedded supervisor and the workers
(the loader logs inside its worker), so it lives here, with no dependency beyond the standard
library, pydantic and common/tracing.py (which imports OpenTelemetry only when tracing is on):
the control plane may import it, the worker never imports the control plane. One record is one
line (docs/observability.md "Logs"):

    {"timestamp": "2025-06-01T12:00:00.123Z", "level": "INFO", "component": "worker",
     "logger": "worker.runtime.lifecycle", "message": "job job_… attempt 1 succeeded: …",
     "pid": 4242, "worker_id": "wrk_…", "deployment_id": "dep_…", "job_id": "job_…",
     "attempt": 1, "status": "succeeded"}

Ids come from four places, later ones winning: the process (`set_process_fields`: a worker's
id and deployment), the context (`log_context` around a request, a job or a task; `bind` adds
to it in place, so the code that opened it sees ids found deeper down, e.g. the API's request
line carries the id of the job a route created), the span current in the thread when tracing
is on (its `trace_id` and `span_id`) and the call (`extra={"job_id": …}`). Only
the names in FIELDS are written: an `extra` of another name (Celery passes a task's arguments
as `data`) never reaches a log line.

NOTE: never log prompt or output text (STYLE 15): ids, counts, lengths, timings and reasons.
An exception's text is written, except that a validation error (pydantic, FastAPI) is written
as its fields and messages only: its text quotes the input it refused.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import sys
import threading
import traceback
from collections.abc import Callable, Iterator, Mapping
from contextvars import ContextVar, Token
from datetime import UTC, datetime
from types import TracebackType
from typing import Any, Literal, ParamSpec, TextIO, TypeVar

from pydantic import field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from common import tracing

# The processes that configure logging (`configure(component, ...)`); in PLATFORM_LOG_LEVELS a
# component's name sets that process's level, any other name a logger's in every process.
COMPONENTS = ("api", "celery", "reconciler", "worker", "supervisor")
# Ids a log line may carry, from the process, the context or the call; with tracing on, the
# trace and span of the line (common/tracing.py), so a log search and a trace find each other.
ID_FIELDS = (
    "request_id",
    "job_id",
    "batch_id",
    "worker_id",
    "deployment_id",
    "trace_id",
    "span_id",
)
# Other facts a call may pass in `extra`; nothing else is written (see the module docstring).
EXTRA_FIELDS = (
    "attempt",  # a job's attempt number
    "status",  # a job's or worker's status, after the change logged
    "reason",  # why (a scaling reason, a failure's type, an exit status)
    "kind",  # a job's kind (sync, async, batch)
    "duration_s",  # how long the thing logged took, in seconds
    "method",  # an HTTP request's method
    "route",  # its route template (`/v1/deployments/{name}/runs`), or its path if none matched
    "status_code",  # its response status (0: the client went away before one)
)
FIELDS = ID_FIELDS + EXTRA_FIELDS  # in the order a line shows them
# Third-party loggers kept quieter than the process (unless named in PLATFORM_LOG_LEVELS): httpx
# logs every request's URL at INFO (webhook receivers' URLs may carry tokens); at DEBUG, botocore
# logs request parameters and bodies (a batch's results), urllib3 and s3transfer URLs.
QUIET_LOGGERS = {
    "httpx": logging.WARNING,
    "httpcore": logging.WARNING,
    "botocore": logging.INFO,
    "boto3": logging.INFO,
    "s3transfer": logging.INFO,
    "urllib3": logging.INFO,
}

P = ParamSpec("P")
R = TypeVar("R")
_ids: ContextVar[dict[str, Any] | None] = ContextVar("platform_log_ids", default=None)
_process_fields: dict[str, Any] = {}


# --- ids ---------------------------------------------------------------------------------------


@contextlib.contextmanager
def log_context(**ids: Any) -> Iterator[None]:
    """Every line logged inside carries `ids` (None values are left out), e.g.
    `with log_context(job_id=job_id): ...`. A thread started inside does not inherit them."""
    token = enter_context(**ids)
    try:
        yield
    finally:
        exit_context(token)


def enter_context(**ids: Any) -> Token[dict[str, Any] | None]:
    """`log_context` without a `with` (a Celery task's signals): pass the token to
    `exit_context` in the same thread."""
    return _ids.set({**(_ids.get() or {}), **_present(ids)})


def exit_context(token: Token[dict[str, Any] | None]) -> None:
    _ids.reset(token)


def bind(**ids: Any) -> None:
    """Add `ids` to the current context in place: the code that opened it sees them too (a
    route binding the id of the job it created, for the request's last line). Outside any
    context it does nothing: the ids would stay with the thread, in every later line."""
    current = _ids.get()
    if current is not None:
        current.update(_present(ids))


def bound(fn: Callable[P, R], **ids: Any) -> Callable[P, R]:
    """`fn` run inside `log_context(**ids)`: for a pool's thread, which starts without them,
    e.g. `pool.submit(bound(self._start_job, job_id=job_id), delivery)`."""

    @functools.wraps(fn)
    def run(*args: P.args, **kwargs: P.kwargs) -> R:
        with log_context(**ids):
            return fn(*args, **kwargs)

    return run


def set_process_fields(**ids: Any) -> None:
    """Ids of this whole process, in every line from every thread (a worker's id)."""
    _process_fields.update(_present(ids))


def current_ids() -> dict[str, Any]:
    """The ids a line logged here would carry (the process's and the context's)."""
    return {**_process_fields, **(_ids.get() or {})}


def _present(ids: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in ids.items() if v is not None}


# --- levels ------------------------------------------------------------------------------------


def parse_level(value: str) -> int:
    """`"debug"` → logging.DEBUG; ValueError on a name logging does not know."""
    level = logging.getLevelNamesMapping().get(value.strip().upper())
    if level is None:
        raise ValueError(
            f"unknown log level {value!r}: use DEBUG, INFO, WARNING, ERROR or CRITICAL"
        )
    return level


def parse_levels(spec: str) -> dict[str, int]:
    """`"reconciler=DEBUG, sqlalchemy.engine=INFO"` → {name: level}; ValueError if malformed."""
    out: dict[str, int] = {}
    for item in spec.split(","):
        if not item.strip():
            continue
        name, sep, level = item.partition("=")
        if not sep or not name.strip():
            raise ValueError(f"log level override {item.strip()!r}: expected name=LEVEL")
        out[name.strip()] = parse_level(level)
    return out


def levels_for(component: str, level: str, overrides: str) -> tuple[int, dict[str, int]]:
    """(this process's level, {logger name: level}) for `component`: its own entry in
    `overrides` or else `level`; entries that name no component are loggers' levels."""
    parsed = parse_levels(overrides)
    own = parsed.get(component, parse_level(level))
    loggers = {**QUIET_LOGGERS, **{k: v for k, v in parsed.items() if k not in COMPONENTS}}
    return own, loggers


# --- formatting --------------------------------------------------------------------------------


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line (escapes keep a multi-line text on it)."""

    def __init__(self, component: str) -> None:
        super().__init__()
        self.component = component

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "timestamp": _timestamp(record.created),
            "level": record.levelname,
            "component": self.component,
            "logger": record.name,
            "message": record.getMessage(),
            "pid": record.process,
        }
        out.update(record_fields(record))
        if record.exc_info and record.exc_info[1] is not None:
            out["exc_type"] = type(record.exc_info[1]).__name__
            out["exc"] = format_exception(record.exc_info[1])
        elif record.stack_info:
            out["stack"] = record.stack_info
        return json.dumps(out, default=str)


class TextFormatter(logging.Formatter):
    """For a terminal: `time LEVEL component logger: message [id=… …]`, then any traceback."""

    def __init__(self, component: str) -> None:
        super().__init__()
        self.component = component

    def format(self, record: logging.LogRecord) -> str:
        fields = " ".join(f"{k}={v}" for k, v in record_fields(record).items())
        line = (
            f"{_timestamp(record.created)} {record.levelname} {self.component} {record.name}: "
            f"{record.getMessage()}" + (f" [{fields}]" if fields else "")
        )
        if record.exc_info and record.exc_info[1] is not None:
            line += "\n" + format_exception(record.exc_info[1]).rstrip("\n")
        return line


def record_fields(record: logging.LogRecord) -> dict[str, Any]:
    """The ids and facts of a record: its own `extra`, else the span current when it was
    logged (tracing on), else the context's, else the process's."""
    ids = current_ids()
    if tracing.enabled():
        ids.update(tracing.current_ids())
    fields = {}
    for name in FIELDS:
        value = record.__dict__.get(name, ids.get(name))
        if value is not None:
            fields[name] = value
    return fields


def _timestamp(created: float) -> str:
    return datetime.fromtimestamp(created, UTC).isoformat(timespec="milliseconds")[:-6] + "Z"


def format_exception(exc: BaseException) -> str:
    """The traceback of `exc` and of its causes, oldest first, like
    `traceback.format_exception`, but each validation error is written as its fields and
    messages, never the input it quotes."""
    chain: list[tuple[BaseException, str]] = []  # (exception, what links it to the newer one)
    current: BaseException | None = exc
    link = ""
    while current is not None and all(current is not e for e, _ in chain):
        chain.append((current, link))
        if current.__cause__ is not None:
            current, link = current.__cause__, _CAUSE
        elif current.__context__ is not None and not current.__suppress_context__:
            current, link = current.__context__, _CONTEXT
        else:
            current = None
    parts: list[str] = []
    for e, link in reversed(chain):
        if e.__traceback__ is not None:
            parts.append("Traceback (most recent call last):\n")
            parts += traceback.format_tb(e.__traceback__)
        parts.append(f"{_qualified_name(e)}: {_safe_str(e)}\n")
        if isinstance(e, BaseExceptionGroup):  # anyio's task groups wrap a route's error
            for i, sub in enumerate(e.exceptions, 1):
                text = format_exception(sub).rstrip("\n").replace("\n", "\n  | ")
                parts.append(f"  +-- {i} --\n  | {text}\n")
        parts.append(link)
    return "".join(parts)


_CAUSE = "\nThe above exception was the direct cause of the following exception:\n\n"
_CONTEXT = "\nDuring handling of the above exception, another exception occurred:\n\n"


def _qualified_name(exc: BaseException) -> str:
    t = type(exc)
    return t.__qualname__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"


def _safe_str(exc: BaseException) -> str:
    errors = getattr(exc, "errors", None)
    if callable(errors) and type(exc).__name__.endswith("ValidationError"):
        try:
            items = errors()
            return "; ".join(
                f"{'.'.join(str(p) for p in e.get('loc', ()))}: {e.get('msg', '')}" for e in items
            )
        except Exception:
            return "(validation error; its text is not logged)"
    try:
        return str(exc)
    except Exception:
        return "(unprintable)"


# --- settings and configuration ----------------------------------------------------------------


class LogSettings(BaseSettings):
    """The log settings of every process: its settings object derives from this one (env
    prefix `PLATFORM_`), e.g. `PLATFORM_LOG_LEVELS=reconciler=DEBUG`."""

    model_config = SettingsConfigDict(env_prefix="PLATFORM_", frozen=True, extra="ignore")

    # Level of every process (DEBUG, INFO, WARNING, ERROR, CRITICAL).
    log_level: str = "INFO"
    # Overrides, "name=LEVEL,...": a component's name (api, celery, reconciler, worker,
    # supervisor) sets that process's level; any other name a logger's, in every process.
    log_levels: str = ""
    # "json": one JSON object per line (log pipelines); "text": lines for a terminal.
    log_format: Literal["json", "text"] = "json"

    @field_validator("log_level")
    @classmethod
    def _known_level(cls, v: str) -> str:
        parse_level(v)
        return v.strip().upper()

    @field_validator("log_levels")
    @classmethod
    def _known_levels(cls, v: str) -> str:
        parse_levels(v)
        return v


_HANDLER_MARK = "_platform_log_handler"


def configure(component: str, settings: LogSettings, stream: TextIO | None = None) -> None:
    """Send this process's logs to `stream` (stderr) as `settings` says; call it once, at the
    entry point. Warnings and uncaught exceptions (any thread) become log lines too."""
    level, loggers = levels_for(component, settings.log_level, settings.log_levels)
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(
        JsonFormatter(component) if settings.log_format == "json" else TextFormatter(component)
    )
    setattr(handler, _HANDLER_MARK, True)
    root = logging.getLogger()
    for old in [h for h in root.handlers if getattr(h, _HANDLER_MARK, False)]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    for name, logger_level in loggers.items():
        logging.getLogger(name).setLevel(logger_level)
    logging.captureWarnings(True)
    log = logging.getLogger(component)

    def excepthook(t: type[BaseException], v: BaseException, tb: TracebackType | None) -> None:
        if issubclass(t, KeyboardInterrupt):  # a stop while starting (SIGINT), not a crash
            log.warning("interrupted", exc_info=(t, v, tb))
        else:
            log.critical("uncaught %s", t.__name__, exc_info=(t, v, tb))

    def thread_excepthook(args: threading.ExceptHookArgs) -> None:
        if args.exc_value is None or args.exc_type is SystemExit:
            return
        name = args.thread.name if args.thread is not None else "?"
        log.critical(
            "uncaught %s in thread %s",
            args.exc_type.__name__,
            name,
            exc_info=(args.exc_type, args.exc_value, args.exc_traceback),
        )

    sys.excepthook = excepthook
    threading.excepthook = thread_excepthook
