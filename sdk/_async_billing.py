# Source of sdk/_billing.py: edit this file, then run `python tests/tools/unasync.py`.
"""`client.billing`: per-second billing records of workers, and their consistency check.

records = await client.billing.records(deployment="demo", limit=100)
print(sum(Decimal(r["amount"]) for r in records))
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sdk import _routes as routes
from sdk._async_resource import AsyncResource


class AsyncBilling(AsyncResource):
    """`client.billing`: per-second billing records of workers."""

    async def records(
        self,
        deployment: str | None = None,
        worker_id: str | None = None,
        phase: str | None = None,
        limit: int | None = None,
        since: datetime | str | None = None,
        until: datetime | str | None = None,
    ) -> list[dict[str, Any]]:
        """BillingRecords; `seconds`, `rate_per_s` and `amount` are decimal strings."""
        call = routes.billing_records(deployment, worker_id, phase, since, until)
        return await self._list(call, limit)

    async def check(self) -> dict[str, Any]:
        """Drift between billing records, workers and jobs: `{"ok": bool, "issues": [...]}`."""
        result: dict[str, Any] = await self._json(routes.billing_check())
        return result
