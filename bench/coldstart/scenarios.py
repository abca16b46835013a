"""The ways a request meets zero workers of its deployment (the table's rows), as data.

Each scenario names what holds the weights and whether a warm-pool worker waits; the round
driver (rounds.prepare) makes it so before the timed request. Order matters: a round's tier
fill (the worker writes the tiers its load missed, after it is ready; the bench waits for it)
is what the next scenario's tier hit reads, so each scenario empties the tiers faster than the
one it measures:

    platform without a pool (PLATFORM_WARM_POOL_MAX=0)      with one (=1)
    (a) object storage   empty host, disk                   (b) object storage  empty host, disk
    (a) disk-cache hit   empty host      (disk from (a))    (c) host-memory hit empty disk
    (a) host-memory hit  nothing emptied (host from disk)                       (host from (b))
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

HOST_CACHE_BYTES = 4 << 30  # room for both models


@dataclass(frozen=True, slots=True)
class Target:
    """The bound on a scenario's first token for the big model:
    first token ≤ factor × weight_stream_s + slack_s."""

    factor: float  # of weight_stream_s (the loader alone streaming the same checkpoint)
    slack_s: float  # seconds on top
    text: str  # the bound as the target states it

    def bound_s(self, weight_stream_s: float) -> float:
        return self.factor * weight_stream_s + self.slack_s


@dataclass(frozen=True, slots=True)
class Scenario:
    """One way a request meets zero workers of its deployment (a row of the table)."""

    key: str  # short name, used in deployment names
    label: str  # the table's row label
    json_key: str  # the summary key of the big model's median first token
    # True: the platform keeps a warm pool and an idle pool worker waits for the request;
    # False: the platform has none (set explicitly: `platform up` keeps one by default)
    pool: bool
    empty: tuple[str, ...] = ()  # cache tiers emptied before the request
    needs_tier: str | None = None  # the tier that must hold the model (n/a when it is off)
    target: Target | None = None  # the bound, for the big model

    @property
    def platform_env(self) -> dict[str, str]:
        """Settings it needs at `platform up` (scenarios that differ run on separate ups)."""
        return {"PLATFORM_WARM_POOL_MAX": "1" if self.pool else "0"}


SCENARIOS = (
    Scenario("no_pool", "(a) no pool", "first_token_s", False, empty=("host", "disk")),
    Scenario(
        "no_pool_disk",
        "(a) no pool, disk-cache hit",
        "first_token_s_disk_tier",
        False,
        empty=("host",),
        needs_tier="disk",
    ),
    Scenario(
        "no_pool_host",
        "(a) no pool, host-memory hit",
        "first_token_s_host_tier_no_pool",
        False,
        needs_tier="host",
    ),
    Scenario(
        "warm_pool",
        "(b) warm pool, object storage",
        "first_token_s_warm_pool",
        True,
        empty=("host", "disk"),
        target=Target(1.0, 0.5, "≤ weight_stream_s + 0.5 s"),
    ),
    Scenario(
        "host_tier",
        "(c) warm pool, host-memory hit",
        "first_token_s_host_tier",
        True,
        empty=("disk",),
        needs_tier="host",
        target=Target(0.5, 0.0, "≤ 0.5 × weight_stream_s"),
    ),
)
# (a) − (b): the boot the pool removes, compared with (a)'s boot phase
BOOTED, POOLED = "no_pool", "warm_pool"


def by_platform(scenarios: list[Scenario]) -> list[list[Scenario]]:
    """The scenarios grouped by the platform settings they need, in their order: one
    `platform up` per group."""
    groups: dict[tuple[tuple[str, str], ...], list[Scenario]] = {}
    for s in scenarios:
        groups.setdefault(tuple(sorted(s.platform_env.items())), []).append(s)
    return list(groups.values())


def tier_env(cache_dirs: Mapping[str, Path]) -> dict[str, str]:
    """The workers' settings (passed through by the platform) that turn exactly these tiers
    on; the host tier is off explicitly, since `platform up` turns it on by default."""
    env = {"PLATFORM_LOADER_HOST_CACHE_BYTES": "0"}
    if "disk" in cache_dirs:
        env["PLATFORM_LOADER_CACHE_DIR"] = str(cache_dirs["disk"])
    if "host" in cache_dirs:
        env["PLATFORM_LOADER_HOST_CACHE_DIR"] = str(cache_dirs["host"])
        env["PLATFORM_LOADER_HOST_CACHE_BYTES"] = str(HOST_CACHE_BYTES)
    return env
