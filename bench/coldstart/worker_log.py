"""The worker's "loaded N tensors (...)" log line (worker/runtime/loading.py), parsed (pure):
it splits the `load` phase and names the tier the weights came from."""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field

TIER_NAMES = {"host": "host memory", "disk": "disk cache"}  # the loader's tier names
LOG_FIELDS = ("files_s", "header_s", "fetch_s", "gbps", "build_s")  # the load table's
_LOADED = re.compile(r"loaded (\d+) tensors \((\d+) bytes, (\d+) objects\) in ([\d.]+)s")


@dataclass(frozen=True, slots=True)
class LoadLog:
    """The worker's "loaded N tensors (...)" line; None where the line lacks a field."""

    tensors: int
    bytes_total: int
    objects: int
    seconds: float  # load_model() in all: files + weights + build
    files_s: float | None  # config.json, tokenizer.json, generation_config.json
    weights_s: float | None  # loader.load()
    gbps: float | None
    header_s: float | None
    fetch_s: float | None
    build_s: float | None  # the model object around the loaded tensors
    cache_hits: int | None  # objects read from a cache tier
    tier_hits: dict[str, int] = field(default_factory=dict)  # of those, per tier (host, disk)

    @property
    def hits(self) -> dict[str, int]:
        """Objects read per tier. A line without the per-tier split predates the host tier:
        its hits are the disk's."""
        if self.tier_hits or not self.cache_hits:
            return {t: n for t, n in self.tier_hits.items() if n}
        return {"disk": self.cache_hits}

    @property
    def tier(self) -> str:
        """Where the weights came from: "object storage", "disk cache", "host memory", or
        several joined by "+"."""
        if self.cache_hits is None:
            return "?"
        names = [TIER_NAMES.get(t, t) for t in sorted(self.hits)]
        if sum(self.hits.values()) < self.objects:
            names.append("object storage")
        return "+".join(names)

    @property
    def source(self) -> str:
        """The slowest place the weights came from: "origin" (object storage, or unknown),
        "disk" or "host" (what the worker's tier fill starts from)."""
        if self.cache_hits is None or sum(self.hits.values()) < self.objects:
            return "origin"
        return "disk" if "disk" in self.hits else "host"


def parse_load_log(text: str) -> LoadLog | None:
    """The last "loaded N tensors" line of a worker log; None when there is none."""
    lines = [line for line in text.splitlines() if _LOADED.search(line)]
    if not lines:
        return None
    line = lines[-1]
    m = _LOADED.search(line)
    assert m is not None

    def num(pattern: str) -> float | None:
        found = re.search(pattern, line)
        return float(found.group(1)) if found else None

    hits = num(r"(\d+) cache hits")
    per_tier = re.search(r"cache hits (\{[^}]*\})", line)
    tier_hits = ast.literal_eval(per_tier.group(1)) if per_tier else {}
    return LoadLog(
        tensors=int(m.group(1)),
        bytes_total=int(m.group(2)),
        objects=int(m.group(3)),
        seconds=float(m.group(4)),
        files_s=num(r"files ([\d.]+)s"),
        weights_s=num(r"weights ([\d.]+)s"),
        gbps=num(r"at ([\d.]+) GB/s"),
        header_s=num(r"header ([\d.]+)s"),
        fetch_s=num(r"fetch ([\d.]+)s"),
        build_s=num(r"build ([\d.]+)s"),
        cache_hits=None if hits is None else int(hits),
        tier_hits={str(k): int(v) for k, v in tier_hits.items()},
    )
