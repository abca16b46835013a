"""The chat template render process (see `chat_template.py`): reads render requests from its
pipe, answers `(True, text)` or `(False, reason)`. It imports only jinja2, limits its own
address space, and stops a render whose output passes `MAX_RENDER_CHARS` as it is produced."""

from __future__ import annotations

import contextlib
import datetime
import json
import resource
from multiprocessing.connection import Connection
from typing import Any

# A chat's prompt is at most ~200,000 characters (`api.schemas.MAX_PROMPT_CHARS`); rendering
# more can only be refused.
MAX_RENDER_CHARS = 1_000_000
# Address space of the child: jinja2 and a render's strings, not gigabytes.
MEMORY_LIMIT_BYTES = 1024 * 1024 * 1024


def serve(conn: Connection) -> None:
    # (a lower hard limit already set holds: ValueError)
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT_BYTES, MEMORY_LIMIT_BYTES))
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    # what transformers gives templates: its own `tojson` (no HTML escaping, as the models
    # were trained), `raise_exception` and `strftime_now`
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = _strftime_now
    compiled: dict[str, Any] = {}
    while True:
        try:
            request = conn.recv()
        except (EOFError, OSError):
            return  # the API process went away
        try:
            conn.send((True, _render(env, compiled, request)))
        except MemoryError:
            compiled.clear()
            conn.send((False, "it used too much memory"))
        except Exception as exc:
            conn.send((False, f"{type(exc).__name__}: {exc}"[:500]))


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(format: str) -> str:
    return datetime.datetime.now().strftime(format)


def _raise(message: str) -> None:
    from jinja2.exceptions import TemplateError

    raise TemplateError(message)


def _render(env: Any, compiled: dict[str, Any], request: dict[str, Any]) -> str:
    source = request.pop("template")
    template = compiled.get(source)
    if template is None:
        if len(compiled) > 64:
            compiled.clear()
        template = compiled[source] = env.from_string(source)
    parts, size = [], 0
    for part in template.generate(**request):
        size += len(part)
        if size > MAX_RENDER_CHARS:
            raise ValueError(f"its output passed {MAX_RENDER_CHARS:,} characters")
        parts.append(part)
    return "".join(parts)
