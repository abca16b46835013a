"""Queue wait estimate for a pending job (pure)."""

from __future__ import annotations


def estimate_wait_s(
    position: int, mean_execution_s: float | None, capacity: int, boot_s: float | None
) -> float | None:
    """Seconds until a job at `position` (0 = next) should start.

    `capacity` is jobs served at once (live workers × concurrency); with none, the job also
    waits for a boot (`boot_s`, the deployment's last measured boot, if known).
    """
    if mean_execution_s is None:
        return None if capacity == 0 and boot_s is None else (boot_s or 0.0)
    waves = position // max(capacity, 1)
    wait = waves * mean_execution_s
    if capacity == 0:
        wait += boot_s or 0.0
    return round(wait, 3)
