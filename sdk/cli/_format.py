"""How the CLI writes sizes, money, times and API errors for a person (pure functions)."""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from typing import Any

# The platform bills in US dollars (docs/billing.md): every amount it answers is USD.
CURRENCY = "USD"

_UNITS = ("B", "KB", "MB", "GB", "TB")
_ISO_TIME = re.compile(
    r"(\d{4}-\d\d-\d\d)[T ](\d\d:\d\d:\d\d)(?:\.\d+)?(Z|[+-]\d\d:?\d\d)?", re.ASCII
)


def unit_for(size: float) -> tuple[str, float]:
    """The decimal unit a size reads best in, and its divisor: (unit, 10**(3k))."""
    scale = 1.0
    for unit in _UNITS[:-1]:
        if abs(size) < scale * 1000:
            return unit, scale
        scale *= 1000
    return _UNITS[-1], scale


def human_bytes(size: float, unit: tuple[str, float] | None = None) -> str:
    """`612 KB`, `1.16 GB`, `0 B`; `unit` (from `unit_for`) writes it in a given one.

    >>> human_bytes(612_345), human_bytes(1_160_000_000), human_bytes(999)
    ('612 KB', '1.16 GB', '999 B')
    """
    name, scale = unit or unit_for(size)
    value = size / scale
    if name == "B":
        return f"{int(value)} B"
    # three significant digits: 1.16 GB, 12.3 MB, 612 KB
    digits = 2 if abs(value) < 10 else 1 if abs(value) < 100 else 0
    return f"{value:.{digits}f} {name}"


def bytes_progress(done: float, total: float) -> str:
    """`0.31/0.61 MB`: both sizes in the unit of the total.

    >>> bytes_progress(305_000, 612_000), bytes_progress(580_000_000, 1_160_000_000)
    ('305/612 KB', '0.58/1.16 GB')
    """
    unit = unit_for(total)
    total_text = human_bytes(total, unit)
    number = total_text.split(" ", 1)[0]
    digits = len(number) - number.index(".") - 1 if "." in number else 0
    return f"{done / unit[1]:.{digits}f}/{total_text}"


def money(amount: Any) -> str:
    """An amount the platform answered (a decimal string) with its currency: `0.0125 USD`."""
    if amount is None or amount == "":
        return "-"
    try:
        value = Decimal(str(amount))
    except InvalidOperation:
        return str(amount)
    return f"{value} {CURRENCY}"


def short_time(value: str) -> str:
    """An ISO 8601 time as a table shows it: `2024-05-01 12:00:00` (others unchanged).

    >>> short_time("2024-05-01T12:00:00.123456+00:00"), short_time("demo")
    ('2024-05-01 12:00:00', 'demo')
    """
    match = _ISO_TIME.fullmatch(value)
    if not match:
        return value
    date, clock, zone = match.groups()
    suffix = "" if zone in (None, "Z", "+00:00", "+0000", "-00:00") else f" {zone}"
    return f"{date} {clock}{suffix}"


def field_error(item: dict[str, Any]) -> str:
    """One field error of a problem: `line 3: input.max_tokens: must be >= 1`."""
    where = f"line {item['line']}: " if item.get("line") is not None else ""
    return f"{where}{item.get('field', '?')}: {item.get('message', '')}"


def problem_lines(status: int, title: str, detail: str, errors: list[dict[str, Any]]) -> list[str]:
    """An API error as lines for stderr: the headline, then one line per field error.

    Each problem is said once: the parts of `detail` that repeat a field error (a 422's
    detail lists them all, a batch's names the first) are left out of the headline.
    """
    head = f"{status} {title}"
    said = [f"{e.get('field', '?')}: {e.get('message', '')}" for e in errors]
    parts = [p.strip() for p in detail.split("; ")] if errors else [detail.strip()]
    kept = [p for p in parts if p and not any(s in p for s in said)]
    if kept:
        head += ": " + "; ".join(kept)
    return [head, *(f"  {field_error(e)}" for e in errors)]
