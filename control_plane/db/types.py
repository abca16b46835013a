"""Column types that behave the same on SQLite and PostgreSQL: aware UTC times, exact money,
JSON that every reader can answer with."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from sqlalchemy import DateTime, Dialect, Numeric, String, TypeDecorator


class UTCDateTime(TypeDecorator[datetime]):
    """Timezone-aware UTC datetimes on every backend (SQLite drops the zone otherwise)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime written to the database")
        return value.astimezone(UTC)

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


class DecimalText(TypeDecorator[Decimal]):
    """Exact decimals: NUMERIC on PostgreSQL, text on SQLite (whose NUMERIC is a float)."""

    impl = Numeric(24, 9)
    cache_ok = True

    def load_dialect_impl(self, dialect: Dialect) -> Any:
        if dialect.name == "sqlite":
            return dialect.type_descriptor(String(40))
        return dialect.type_descriptor(Numeric(24, 9))

    def process_bind_param(self, value: Decimal | None, dialect: Dialect) -> Any:
        if value is None:
            return None
        if not isinstance(value, Decimal):
            raise TypeError(f"money and seconds must be Decimal, got {type(value).__name__}")
        return str(value) if dialect.name == "sqlite" else value

    def process_result_value(self, value: Any, dialect: Dialect) -> Decimal | None:
        return None if value is None else Decimal(str(value))


# The escape of a surrogate code point (U+D800-U+DFFF) in JSON text. Every non-BMP character
# is written as a pair of them (json.dumps escapes non-ASCII), so most matches are fine pairs.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
_SURROGATE_ESCAPE_BYTES = re.compile(rb"\\u[dD][89a-fA-F]")


def load_json(raw: str | bytes) -> Any:
    """`json.loads` for JSON columns (the engine's `json_deserializer`). A lone surrogate
    (`"\\ud800"`) is valid JSON but not text: no UTF-8 writer can encode it, so one stored
    before the API refused it (a job's input, a deployment's stop sequences) would make every
    answer that holds it fail. Each is read as U+FFFD, the replacement character."""
    value = json.loads(raw)
    pattern = _SURROGATE_ESCAPE_BYTES if isinstance(raw, bytes) else _SURROGATE_ESCAPE
    return _repaired(value) if pattern.search(raw) else value  # type: ignore[arg-type]


def _repaired(value: Any) -> Any:
    if isinstance(value, str):
        try:
            value.encode()
        except UnicodeEncodeError:
            # through UTF-16, where a pair joins into its character and a lone half is an error
            return value.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
        return value
    if isinstance(value, list):
        return [_repaired(v) for v in value]
    if isinstance(value, dict):
        return {_repaired(k): _repaired(v) for k, v in value.items()}
    return value
