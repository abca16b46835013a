"""What the rounds add up to (pure): the phase table, the `load` split, the targets
and the summary JSON line. Every number is a median over rounds (a column's median is not the
difference of the total's)."""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from bench.coldstart.phases import PHASES
from bench.coldstart.scenarios import BOOTED, POOLED, Scenario
from bench.coldstart.worker_log import LOG_FIELDS, LoadLog

# The summary line's keys (the targets'), first and in this order; extra keys follow.
REQUIRED_KEYS = (
    "first_token_s",
    "first_token_s_warm_pool",
    "first_token_s_host_tier",
    "weight_stream_s",
)


@dataclass(frozen=True, slots=True)
class Round:
    """One timed cold request."""

    scenario: str  # Scenario.key
    model: str  # "demo" or "big"
    phases_s: dict[str, float]  # PHASES and total
    tier: str  # where the weights came from, by the worker's log
    load_log: LoadLog | None
    first_event: str  # "output", or the terminal event when no output event came
    engine_ttft_s: float | None  # the engine's own, from the job's output timings
    edge_read_s: float | None = None  # the API reading the model's files (before the clock)
    placement: str = "?"  # the deployment's scaling.placement.choice: pool_host_tier|pool|boot
    starting: tuple[str, ...] = ()  # the cold-start phases its `starting` events named


def median(values: Iterable[float | None]) -> float | None:
    xs = [v for v in values if v is not None]
    return statistics.median(xs) if xs else None


def fmt(x: float | None, digits: int = 2) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def _of(rounds: Iterable[Round], scenario: str, model: str) -> list[Round]:
    return [r for r in rounds if (r.scenario, r.model) == (scenario, model)]


def first_token_s(rounds: Iterable[Round], scenario: str, model: str) -> float | None:
    return median(r.phases_s["total"] for r in _of(rounds, scenario, model))


def placement(rounds: Iterable[Round], scenario: str, model: str) -> str | None:
    """The placement its rounds got (several joined by "/" when they differed)."""
    choices = sorted({r.placement for r in _of(rounds, scenario, model)})
    return "/".join(choices) or None


@dataclass(frozen=True, slots=True)
class Verdict:
    """A scenario's median first token against the bound (big model)."""

    scenario: Scenario
    first_token_s: float | None  # None: not run
    bound_s: float | None  # None: no weight_stream_s measured

    @property
    def met(self) -> bool | None:
        if self.first_token_s is None or self.bound_s is None:
            return None
        return self.first_token_s <= self.bound_s

    def cell(self) -> str:
        """The table's `target` cell: "≤ 2.80 met" / "≤ 2.80 missed"."""
        if self.bound_s is None:
            return "-"
        word = {True: "met", False: "missed", None: ""}[self.met]
        return f"≤ {self.bound_s:.2f} {word}".rstrip()


def verdicts(
    scenarios: Iterable[Scenario], rounds: list[Round], weight_stream_s: float | None, model: str
) -> dict[str, Verdict]:
    """Per scenario key, for the scenarios with a target."""
    return {
        s.key: Verdict(
            s,
            first_token_s(rounds, s.key, model),
            None if weight_stream_s is None else s.target.bound_s(weight_stream_s),
        )
        for s in scenarios
        if s.target is not None
    }


def pool_saving(rounds: list[Round], model: str) -> tuple[float | None, float | None]:
    """((a) − (b): the median first tokens' difference, (a)'s median boot phase): what the
    pool removed, next to the boot it should remove."""
    booted, pooled = first_token_s(rounds, BOOTED, model), first_token_s(rounds, POOLED, model)
    boot = median(r.phases_s["boot"] for r in _of(rounds, BOOTED, model))
    return (None if booted is None or pooled is None else booted - pooled), boot


def target_lines(
    scenarios: Iterable[Scenario], rounds: list[Round], weight_stream_s: float | None, model: str
) -> list[str]:
    """The targets, one line each, against this run's medians for `model`."""
    out = [f"targets ({model} model, weight_stream_s {fmt(weight_stream_s)} s):"]
    for v in verdicts(scenarios, rounds, weight_stream_s, model).values():
        assert v.scenario.target is not None
        head = f"- {v.scenario.label}: first token {fmt(v.first_token_s)} s, target "
        head += v.scenario.target.text
        if v.met is None or v.first_token_s is None or v.bound_s is None:
            out.append(head + ": not measured")
            continue
        gap = v.first_token_s - v.bound_s
        verdict = f"met ({-gap:.2f} s to spare)" if v.met else f"missed by {gap:.2f} s"
        out.append(f"{head} = {v.bound_s:.2f} s: {verdict}")
    saved, boot = pool_saving(rounds, model)
    out.append(
        f"- (a) − (b) = {fmt(saved)} s: the boot the pool removes ((a)'s boot phase: {fmt(boot)} s)"
    )
    return out


def table(
    scenarios: Iterable[Scenario],
    models: list[str],
    rounds: list[Round],
    na: Mapping[str, str],
    weight_stream_s: float | None,
    target_model: str = "big",
) -> list[str]:
    """The markdown table: scenario × model, medians; `na` gives a reason per scenario key;
    the target column (the bound and whether the median meets it) for `target_model`
    only: weight_stream_s is that model's."""
    out = [
        "| scenario | model | first token s | target s | accept | queue | boot | load | tier "
        "| warm | token | placement |",
        "|---|---|---:|---|---:|---:|---:|---:|---|---:|---:|---|",
    ]
    scenarios = list(scenarios)
    for model in models:
        judged = {}
        if model == target_model:
            judged = verdicts(scenarios, rounds, weight_stream_s, model)
        for s in scenarios:
            rs = _of(rounds, s.key, model)
            target = judged[s.key].cell() if s.key in judged else ""
            if not rs:
                reason = na.get(s.key, "n/a (not run)")
                out.append(f"| {s.label} | {model} | {reason} | {target} |" + " |" * 8)
                continue
            tiers = "/".join(sorted({r.tier for r in rs}))
            marks = "" if all(r.first_event == "output" for r in rs) else " *"
            cells = [fmt(median(r.phases_s[p] for r in rs)) for p in PHASES]
            total = fmt(first_token_s(rounds, s.key, model)) + marks
            out.append(
                f"| {s.label} | {model} | {total} | {target} | {' | '.join(cells[:4])} | {tiers} "
                f"| {' | '.join(cells[4:])} | {placement(rounds, s.key, model)} |"
            )
    return out


def load_table(
    scenarios: Iterable[Scenario], models: list[str], rounds: list[Round], alone: float | None
) -> list[str]:
    """The `load` column split by the worker's log line (medians); `engine`: the rest of
    `load` (the engine and its KV cache); `alone`: weight_stream_s (the big model's)."""
    out = [
        "| model | scenario | load | files | header | fetch | GB/s | build | engine | alone |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    scenarios = list(scenarios)
    for model in models:
        for s in scenarios:
            rs = _of(rounds, s.key, model)
            logs = [r.load_log for r in rs if r.load_log is not None]
            load = median(r.phases_s["load"] for r in rs)
            logged = median(x.seconds for x in logs)
            cells = [
                load,
                *(median(getattr(x, f) for x in logs) for f in LOG_FIELDS),
                None if load is None or logged is None else load - logged,
                alone if model == "big" else None,
            ]
            out.append(f"| {model} | {s.label} | " + " | ".join(map(fmt, cells)) + " |")
    return out


def summarize(
    scenarios: Iterable[Scenario],
    rounds: list[Round],
    weight_stream_s: list[float],
    headline_model: str,
    extra: Mapping[str, Any],
) -> dict[str, Any]:
    """The JSON line: each scenario's median first token for `headline_model` (null when not
    run), weight_stream_s, then per-phase medians of (a), (b), (c), the placements, the
    targets, the other models and `extra`."""

    def r3(x: float | None) -> float | None:
        return None if x is None else round(x, 3)

    scenarios = list(scenarios)
    model = headline_model
    out: dict[str, Any] = {"bench": "cold_start", "model": model}
    for s in scenarios:
        out[s.json_key] = r3(first_token_s(rounds, s.key, model))
    stream = median(weight_stream_s)
    out["weight_stream_s"] = r3(stream)
    for s in scenarios:
        rs = _of(rounds, s.key, model)
        if s.json_key in REQUIRED_KEYS and rs:
            key = "phases_s" + s.json_key.removeprefix("first_token_s")
            out[key] = {p: r3(median(r.phases_s[p] for r in rs)) for p in PHASES}
    out["placement"] = {
        s.json_key: placement(rounds, s.key, model) for s in scenarios if _of(rounds, s.key, model)
    }
    saved, boot = pool_saving(rounds, model)
    out["targets"] = {
        v.scenario.json_key: {"bound_s": r3(v.bound_s), "met": v.met}
        for v in verdicts(scenarios, rounds, stream, model).values()
    } | {"pool_saves_s": r3(saved), "boot_s": r3(boot)}
    for other in sorted({r.model for r in rounds} - {model}):
        out[other] = {s.json_key: r3(first_token_s(rounds, s.key, other)) for s in scenarios}
    out.update(extra)
    first = ("bench", *REQUIRED_KEYS)
    return {k: out.get(k) for k in first} | {k: v for k, v in out.items() if k not in first}
