"""A batch's input lines, parsed and validated with memory bounded by the line limit.

Lines are read one at a time and counted as they come: past `max_lines` the batch is refused
at once, without reading (or decoding, or parsing) the rest. A million-line input costs what
its text costs, not a million parsed objects. Every line is validated before anything is
written: one bad line is a 422 naming its line number and field.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from typing import Any

from pydantic import ValidationError

from control_plane.api.schemas import JobInput
from control_plane.errors import InvalidRequest

# At most this many line errors are reported in one answer.
MAX_LINE_ERRORS = 20


def text_lines(text: str) -> Iterator[str]:
    """The lines of JSONL text (split at LF, a CR before it dropped), one at a time. Only LF
    ends a line: JSON may hold U+2028 and other separators `str.splitlines` would cut at."""
    start = 0
    while start < len(text):
        end = text.find("\n", start)
        end = len(text) if end < 0 else end
        yield text[start : end - 1 if end > start and text[end - 1] == "\r" else end]
        start = end + 1


def byte_lines(data: bytes) -> Iterator[bytes]:
    """`text_lines` of undecoded bytes: each line is decoded only when it is reached."""
    start = 0
    while start < len(data):
        end = data.find(b"\n", start)
        end = len(data) if end < 0 else end
        yield data[start : end - 1 if end > start and data[end - 1 : end] == b"\r" else end]
        start = end + 1


def too_many(source: str, max_lines: int) -> InvalidRequest:
    return InvalidRequest(
        f"more than {max_lines} input lines; the limit is {max_lines}",
        errors=[{"field": source, "message": f"at most {max_lines} lines"}],
        limit=max_lines,
    )


def parse(lines: Iterable[Any], source: str, max_lines: int, raw: bool) -> list[JobInput]:
    """The JobInputs of `lines`, in order. `raw`: each is JSONL text (str or UTF-8 bytes;
    blank ones skipped); else each is a parsed value (the `inputs` list). InvalidRequest when
    there is none, more than `max_lines` (raised on reaching line `max_lines + 1`), or any
    invalid line (each named, up to MAX_LINE_ERRORS)."""
    parsed: list[JobInput] = []
    errors: list[dict[str, Any]] = []
    count = 0
    for n, line in enumerate(lines, start=1):
        if raw and not line.strip():
            continue  # blank lines (a trailing newline) are no input
        count += 1
        if count > max_lines:
            raise too_many(source, max_lines)
        value, problem = _decode(line) if raw else (line, None)
        if problem is not None:
            errors.append({"line": n, "field": source, "message": problem})
            continue
        try:
            parsed.append(JobInput.model_validate(value))
        except ValidationError as exc:
            for e in exc.errors():
                loc = ".".join(str(p) for p in e.get("loc", ())) or source
                errors.append({"line": n, "field": loc, "message": e.get("msg", "invalid")})
    if count == 0:
        raise InvalidRequest(
            "a batch needs at least one input line",
            errors=[{"field": source, "message": "no input lines"}],
        )
    if errors:
        shown = errors[:MAX_LINE_ERRORS]
        first = shown[0]
        raise InvalidRequest(
            f"{len(errors)} invalid input field(s); first: line {first['line']}: "
            f"{first['field']}: {first['message']}",
            errors=shown,
        )
    return parsed


def _decode(line: str | bytes) -> tuple[Any, str | None]:
    """(the line's JSON value, None) or (None, why it is not JSON)."""
    if isinstance(line, bytes):
        try:
            line = line.decode()
        except UnicodeDecodeError as exc:
            return None, f"not UTF-8 text (byte {exc.start} of the line)"
    try:
        return json.loads(line), None
    except json.JSONDecodeError as exc:
        return None, f"not valid JSON: {exc.msg} at column {exc.colno}"
    except RecursionError:
        # No job input nests deeply: a line the parser cannot even hold is refused as such.
        return None, "JSON nested too deeply"
